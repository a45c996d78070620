"""The durable renter-side reputation and quarantine of every machine we rented.

One row per (provider, machine id). The arithmetic is `app.policy.reputation` (pure); this module
loads a `MachineRecord`, applies a pure update and writes it back inside one write transaction,
so two workers recording on the same machine never lose an update. Failure evidence is kept here
(the pure record keeps reason and time). Lifting a quarantine is the operator's decision and is
written to the ledger.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, select
from sqlmodel import Field, SQLModel

from app.db import read_connection, write_transaction
from app.errors import UserError
from app.ledger import Event, Ledger
from app.policy.reputation import (
    DEFAULT_QUARANTINE_S,
    MachineRecord,
    delivery_probability,
    is_quarantined,
    lift_quarantine,
    record_boot,
    record_create,
    record_failure,
    record_preflight_passed,
    record_slice_finished,
)

__all__ = ["HostView", "MachineReputation", "ReputationStore"]


class MachineReputation(SQLModel, table=True):
    __tablename__ = "machine_reputation"

    provider: str = Field(primary_key=True)
    machine_id: str = Field(primary_key=True)
    creates: int = 0
    booted: int = 0
    preflight_passed: int = 0
    slices_finished: int = 0
    failures_json: str = "[]"  # [{"reason", "at", "evidence"}], oldest first
    quarantined_until: float | None = None
    quarantine_permanent: bool = False
    quarantine_reason: str | None = None
    last_seen_at: float | None = None


_T = MachineReputation.__table__  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class HostView:
    """One machine as `tuneharness hosts` shows it."""

    record: MachineRecord
    evidence: tuple[str, ...]  # one per failure, same order as record.failures

    def to_dict(self, *, now: float) -> dict[str, object]:
        r = self.record
        last = r.failures[-1][0] if r.failures else None
        if r.quarantine_permanent:
            quarantine: str | None = "permanent"
        elif is_quarantined(r, now=now):
            quarantine = "until " + time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(r.quarantined_until or 0))
        else:
            quarantine = None
        return {
            "provider": r.provider,
            "machine_id": r.machine_id,
            "creates": r.creates,
            "booted": r.booted,
            "preflight_passed": r.preflight_passed,
            "slices_finished": r.slices_finished,
            "failures": [
                {"reason": reason, "at": at, "evidence": ev}
                for (reason, at), ev in zip(r.failures, self.evidence, strict=True)
            ],
            "last_failure": last,
            "delivery_probability": round(
                delivery_probability(platform_reliability=None, delivered=r.delivered, failed=r.failure_count), 4
            ),
            "quarantined": is_quarantined(r, now=now),
            "quarantine": quarantine,
            "quarantine_reason": r.quarantine_reason if is_quarantined(r, now=now) else None,
            "last_seen_at": r.last_seen_at,
        }


def _to_view(row: object) -> HostView:
    failures = json.loads(row.failures_json or "[]")  # type: ignore[attr-defined]
    rec = MachineRecord(
        machine_id=row.machine_id,  # type: ignore[attr-defined]
        provider=row.provider,  # type: ignore[attr-defined]
        creates=row.creates,  # type: ignore[attr-defined]
        booted=row.booted,  # type: ignore[attr-defined]
        preflight_passed=row.preflight_passed,  # type: ignore[attr-defined]
        slices_finished=row.slices_finished,  # type: ignore[attr-defined]
        failures=tuple((str(f["reason"]), float(f["at"])) for f in failures),
        quarantined_until=row.quarantined_until,  # type: ignore[attr-defined]
        quarantine_permanent=bool(row.quarantine_permanent),  # type: ignore[attr-defined]
        quarantine_reason=row.quarantine_reason,  # type: ignore[attr-defined]
        last_seen_at=row.last_seen_at,  # type: ignore[attr-defined]
    )
    return HostView(rec, tuple(str(f.get("evidence", "")) for f in failures))


class ReputationStore:
    """Machine records in the project's database (SQLite or PostgreSQL)."""

    def __init__(self, engine: Engine, *, quarantine_s: float = DEFAULT_QUARANTINE_S) -> None:
        self._engine = engine
        self._quarantine_s = quarantine_s

    # -- reading ---------------------------------------------------------------------------
    def get(self, provider: str, machine_id: str) -> HostView | None:
        with read_connection(self._engine) as conn:
            row = conn.execute(select(_T).where(_T.c.provider == provider, _T.c.machine_id == machine_id)).first()
        return None if row is None else _to_view(row)

    def hosts(self) -> list[HostView]:
        with read_connection(self._engine) as conn:
            rows = conn.execute(select(_T).order_by(_T.c.provider, _T.c.machine_id)).all()
        return [_to_view(r) for r in rows]

    def records(self, provider: str | None = None) -> dict[str, MachineRecord]:
        """Records keyed by machine id, as the ranking wants them (one provider, or all)."""
        return {
            v.record.machine_id: v.record for v in self.hosts() if provider is None or v.record.provider == provider
        }

    # -- writing ---------------------------------------------------------------------------
    def update(
        self,
        provider: str,
        machine_id: str,
        change: Callable[[MachineRecord], MachineRecord],
        *,
        evidence: str | None = None,
        conn: Connection | None = None,
    ) -> MachineRecord:
        """Apply a pure update to one machine's record atomically; `evidence` joins a new failure."""
        if conn is not None:
            return self._update(conn, provider, machine_id, change, evidence)
        with write_transaction(self._engine, lock=f"tuneharness.reputation.{provider}:{machine_id}") as c:
            return self._update(c, provider, machine_id, change, evidence)

    def _update(
        self,
        conn: Connection,
        provider: str,
        machine_id: str,
        change: Callable[[MachineRecord], MachineRecord],
        evidence: str | None,
    ) -> MachineRecord:
        where = (_T.c.provider == provider, _T.c.machine_id == machine_id)
        row = conn.execute(select(_T).where(*where)).first()
        view = _to_view(row) if row is not None else HostView(MachineRecord(machine_id, provider), ())
        new = change(view.record)
        evs = list(view.evidence)
        evs += [evidence or ""] * (len(new.failures) - len(view.record.failures))
        values = {
            "creates": new.creates,
            "booted": new.booted,
            "preflight_passed": new.preflight_passed,
            "slices_finished": new.slices_finished,
            "failures_json": json.dumps(
                [{"reason": r, "at": at, "evidence": ev} for (r, at), ev in zip(new.failures, evs, strict=True)]
            ),
            "quarantined_until": new.quarantined_until,
            "quarantine_permanent": new.quarantine_permanent,
            "quarantine_reason": new.quarantine_reason,
            "last_seen_at": new.last_seen_at,
        }
        if row is None:
            conn.execute(_T.insert().values(provider=provider, machine_id=machine_id, **values))
        else:
            conn.execute(_T.update().where(*where).values(**values))
        return new

    def record(
        self, provider: str, machine_id: str, event: str, *, now: float, reason: str | None = None, evidence: str = ""
    ) -> MachineRecord:
        """Record `event` (create, boot, preflight_passed, slice_finished, failure) for the machine."""
        changes: dict[str, Callable[[MachineRecord], MachineRecord]] = {
            "create": lambda r: record_create(r, now=now),
            "boot": lambda r: record_boot(r, now=now),
            "preflight_passed": lambda r: record_preflight_passed(r, now=now),
            "slice_finished": lambda r: record_slice_finished(r, now=now),
            "failure": lambda r: record_failure(r, reason=reason or "", now=now, quarantine_s=self._quarantine_s),
        }
        if event not in changes:
            raise ValueError(f"unknown reputation event {event!r}; known: {sorted(changes)}")
        return self.update(provider, machine_id, changes[event], evidence=evidence if event == "failure" else None)

    def unquarantine(
        self, machine_id: str, *, provider: str | None = None, ledger: Ledger | None = None
    ) -> MachineRecord:
        """The operator lifts a quarantine (history stays); recorded in the ledger when given one."""
        matches = [
            v.record
            for v in self.hosts()
            if v.record.machine_id == machine_id and (provider is None or v.record.provider == provider)
        ]
        if not matches:
            raise UserError(
                f"no machine {machine_id!r} in the reputation store. Fix: pick an id from `tuneharness hosts`"
            )
        if len(matches) > 1:
            names = ", ".join(sorted(r.provider for r in matches))
            raise UserError(f"machine {machine_id!r} is known at several providers ({names}). Fix: add --provider")
        rec = matches[0]
        with write_transaction(self._engine, lock=f"tuneharness.reputation.{rec.provider}:{machine_id}") as conn:
            new = self._update(conn, rec.provider, machine_id, lift_quarantine, None)
            if ledger is not None:
                ledger.append(
                    Event(
                        kind="host_unquarantined",
                        provider=rec.provider,
                        machine=machine_id,
                        reason="operator",
                        payload={"was": rec.quarantine_reason, "permanent": rec.quarantine_permanent},
                    ),
                    conn=conn,
                )
        return new
