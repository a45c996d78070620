"""Last success of each periodic task, so a frozen beat cannot silently stop the watchdogs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy import Engine, select
from sqlmodel import Field, SQLModel

from app.db import read_connection, write_transaction

__all__ = ["BUDGET_MONITOR_CLEAN", "Overdue", "PeriodicRun", "last_successes", "overdue", "record_success"]

# The budget monitor's last pass that reported no error (every stop it decided was made). A job's own
# poll skips its caps' guard only while such a pass covers it; a pass with a failed stop does not.
BUDGET_MONITOR_CLEAN = "budget-monitor-clean"


class PeriodicRun(SQLModel, table=True):
    __tablename__ = "periodic_runs"

    name: str = Field(primary_key=True)
    last_success_at: float


_T = PeriodicRun.__table__  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class Overdue:
    name: str
    interval_s: float
    age_s: float | None  # None: never ran


def record_success(engine: Engine, name: str, at: float) -> None:
    with write_transaction(engine, lock=f"tuneharness.periodic.{name}") as conn:
        if conn.execute(select(_T.c.name).where(_T.c.name == name)).first() is None:
            conn.execute(_T.insert().values(name=name, last_success_at=at))
        else:
            conn.execute(_T.update().where(_T.c.name == name).values(last_success_at=at))


def last_successes(engine: Engine) -> dict[str, float]:
    with read_connection(engine) as conn:
        return {r.name: r.last_success_at for r in conn.execute(select(_T))}


def overdue(
    last: Mapping[str, float], intervals_s: Mapping[str, float], *, now: float, factor: float = 3.0
) -> list[Overdue]:
    """Periodic tasks whose last success is older than `factor` intervals (or that never ran)."""
    out = []
    for name, interval in sorted(intervals_s.items()):
        at = last.get(name)
        if at is None:
            out.append(Overdue(name, interval, None))
        elif now - at > factor * interval:
            out.append(Overdue(name, interval, now - at))
    return out
