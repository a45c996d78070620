"""Celery tasks: thin, idempotent shells. They take ids, call handlers, record ledger events.

Task names follow `tuneharness.<queue>.<verb>`; the prefix routes them to their queue.
"""

from __future__ import annotations

import time
from typing import Any

from app import bootstrap
from app.liveness import record_success
from workers.celery_app import app
from workers.config import TASK_TIME_LIMITS_S


def task(queue: str, verb: str, **options: Any) -> Any:
    """Declare a task on `queue` with that queue's soft and hard time limits."""
    soft, hard = TASK_TIME_LIMITS_S[queue]
    return app.task(name=f"tuneharness.{queue}.{verb}", bind=True, soft_time_limit=soft, time_limit=hard, **options)


@task("maintenance", "heartbeat")
def heartbeat(self: Any) -> float:
    """Record that beat and a worker are alive; alert on any other periodic task gone quiet."""
    from app.alerts import Alert
    from app.liveness import last_successes, overdue
    from beat_schedule import BEAT_SCHEDULE

    now = time.time()
    engine = bootstrap.engine()
    record_success(engine, "beat-heartbeat", now)
    intervals = {n: float(str(e["schedule"])) for n, e in BEAT_SCHEDULE.items()}
    last = last_successes(engine)
    # Only tasks that ran at least once: a fresh fleet has not had time to run them all.
    late = [o for o in overdue(last, intervals, now=now) if o.age_s is not None]
    if late:
        names = ", ".join(f"{o.name} ({o.age_s:.0f}s ago)" for o in late)
        bootstrap.notifier().notify(
            Alert("beat_overdue", f"periodic tasks overdue: {names}", key=f"beat_overdue:{int(now // 3600)}")
        )
    return now


@task("maintenance", "flush_alerts")
def flush_alerts(self: Any) -> int:
    """Retry alerts the outbox still owes (a webhook that was down)."""
    sent = bootstrap.notifier(background=False).flush()
    record_success(bootstrap.engine(), "alert-outbox", time.time())
    return sent


@task("maintenance", "ping")
def ping(self: Any, payload: str = "pong") -> str:
    """Round trip through the broker; used by doctor and the benchmarks."""
    return payload
