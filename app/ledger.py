"""The append-only, hash-chained ledger of every decision that costs money.

One table, `ledger_events`. Rows are only ever inserted: the database itself rejects UPDATE,
DELETE, TRUNCATE, INSERT OR REPLACE and upserts over an existing row (triggers installed by
`app.db.init_db`). Each row carries `prev_hash` and `row_hash = sha256(prev_hash + canonical
row)`, so `verify()` finds a row altered by anyone who dropped the triggers first.

A retried task passes the same `idempotency_key` and appends once.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Engine, select, text
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlmodel import Field, SQLModel

from app.db import advisory_key, is_postgres, money_check, read_connection, write_transaction
from app.errors import LedgerAppendOnly, UserError
from app.numbers import is_finite_number

__all__ = ["GENESIS_HASH", "Event", "Ledger", "LedgerEvent", "LedgerRow", "VerifyReport", "parse_anchor", "row_hash"]

GENESIS_HASH = "0" * 64
LEDGER_LOCK = "tuneharness.ledger"


class LedgerEvent(SQLModel, table=True):
    """One row of the ledger. Never updated, never deleted."""

    __tablename__ = "ledger_events"
    __table_args__ = (money_check("ledger_events", "amount_usd"), money_check("ledger_events", "rate_usd_per_hour"))

    seq: int = Field(primary_key=True, sa_column_kwargs={"autoincrement": False})
    at: str = Field(index=True)
    kind: str = Field(index=True)
    job: str | None = Field(default=None, index=True)
    instance: str | None = None
    provider: str | None = None
    machine: str | None = None
    rate_usd_per_hour: float | None = None
    amount_usd: float | None = None
    reason: str = ""
    payload: str = "{}"
    idempotency_key: str = Field(unique=True)
    prev_hash: str
    row_hash: str


@dataclass(frozen=True, slots=True)
class Event:
    """What a caller wants written; the ledger adds seq, time (unless given) and hashes."""

    kind: str
    job: str | None = None
    instance: str | None = None
    provider: str | None = None
    machine: str | None = None
    rate_usd_per_hour: float | None = None
    amount_usd: float | None = None
    reason: str = ""
    payload: Mapping[str, Any] = field(default_factory=dict)
    idempotency_key: str | None = None
    at: datetime | None = None


@dataclass(frozen=True, slots=True)
class LedgerRow:
    """A row as read back."""

    seq: int
    at: str
    kind: str
    job: str | None
    instance: str | None
    provider: str | None
    machine: str | None
    rate_usd_per_hour: float | None
    amount_usd: float | None
    reason: str
    payload: dict[str, Any]
    idempotency_key: str
    prev_hash: str
    row_hash: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "at": self.at,
            "kind": self.kind,
            "job": self.job,
            "instance": self.instance,
            "provider": self.provider,
            "machine": self.machine,
            "rate_usd_per_hour": self.rate_usd_per_hour,
            "amount_usd": self.amount_usd,
            "reason": self.reason,
            "payload": self.payload,
            "idempotency_key": self.idempotency_key,
            "prev_hash": self.prev_hash,
            "row_hash": self.row_hash,
        }


@dataclass(frozen=True, slots=True)
class VerifyReport:
    ok: bool
    rows: int
    first_bad_seq: int | None = None
    problem: str | None = None
    # The newest row's seq and hash: an anchor to write down elsewhere (`ledger verify` prints it as
    # `SEQ:HASH`) and check later with `verify(anchor=...)`, so that even a rewrite of the whole chain
    # by someone with the database's owner rights is found.
    head_seq: int | None = None
    head_hash: str | None = None

    @property
    def anchor(self) -> str | None:
        return None if self.head_seq is None else f"{self.head_seq}:{self.head_hash}"


def parse_anchor(text_: str) -> tuple[int, str]:
    """`SEQ:HASH` as `ledger verify` prints it; a UserError naming the fix otherwise."""
    seq, _, digest = text_.strip().partition(":")
    if not seq.isdigit() or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise UserError(
            f"anchor {text_!r} is not SEQ:HASH (a row number and 64 hex digits). "
            "Fix: pass the anchor exactly as `tuneharness ledger verify` printed it"
        )
    return int(seq), digest


def _iso(at: datetime) -> str:
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _canonical_payload(payload: Mapping[str, Any]) -> str:
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def row_hash(prev_hash: str, fields: Mapping[str, Any]) -> str:
    """sha256 over the previous hash and the row's canonical JSON (payload as stored text)."""
    body = json.dumps({k: fields[k] for k in _HASHED_FIELDS}, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256((prev_hash + body).encode("utf-8")).hexdigest()


_HASHED_FIELDS = (
    "seq",
    "at",
    "kind",
    "job",
    "instance",
    "provider",
    "machine",
    "rate_usd_per_hour",
    "amount_usd",
    "reason",
    "payload",
    "idempotency_key",
)

_TABLE = LedgerEvent.__table__  # type: ignore[attr-defined]


def _to_row(r: Any) -> LedgerRow:
    return LedgerRow(
        seq=r.seq,
        at=r.at,
        kind=r.kind,
        job=r.job,
        instance=r.instance,
        provider=r.provider,
        machine=r.machine,
        rate_usd_per_hour=r.rate_usd_per_hour,
        amount_usd=r.amount_usd,
        reason=r.reason,
        payload=json.loads(r.payload),
        idempotency_key=r.idempotency_key,
        prev_hash=r.prev_hash,
        row_hash=r.row_hash,
    )


class Ledger:
    """Append and read ledger events on one engine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def append(self, event: Event, *, conn: Connection | None = None) -> LedgerRow:
        """Append `event` (once per idempotency key) and return the stored row.

        With `conn`, the append joins that open write transaction (the caller holds its lock and
        commits); without, it runs in a transaction of its own.
        """
        if conn is not None:
            return self._append(conn, event)
        with write_transaction(self.engine, lock=LEDGER_LOCK) as own:
            return self._append(own, event)

    def _append(self, conn: Connection, event: Event) -> LedgerRow:
        if is_postgres(self.engine):
            # Re-entrant: a no-op when this transaction already holds the ledger lock.
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": advisory_key(LEDGER_LOCK)})
        for name, value in (("amount_usd", event.amount_usd), ("rate_usd_per_hour", event.rate_usd_per_hour)):
            # SQLite stores NaN as NULL (an amount that silently vanishes): refuse it here.
            if value is not None and not is_finite_number(value):
                raise ValueError(f"ledger event {event.kind}: {name} must be a finite number, got {value!r}")
        key = event.idempotency_key or f"auto:{uuid.uuid4()}"
        existing = conn.execute(select(_TABLE).where(_TABLE.c.idempotency_key == key)).first()
        if existing is not None:
            return _to_row(existing)
        last = conn.execute(select(_TABLE.c.seq, _TABLE.c.row_hash).order_by(_TABLE.c.seq.desc()).limit(1)).first()
        seq = 1 if last is None else last.seq + 1
        prev = GENESIS_HASH if last is None else last.row_hash
        fields: dict[str, Any] = {
            "seq": seq,
            "at": _iso(event.at or datetime.now(UTC)),
            "kind": event.kind,
            "job": event.job,
            "instance": event.instance,
            "provider": event.provider,
            "machine": event.machine,
            "rate_usd_per_hour": None if event.rate_usd_per_hour is None else float(event.rate_usd_per_hour),
            "amount_usd": None if event.amount_usd is None else float(event.amount_usd),
            "reason": event.reason,
            "payload": _canonical_payload(event.payload),
            "idempotency_key": key,
        }
        fields["prev_hash"] = prev
        fields["row_hash"] = row_hash(prev, fields)
        try:
            conn.execute(_TABLE.insert().values(**fields))
        except (IntegrityError, DBAPIError) as exc:
            if "append-only" in str(exc):
                raise LedgerAppendOnly(str(exc.orig)) from None
            raise
        return LedgerRow(**{**fields, "payload": json.loads(fields["payload"])})

    def rows(
        self,
        *,
        job: str | None = None,
        kind: str | Sequence[str] | None = None,
        since: datetime | None = None,
        limit: int | None = None,
    ) -> list[LedgerRow]:
        """Rows in seq order, optionally filtered."""
        q = select(_TABLE).order_by(_TABLE.c.seq)
        if job is not None:
            q = q.where(_TABLE.c.job == job)
        if kind is not None:
            kinds = [kind] if isinstance(kind, str) else list(kind)
            q = q.where(_TABLE.c.kind.in_(kinds))
        if since is not None:
            q = q.where(_TABLE.c.at >= _iso(since))
        if limit is not None:
            q = q.limit(limit)
        with read_connection(self.engine) as conn:
            return [_to_row(r) for r in conn.execute(q)]

    def verify(self, *, anchor: tuple[int, str] | None = None) -> VerifyReport:
        """Recompute the chain; report the first row whose hash or link does not match, and (given an
        `anchor` recorded earlier) whether the row at that seq still has that hash."""
        prev = GENESIS_HASH
        count = 0
        head_seq: int | None = None
        anchored = anchor is None
        with read_connection(self.engine) as conn:
            for r in conn.execute(select(_TABLE).order_by(_TABLE.c.seq)):
                count += 1
                head_seq = r.seq
                if anchor is not None and r.seq == anchor[0]:
                    if r.row_hash != anchor[1]:
                        return VerifyReport(
                            False, count, r.seq, "the row's hash differs from the anchor (history was rewritten)"
                        )
                    anchored = True
                fields = {k: getattr(r, k) for k in _HASHED_FIELDS}
                if r.prev_hash != prev:
                    return VerifyReport(
                        False,
                        count,
                        r.seq,
                        "prev_hash does not link to the row before it (a row was removed or reordered)",
                    )
                if row_hash(prev, fields) != r.row_hash:
                    return VerifyReport(False, count, r.seq, "row contents do not match row_hash (the row was altered)")
                prev = r.row_hash
        if not anchored:
            assert anchor is not None
            return VerifyReport(
                False, count, anchor[0], "the anchored row is missing (history was truncated or rewritten)"
            )
        return VerifyReport(True, count, head_seq=head_seq, head_hash=prev if head_seq is not None else None)
