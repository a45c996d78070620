"""Celery tasks: thin, idempotent shells. They take ids, call handlers, record ledger events.

Task names follow `tuneharness.<queue>.<verb>`; the prefix routes them to their queue.
"""

from __future__ import annotations

import time
from typing import Any

from app import bootstrap
from app.ledger import Event
from app.liveness import record_success
from workers.celery_app import app
from workers.config import TASK_TIME_LIMITS_S


def task(queue: str, verb: str, **options: Any) -> Any:
    """Declare a task on `queue` with that queue's soft and hard time limits."""
    soft, hard = TASK_TIME_LIMITS_S[queue]
    return app.task(
        name=f"tuneharness.{queue}.{verb}", bind=True, soft_time_limit=soft, time_limit=hard, **options
    )


@task("maintenance", "heartbeat")
def heartbeat(self: Any) -> float:
    """Record that beat and a worker are alive (doctor flags a stale heartbeat)."""
    now = time.time()
    record_success(bootstrap.engine(), "beat-heartbeat", now)
    return now


@task("maintenance", "ping")
def ping(self: Any, payload: str = "pong") -> str:
    """Round trip through the broker; used by doctor and the benchmarks."""
    return payload


@task("provision", "accept_job")
def accept_job(self: Any, job_id: str) -> str:
    """A job arrives on the provision queue: record it once, hand it to evaluation."""
    bootstrap.ledger().append(
        Event(kind="job_accepted", job=job_id, reason="enqueued by a client",
              payload={"worker": self.request.hostname or ""}, idempotency_key=f"{job_id}:accepted")
    )
    finish_job.delay(job_id)
    return job_id


@task("evaluate", "finish_job")
def finish_job(self: Any, job_id: str) -> str:
    """The job leaves through the evaluate queue: record its end once."""
    bootstrap.ledger().append(
        Event(kind="job_finished", job=job_id, reason="travelled provision -> evaluate",
              payload={"worker": self.request.hostname or ""}, idempotency_key=f"{job_id}:finished")
    )
    return job_id
