"""How often one task message was delivered without finishing: a task that kills its worker (the OOM
killer, a segfault in a native library) is redelivered forever, because the broker puts back a
message whose worker died (`task_reject_on_worker_lost`).

Each delivery of a guarded task (`workers.tasks.task`) is counted in `task_deliveries` under the
task's id and retry number before the task's body runs, and forgotten when the body returns or
raises. A row that survives means a worker died inside the body; after `MAX_DELIVERIES` such deaths
the next delivery is refused (`admit` returns False) and the caller fails the job instead of running
the body again. A retry (`self.retry`) is a new message with a new retry number: it is not counted
against the one before it.
"""

from __future__ import annotations

from sqlalchemy import Engine, delete, select
from sqlmodel import Field, SQLModel

from app.db import write_transaction

__all__ = ["MAX_DELIVERIES", "TaskDelivery", "admit", "forget"]

MAX_DELIVERIES = 5


class TaskDelivery(SQLModel, table=True):
    __tablename__ = "task_deliveries"

    key: str = Field(primary_key=True)  # "<task id>:<retry number>"
    task: str
    count: int
    first_at: float


_T = TaskDelivery.__table__  # type: ignore[attr-defined]


def admit(engine: Engine, key: str, *, task: str, now: float, limit: int = MAX_DELIVERIES) -> tuple[bool, int]:
    """Count this delivery; (False, n) when `limit` deliveries already died inside the body."""
    with write_transaction(engine, lock=f"tuneharness.delivery.{key}") as conn:
        count = conn.execute(select(_T.c.count).where(_T.c.key == key)).scalar()
        if count is None:
            conn.execute(_T.insert().values(key=key, task=task, count=1, first_at=now))
            return True, 1
        if int(count) >= limit:
            return False, int(count)
        conn.execute(_T.update().where(_T.c.key == key).values(count=int(count) + 1))
        return True, int(count) + 1


def forget(engine: Engine, key: str) -> None:
    """The body finished (returned or raised): this message is no longer a suspect."""
    with write_transaction(engine, lock=f"tuneharness.delivery.{key}") as conn:
        conn.execute(delete(_T).where(_T.c.key == key))
