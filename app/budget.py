"""Budgets and atomic reservations: reserve before spend.

Every create goes through `reserve()`. The check and the insert happen in one transaction that
holds the budget's lock (SQLite: `BEGIN IMMEDIATE`; PostgreSQL: `SELECT ... FOR UPDATE` on the
budget's row), so N concurrent reservations against a cap that fits k succeed exactly k times.
Each reservation, release and settlement is also a ledger event in the same transaction.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, func, select, text
from sqlmodel import Field, SQLModel

from app.db import advisory_key, is_postgres, money_check, read_connection, write_transaction
from app.errors import BudgetExceeded, UserError
from app.ledger import Event, Ledger
from app.numbers import MAX_USD, finite, is_finite_number

__all__ = ["IN_CHUNK", "Budget", "BudgetCap", "BudgetStatus", "Reservation", "ReservationRow", "in_chunks"]

# Amounts are dollars; a tolerance below a hundredth of a cent absorbs float rounding.
_EPSILON_USD = 1e-9
HELD, SETTLED, RELEASED = "held", "settled", "released"


PERIODS = ("total", "day", "week", "month")
UNITS = ("usd", "gpu_minutes")
# Conventional names: a cap with one of these names counts only its current period.
PERIOD_OF_NAME = {"day": "day", "week": "week", "month": "month", "gpu-minutes-day": "day"}


def period_start(period: str, now: float) -> float:
    """Start of the UTC day, ISO week (Monday) or month containing `now`; 0 for 'total'."""
    if period == "total":
        return 0.0
    t = datetime.fromtimestamp(now, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "week":
        t -= timedelta(days=t.weekday())
    elif period == "month":
        t = t.replace(day=1)
    return t.timestamp()


class BudgetCap(SQLModel, table=True):
    __tablename__ = "budget_caps"
    __table_args__ = (money_check("budget_caps", "cap_usd"),)

    name: str = Field(primary_key=True)
    cap_usd: float  # the cap, in `unit` (dollars unless unit is gpu_minutes)
    unit: str = "usd"
    period: str = "total"
    updated_at: str


class ReservationRow(SQLModel, table=True):
    __tablename__ = "budget_reservations"
    __table_args__ = (money_check("budget_reservations", "amount_usd"),)

    id: str = Field(primary_key=True)
    budget: str = Field(index=True)
    job: str | None = Field(default=None, index=True)
    amount_usd: float
    state: str = Field(index=True)
    idempotency_key: str = Field(unique=True)
    created_at: str
    created_ts: float = 0.0


@dataclass(frozen=True, slots=True)
class Reservation:
    id: str
    budget: str
    job: str | None
    amount_usd: float
    state: str


@dataclass(frozen=True, slots=True)
class BudgetStatus:
    name: str
    cap_usd: float
    reserved_usd: float
    spent_usd: float
    unit: str = "usd"
    period: str = "total"

    @property
    def left_usd(self) -> float:
        return self.cap_usd - self.reserved_usd - self.spent_usd


_CAPS = BudgetCap.__table__  # type: ignore[attr-defined]
_RES = ReservationRow.__table__  # type: ignore[attr-defined]


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _check_settled(actual_usd: float) -> None:
    """What was spent is a finite, non-negative amount: NaN would hide the spend from every cap."""
    if not (is_finite_number(actual_usd) and 0 <= actual_usd <= MAX_USD):
        raise ValueError(f"a settled amount must be a finite amount from 0 to {MAX_USD:g}, got {actual_usd!r}")


def _lock_name(budget: str) -> str:
    return f"tuneharness.budget.{budget}"


class Budget:
    """Caps and reservations on one engine; every change is a ledger event."""

    def __init__(self, engine: Engine, ledger: Ledger | None = None) -> None:
        self.engine = engine
        self.ledger = ledger or Ledger(engine)

    def set_cap(
        self, name: str, cap_usd: float, *, reason: str = "operator", unit: str | None = None, period: str | None = None
    ) -> None:
        """Create or change a cap: an explicit edit, recorded in the ledger.

        `day`, `week` and `month` count only their current UTC period; `gpu-minutes-day` counts
        GPU minutes per day. Any other name is a total cap (e.g. one per job).
        """
        unit = unit or ("gpu_minutes" if name.startswith("gpu-minutes") else "usd")
        cap_usd = finite(cap_usd, f"budget {name}: the cap", minimum=0, maximum=MAX_USD)
        period = period or PERIOD_OF_NAME.get(name, "total")
        if unit not in UNITS or period not in PERIODS:
            raise UserError(f"budget {name}: unit must be one of {UNITS} and period one of {PERIODS}")
        with write_transaction(self.engine, lock=_lock_name(name)) as conn:
            row = conn.execute(select(_CAPS).where(_CAPS.c.name == name)).first()
            values = {"cap_usd": cap_usd, "unit": unit, "period": period, "updated_at": _now()}
            if row is None:
                conn.execute(_CAPS.insert().values(name=name, **values))
            else:
                conn.execute(_CAPS.update().where(_CAPS.c.name == name).values(**values))
            self.ledger.append(
                Event(
                    kind="budget_cap_set",
                    amount_usd=cap_usd if unit == "usd" else None,
                    reason=reason,
                    payload={
                        "budget": name,
                        "cap": cap_usd,
                        "unit": unit,
                        "period": period,
                        "previous": None if row is None else row.cap_usd,
                    },
                ),
                conn=conn,
            )

    def caps(self) -> list[str]:
        with read_connection(self.engine) as conn:
            return [str(n) for n in conn.execute(select(_CAPS.c.name).order_by(_CAPS.c.name)).scalars()]

    def reserve(
        self,
        name: str,
        amount_usd: float,
        *,
        job: str | None = None,
        idempotency_key: str | None = None,
        now: float | None = None,
    ) -> Reservation:
        """Reserve `amount_usd` against `name`, or raise BudgetExceeded having reserved nothing."""
        return self.reserve_many([(name, amount_usd)], job=job, idempotency_key=idempotency_key, now=now)[0]

    def reserve_many(
        self,
        items: Sequence[tuple[str, float]],
        *,
        job: str | None = None,
        idempotency_key: str | None = None,
        now: float | None = None,
    ) -> list[Reservation]:
        """Reserve against several caps at once (e.g. the job's, the day's, GPU minutes): all or none.

        Each item is (cap name, amount in that cap's unit). Caps are locked in name order.
        """
        if not all(is_finite_number(amount) and 0 <= amount <= MAX_USD for _, amount in items):
            raise ValueError(f"a reservation must be a finite amount from 0 to {MAX_USD:g}, got {list(items)}")
        now_ts = datetime.now(UTC).timestamp() if now is None else now
        base_key = idempotency_key or f"reserve:{uuid.uuid4()}"
        names = sorted({n for n, _ in items})
        refusal: BudgetExceeded | None = None
        made: list[Reservation] = []
        try:
            made = self._reserve_locked(items, names, job=job, base_key=base_key, now_ts=now_ts)
        except BudgetExceeded as exc:  # the transaction rolled back: nothing was reserved
            refusal = exc
        if refusal is not None:
            self.ledger.append(
                Event(
                    kind="budget_refused",
                    job=job,
                    amount_usd=refusal.asked_usd,
                    reason=str(refusal),
                    payload={"budget": refusal.budget, "committed": refusal.committed_usd, "cap": refusal.cap_usd},
                )
            )
            raise refusal
        return made

    def _reserve_locked(
        self,
        items: Sequence[tuple[str, float]],
        names: list[str],
        *,
        job: str | None,
        base_key: str,
        now_ts: float,
    ) -> list[Reservation]:
        made: list[Reservation] = []
        with write_transaction(self.engine, lock=_lock_name(",".join(names))) as conn:
            caps = {}
            for n in names:
                q = select(_CAPS).where(_CAPS.c.name == n)
                if is_postgres(self.engine):
                    q = q.with_for_update()
                row = conn.execute(q).first()
                if row is None:
                    raise UserError(f"no budget named {n!r}. Fix: tuneharness budget set {n} --cap-usd N")
                caps[n] = row
            for n, amount in items:
                key = base_key if len(items) == 1 else f"{base_key}:{n}"
                done = conn.execute(select(_RES).where(_RES.c.idempotency_key == key)).first()
                if done is not None:
                    made.append(Reservation(done.id, done.budget, done.job, done.amount_usd, done.state))
                    continue
                cap = caps[n]
                committed = conn.execute(
                    select(func.coalesce(func.sum(_RES.c.amount_usd), 0.0)).where(
                        _RES.c.budget == n,
                        _RES.c.state.in_([HELD, SETTLED]),
                        _RES.c.created_ts >= period_start(cap.period, now_ts),
                    )
                ).scalar_one()
                if committed + amount > cap.cap_usd + _EPSILON_USD:
                    raise BudgetExceeded(n, float(cap.cap_usd), float(committed), amount)
                rid = f"res-{uuid.uuid4().hex[:12]}"
                conn.execute(
                    _RES.insert().values(
                        id=rid,
                        budget=n,
                        job=job,
                        amount_usd=amount,
                        state=HELD,
                        idempotency_key=key,
                        created_at=_now(),
                        created_ts=now_ts,
                    )
                )
                self.ledger.append(
                    Event(
                        kind="budget_reserved",
                        job=job,
                        amount_usd=amount if cap.unit == "usd" else None,
                        reason="reserve before spend",
                        payload={"budget": n, "reservation": rid, "amount": amount, "unit": cap.unit},
                        idempotency_key=key,
                    ),
                    conn=conn,
                )
                made.append(Reservation(rid, n, job, amount, HELD))
        return made

    def held(self, name: str) -> set[str]:
        """Ids of the reservations still held against `name` in its current period."""
        now_ts = datetime.now(UTC).timestamp()
        with read_connection(self.engine) as conn:
            period = conn.execute(select(_CAPS.c.period).where(_CAPS.c.name == name)).scalar() or "total"
            rows = conn.execute(
                select(_RES.c.id).where(
                    _RES.c.budget == name, _RES.c.state == HELD, _RES.c.created_ts >= period_start(str(period), now_ts)
                )
            )
            return {str(r) for r in rows.scalars()}

    def held_by(self, names: Collection[str] | None = None) -> dict[str, set[str]]:
        """`held` for every cap (or only `names`) at once: one read of the caps' periods, then
        `held_of`. A cap holding nothing maps to an empty set; an unknown name is left out."""
        with read_connection(self.engine) as conn:
            caps = self._caps(conn, names)
        return self.held_of([(str(c.name), str(c.period)) for c in caps])

    def held_of(self, caps: Sequence[tuple[str, str]] | Sequence[BudgetStatus]) -> dict[str, set[str]]:
        """`held` for these caps, given as (name, period) or as `status` read them: one query per
        distinct period (per `IN_CHUNK` caps), not one per cap."""
        pairs = [(c.name, c.period) if isinstance(c, BudgetStatus) else c for c in caps]
        now_ts = datetime.now(UTC).timestamp()
        out: dict[str, set[str]] = {name: set() for name, _ in pairs}
        with read_connection(self.engine) as conn:
            for period, group in _by_period(pairs):
                for chunk in in_chunks(group):
                    rows = conn.execute(
                        select(_RES.c.budget, _RES.c.id).where(
                            _RES.c.budget.in_(chunk),
                            _RES.c.state == HELD,
                            _RES.c.created_ts >= period_start(period, now_ts),
                        )
                    )
                    for r in rows:
                        out[str(r.budget)].add(str(r.id))
        return out

    def caps_of(self, reservation_ids: Collection[str]) -> set[str]:
        """The caps these reservations are held against (one query)."""
        if not reservation_ids:
            return set()
        with read_connection(self.engine) as conn:
            rows = conn.execute(select(_RES.c.budget).where(_RES.c.id.in_(list(reservation_ids))).distinct())
            return {str(r) for r in rows.scalars()}

    def held_usd(self, reservation_id: str) -> float | None:
        """What a reservation still holds (None when it is closed or unknown)."""
        with read_connection(self.engine) as conn:
            amount = conn.execute(
                select(_RES.c.amount_usd).where(_RES.c.id == reservation_id, _RES.c.state == HELD)
            ).scalar()
        return None if amount is None else float(amount)

    def unit_of_reservation(self, reservation_id: str) -> str:
        with read_connection(self.engine) as conn:
            unit = conn.execute(
                select(_CAPS.c.unit).join(_RES, _RES.c.budget == _CAPS.c.name).where(_RES.c.id == reservation_id)
            ).scalar()
        return str(unit or "usd")

    def release(self, reservation_id: str, *, reason: str) -> None:
        """Give back what a reservation held (e.g. the create never happened)."""
        self._close(reservation_id, RELEASED, None, reason)

    def settle(self, reservation_id: str, actual_usd: float, *, reason: str) -> None:
        """Replace the held amount by what was actually spent."""
        _check_settled(actual_usd)
        self._close(reservation_id, SETTLED, actual_usd, reason)

    def settle_in(self, conn: Connection, reservation_id: str, actual_usd: float, *, reason: str) -> None:
        """`settle` inside the caller's write transaction (e.g. a rental changing hands): both or neither."""
        _check_settled(actual_usd)
        row = conn.execute(select(_RES).where(_RES.c.id == reservation_id)).first()
        if row is None:
            raise UserError(f"no reservation {reservation_id!r}")
        if is_postgres(self.engine):
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": advisory_key(_lock_name(row.budget))})
        self._close_in(conn, row, SETTLED, actual_usd, reason)

    def _close(self, reservation_id: str, state: str, actual_usd: float | None, reason: str) -> None:
        with read_connection(self.engine) as conn:
            row = conn.execute(select(_RES).where(_RES.c.id == reservation_id)).first()
        if row is None:
            raise UserError(f"no reservation {reservation_id!r}")
        with write_transaction(self.engine, lock=_lock_name(row.budget)) as conn:
            self._close_in(conn, row, state, actual_usd, reason)

    def _close_in(self, conn: Connection, row: Any, state: str, actual_usd: float | None, reason: str) -> None:
        reservation_id = str(row.id)
        current = conn.execute(select(_RES.c.state).where(_RES.c.id == reservation_id)).scalar_one()
        if current != HELD:
            return  # already closed: idempotent
        values: dict[str, object] = {"state": state}
        if actual_usd is not None:
            values["amount_usd"] = actual_usd
        conn.execute(_RES.update().where(_RES.c.id == reservation_id).values(**values))
        self.ledger.append(
            Event(
                kind=f"budget_{state}",
                job=row.job,
                amount_usd=actual_usd if actual_usd is not None else row.amount_usd,
                reason=reason,
                payload={"budget": row.budget, "reservation": reservation_id},
                idempotency_key=f"{state}:{reservation_id}",
            ),
            conn=conn,
        )

    def status(self, names: Collection[str] | None = None) -> list[BudgetStatus]:
        """Each cap (or only `names`) with what is reserved and spent in its current period: one read
        of the caps, then one grouped query per distinct period (per `IN_CHUNK` caps), not one per cap."""
        with read_connection(self.engine) as conn:
            caps = self._caps(conn, names)
            now_ts = datetime.now(UTC).timestamp()
            sums: dict[tuple[str, str], float] = {}
            for period, group in _by_period([(str(c.name), str(c.period)) for c in caps]):
                for chunk in in_chunks(group):
                    rows = conn.execute(
                        select(_RES.c.budget, _RES.c.state, func.sum(_RES.c.amount_usd))
                        .where(_RES.c.budget.in_(chunk), _RES.c.created_ts >= period_start(period, now_ts))
                        .group_by(_RES.c.budget, _RES.c.state)
                    )
                    for budget, state, total in rows:
                        sums[(str(budget), str(state))] = float(total or 0.0)
            return [
                BudgetStatus(
                    c.name,
                    c.cap_usd,
                    sums.get((str(c.name), HELD), 0.0),
                    sums.get((str(c.name), SETTLED), 0.0),
                    c.unit,
                    c.period,
                )
                for c in caps
            ]

    @staticmethod
    def _caps(conn: Connection, names: Collection[str] | None) -> list[Any]:
        q = select(_CAPS).order_by(_CAPS.c.name)
        if names is None:
            return list(conn.execute(q).all())
        return [c for chunk in in_chunks(sorted(set(names))) for c in conn.execute(q.where(_CAPS.c.name.in_(chunk)))]


IN_CHUNK = 500  # names or ids per IN (...) list: far under SQLite's and PostgreSQL's parameter limits


def in_chunks(items: Sequence[str]) -> list[list[str]]:
    """`items` cut into lists of at most `IN_CHUNK`, one bulk query's IN (...) each."""
    return [list(items[i : i + IN_CHUNK]) for i in range(0, len(items), IN_CHUNK)]


def _by_period(caps: Sequence[tuple[str, str]]) -> list[tuple[str, list[str]]]:
    """The caps' names, from (name, period) pairs, grouped by their period (one period start each)."""
    groups: dict[str, list[str]] = {}
    for name, period in caps:
        groups.setdefault(period, []).append(name)
    return sorted(groups.items())
