"""A provisioning job's policy state between tasks: one versioned row per job (JSON of `JobState`).

A save names the version it loaded; a save against a version someone else moved writes nothing
(a redelivered task, a second step of the same job). Several jobs' states are written in one
transaction when an attempt moves between them (a hand-over), so a crash leaves it in exactly one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from sqlalchemy import Engine, select, text
from sqlmodel import Field, SQLModel

from app.db import advisory_key, is_postgres, read_connection, write_transaction
from app.policy import codec
from app.policy.provisioning import JobState

__all__ = ["ProvisioningStateRow", "StateStore"]


class ProvisioningStateRow(SQLModel, table=True):
    """The policy state of one job between tasks (JSON of `JobState`), versioned."""

    __tablename__ = "provisioning_state"

    job_id: str = Field(primary_key=True)
    state_json: str
    version: int = 0
    wake_at: float | None = None
    updated_at: float


_T = ProvisioningStateRow.__table__  # type: ignore[attr-defined]


class _Moved(Exception):
    """A job's state moved since the version a save expected: the whole save is rolled back."""


class StateStore:
    """Load and save jobs' policy states; `now` stamps `updated_at`."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def load(self, job_id: str) -> tuple[JobState, int] | None:
        with read_connection(self.engine) as conn:
            row = conn.execute(select(_T).where(_T.c.job_id == job_id)).first()
        if row is None:
            return None
        return codec.load_job(json.loads(row.state_json)), int(row.version)

    def all(self) -> dict[str, JobState]:
        with read_connection(self.engine) as conn:
            return {r.job_id: codec.load_job(json.loads(r.state_json)) for r in conn.execute(select(_T))}

    def wake_times(self) -> dict[str, float]:
        """Every job that is waiting for a wake-up, and when it is due (the provisioning clock)."""
        with read_connection(self.engine) as conn:
            rows = conn.execute(select(_T.c.job_id, _T.c.wake_at).where(_T.c.wake_at.is_not(None)))
            return {str(r.job_id): float(r.wake_at) for r in rows}

    def save(self, writes: Sequence[tuple[JobState, int, float | None]], *, now: float) -> bool:
        """Write several jobs' states in one transaction: all of them, or none if any moved since
        its `version` (0: the job must be new). A crash in the middle writes nothing."""
        first = writes[0][0].job_id
        try:
            with write_transaction(self.engine, lock=f"tuneharness.provisioning.{first}") as conn:
                if is_postgres(self.engine):
                    for job, _, _ in writes[1:]:  # the first job's lock is write_transaction's
                        conn.execute(
                            text("SELECT pg_advisory_xact_lock(:k)"),
                            {"k": advisory_key(f"tuneharness.provisioning.{job.job_id}")},
                        )
                for job, version, wake_at in writes:
                    row = conn.execute(select(_T.c.version).where(_T.c.job_id == job.job_id)).first()
                    values = {"state_json": json.dumps(codec.dump_job(job)), "wake_at": wake_at, "updated_at": now}
                    if row is None:
                        if version != 0:
                            raise _Moved
                        conn.execute(_T.insert().values(job_id=job.job_id, version=1, **values))
                    elif int(row.version) != version:
                        raise _Moved
                    else:
                        conn.execute(_T.update().where(_T.c.job_id == job.job_id).values(version=version + 1, **values))
        except _Moved:
            return False
        return True
