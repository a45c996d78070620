"""Budgets and atomic reservations: reserve before spend.

Every create goes through `reserve()`. The check and the insert happen in one transaction that
holds the budget's lock (SQLite: `BEGIN IMMEDIATE`; PostgreSQL: `SELECT ... FOR UPDATE` on the
budget's row), so N concurrent reservations against a cap that fits k succeed exactly k times.
Each reservation, release and settlement is also a ledger event in the same transaction.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import Engine, func, select
from sqlmodel import Field, SQLModel

from app.db import is_postgres, read_connection, write_transaction
from app.errors import BudgetExceeded, UserError
from app.ledger import Event, Ledger

__all__ = ["Budget", "BudgetCap", "BudgetStatus", "Reservation", "ReservationRow"]

# Amounts are dollars; a tolerance below a hundredth of a cent absorbs float rounding.
_EPSILON_USD = 1e-9
HELD, SETTLED, RELEASED = "held", "settled", "released"


class BudgetCap(SQLModel, table=True):
    __tablename__ = "budget_caps"

    name: str = Field(primary_key=True)
    cap_usd: float
    updated_at: str


class ReservationRow(SQLModel, table=True):
    __tablename__ = "budget_reservations"

    id: str = Field(primary_key=True)
    budget: str = Field(index=True)
    job: str | None = Field(default=None, index=True)
    amount_usd: float
    state: str = Field(index=True)
    idempotency_key: str = Field(unique=True)
    created_at: str


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

    @property
    def left_usd(self) -> float:
        return self.cap_usd - self.reserved_usd - self.spent_usd


_CAPS = BudgetCap.__table__  # type: ignore[attr-defined]
_RES = ReservationRow.__table__  # type: ignore[attr-defined]


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _lock_name(budget: str) -> str:
    return f"tuneharness.budget.{budget}"


class Budget:
    """Caps and reservations on one engine; every change is a ledger event."""

    def __init__(self, engine: Engine, ledger: Ledger | None = None) -> None:
        self.engine = engine
        self.ledger = ledger or Ledger(engine)

    def set_cap(self, name: str, cap_usd: float, *, reason: str = "operator") -> None:
        """Create or change a cap: an explicit edit, recorded in the ledger."""
        if cap_usd < 0:
            raise UserError(f"budget cap must be >= 0, got {cap_usd}. Fix: pass --cap-usd with a non-negative amount")
        with write_transaction(self.engine, lock=_lock_name(name)) as conn:
            row = conn.execute(select(_CAPS).where(_CAPS.c.name == name)).first()
            if row is None:
                conn.execute(_CAPS.insert().values(name=name, cap_usd=cap_usd, updated_at=_now()))
            else:
                conn.execute(_CAPS.update().where(_CAPS.c.name == name).values(cap_usd=cap_usd, updated_at=_now()))
            self.ledger.append(
                Event(kind="budget_cap_set", amount_usd=cap_usd, reason=reason, payload={"budget": name}),
                conn=conn,
            )

    def reserve(
        self, name: str, amount_usd: float, *, job: str | None = None, idempotency_key: str | None = None
    ) -> Reservation:
        """Reserve `amount_usd` against `name`, or raise BudgetExceeded having reserved nothing."""
        if amount_usd < 0:
            raise ValueError("a reservation must be >= 0 dollars")
        key = idempotency_key or f"reserve:{uuid.uuid4()}"
        with write_transaction(self.engine, lock=_lock_name(name)) as conn:
            cap_q = select(_CAPS.c.cap_usd).where(_CAPS.c.name == name)
            if is_postgres(self.engine):
                cap_q = cap_q.with_for_update()
            cap = conn.execute(cap_q).scalar()
            if cap is None:
                raise UserError(f"no budget named {name!r}. Fix: tuneharness budget set {name} --cap-usd N")
            done = conn.execute(select(_RES).where(_RES.c.idempotency_key == key)).first()
            if done is not None:
                return Reservation(done.id, done.budget, done.job, done.amount_usd, done.state)
            committed = conn.execute(
                select(func.coalesce(func.sum(_RES.c.amount_usd), 0.0)).where(
                    _RES.c.budget == name, _RES.c.state.in_([HELD, SETTLED])
                )
            ).scalar_one()
            if committed + amount_usd > cap + _EPSILON_USD:
                refusal = BudgetExceeded(name, float(cap), float(committed), amount_usd)
            else:
                refusal = None
                rid = f"res-{uuid.uuid4().hex[:12]}"
                conn.execute(
                    _RES.insert().values(
                        id=rid, budget=name, job=job, amount_usd=amount_usd, state=HELD,
                        idempotency_key=key, created_at=_now(),
                    )
                )
                self.ledger.append(
                    Event(kind="budget_reserved", job=job, amount_usd=amount_usd, reason="reserve before spend",
                          payload={"budget": name, "reservation": rid}, idempotency_key=key),
                    conn=conn,
                )
        if refusal is not None:
            self.ledger.append(
                Event(kind="budget_refused", job=job, amount_usd=amount_usd, reason=str(refusal),
                      payload={"budget": name, "committed_usd": refusal.committed_usd, "cap_usd": refusal.cap_usd})
            )
            raise refusal
        return Reservation(rid, name, job, amount_usd, HELD)

    def release(self, reservation_id: str, *, reason: str) -> None:
        """Give back what a reservation held (e.g. the create never happened)."""
        self._close(reservation_id, RELEASED, None, reason)

    def settle(self, reservation_id: str, actual_usd: float, *, reason: str) -> None:
        """Replace the held amount by what was actually spent."""
        self._close(reservation_id, SETTLED, actual_usd, reason)

    def _close(self, reservation_id: str, state: str, actual_usd: float | None, reason: str) -> None:
        with read_connection(self.engine) as conn:
            row = conn.execute(select(_RES).where(_RES.c.id == reservation_id)).first()
        if row is None:
            raise UserError(f"no reservation {reservation_id!r}")
        with write_transaction(self.engine, lock=_lock_name(row.budget)) as conn:
            current = conn.execute(select(_RES.c.state).where(_RES.c.id == reservation_id)).scalar_one()
            if current != HELD:
                return  # already closed: idempotent
            values: dict[str, object] = {"state": state}
            if actual_usd is not None:
                values["amount_usd"] = actual_usd
            conn.execute(_RES.update().where(_RES.c.id == reservation_id).values(**values))
            self.ledger.append(
                Event(kind=f"budget_{state}", job=row.job, amount_usd=actual_usd if actual_usd is not None else row.amount_usd,
                      reason=reason, payload={"budget": row.budget, "reservation": reservation_id},
                      idempotency_key=f"{state}:{reservation_id}"),
                conn=conn,
            )

    def status(self) -> list[BudgetStatus]:
        with read_connection(self.engine) as conn:
            caps = conn.execute(select(_CAPS).order_by(_CAPS.c.name)).all()
            out = []
            for c in caps:
                sums: dict[str, float] = dict(
                    conn.execute(
                        select(_RES.c.state, func.sum(_RES.c.amount_usd)).where(_RES.c.budget == c.name).group_by(_RES.c.state)
                    ).all()
                )
                out.append(BudgetStatus(c.name, c.cap_usd, float(sums.get(HELD, 0.0)), float(sums.get(SETTLED, 0.0))))
            return out
