"""Celery tasks: thin, idempotent shells. They take ids, call handlers, record ledger events.

Task names follow `tuneharness.<queue>.<verb>`; the prefix routes them to their queue.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from app import bootstrap
from app.liveness import record_success
from workers.celery_app import app
from workers.config import TASK_TIME_LIMITS_S


def task(queue: str, verb: str, *, guard_deliveries: bool = True, **options: Any) -> Any:
    """Declare a task on `queue` with that queue's soft and hard time limits.

    Guarded (the default): each delivery is counted before the body runs (`app.deliveries`), so a
    message whose body kills its worker every time (out of memory) is refused after
    `MAX_DELIVERIES` deaths and its job failed, instead of being redelivered for ever.
    """
    soft, hard = TASK_TIME_LIMITS_S[queue]
    name = f"tuneharness.{queue}.{verb}"

    def register(fn: Callable[..., Any]) -> Any:
        if not guard_deliveries:
            return app.task(name=name, bind=True, soft_time_limit=soft, time_limit=hard, **options)(fn)

        @functools.wraps(fn)
        def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
            from app.deliveries import admit, forget

            engine = bootstrap.engine()
            key = f"{self.request.id}:{self.request.retries or 0}"
            ok, deaths = admit(engine, key, task=name, now=time.time())
            if not ok:
                forget(engine, key)
                return _poisoned(name, args, deaths)
            try:
                return fn(self, *args, **kwargs)
            except Exception as exc:
                return _reached_the_job(name, args, exc)
            finally:
                forget(engine, key)

        return app.task(name=name, bind=True, soft_time_limit=soft, time_limit=hard, **options)(guarded)

    return register


def _transient_errors() -> tuple[type[BaseException], ...]:
    """Errors that wait themselves out (a vendor, the broker or the database down a while, a time
    limit): the redrive sweep steps the job again, so they do not block it."""
    import kombu.exceptions
    import redis
    import sqlalchemy.exc
    from celery.exceptions import SoftTimeLimitExceeded

    from app.market import ProviderBusy
    from app.services.provisioning import StepBusy
    from app.ssh import SSHError

    return (
        ProviderBusy,
        StepBusy,
        SSHError,
        OSError,
        kombu.exceptions.OperationalError,
        redis.RedisError,
        sqlalchemy.exc.OperationalError,
        SoftTimeLimitExceeded,
    )


def _reached_the_job(name: str, args: tuple[Any, ...], exc: Exception) -> Any:
    """Nothing fails silently (`app.blocking`): an error met on a job's behalf (the task's first
    argument is a job in the job table) blocks the job or is written down on it. Celery's own
    control flow (retry, ignore, reject) and errors of tasks that are no job's pass through."""
    from celery.exceptions import Ignore, Reject, Retry

    from app.blocking import ErrorClass, block_job, classify, record_task_error

    if isinstance(exc, Retry | Ignore | Reject):
        raise exc
    job_id = args[0] if args and isinstance(args[0], str) else None
    try:
        job = bootstrap.jobs().get(job_id) if job_id is not None else None
    except Exception:  # the database itself is the error: nothing to write it on
        job = None
    if job is None or job_id is None:
        raise exc
    kind = classify(exc, transient=_transient_errors())
    if kind is ErrorClass.TRANSIENT:
        record_task_error(job_id, exc, task=name, ledger=bootstrap.ledger())
        raise exc
    block_job(job_id, exc, task=name, jobs=bootstrap.jobs(), ledger=bootstrap.ledger(), notifier=bootstrap.notifier())
    if kind is ErrorClass.INTERNAL:
        raise exc  # the worker's log keeps the traceback
    import logging

    from app.blocking import clean

    logging.getLogger("tuneharness.tasks").warning("%s: job %s blocked: %s", name, job_id, clean(str(exc)))
    return {"job": job_id, "phase": "blocked", "task": name}


def _poisoned(name: str, args: tuple[Any, ...], deaths: int) -> dict[str, Any]:
    """A message that killed its worker `deaths` times: fail its job (when its first argument is one),
    write it down, tell the operator; never run it again."""
    from app.alerts import Alert
    from app.ledger import Event

    job_id = args[0] if args and isinstance(args[0], str) else None
    jobs = bootstrap.jobs()
    job = jobs.get(job_id) if job_id is not None else None
    why = (
        f"{name} died with its worker on {deaths} deliveries in a row (out of memory?): not run again. "
        "Fix: look at the worker's log and memory, then resubmit the job"
    )
    if job is not None and job_id is not None and job.phase not in ("done", "failed", "cancelled"):
        jobs.set_phase(job_id, "failed", detail=why)
        jobs.run_failed(job_id, detail=why)
    bootstrap.ledger().append(
        Event(kind="task_poisoned", job=job_id if job is not None else None, reason=why, payload={"task": name})
    )
    bootstrap.notifier().notify(Alert("task_poisoned", why, job=job_id if job is not None else None))
    return {"task": name, "poisoned": True, "deaths": deaths, "job": job_id}


@task("maintenance", "heartbeat", guard_deliveries=False)
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


@task("maintenance", "ping", guard_deliveries=False)
def ping(self: Any, payload: str = "pong") -> str:
    """Round trip through the broker; used by doctor and the benchmarks."""
    return payload
