"""The Celery application. `celery -A workers.celery_app worker` loads this module.

Building the app reads settings (environment only); it connects to nothing until a worker,
beat or a client sends.
"""

from __future__ import annotations

from typing import Any

from celery import Celery, signals

from app import bootstrap
from app.errors import ConfigError
from app.settings import load_settings, sim_scale
from beat_schedule import BEAT_SCHEDULE, scaled
from workers.config import TASK_TIME_LIMITS_S, build_config, check_time_limits

# The environment first, then TUNEHARNESS_HOME/config.toml's profile and the vendors' key files.
bootstrap.configured()

app = Celery(
    "tuneharness",
    include=[
        "workers.tasks",
        "workers.guardrails",
        "workers.provisioning",
        "workers.supervisor",
        "workers.evaluate",
        "workers.research",
    ],
)
app.conf.update(build_config(load_settings()))

app.conf.beat_schedule = scaled(BEAT_SCHEDULE, sim_scale())


def _task_limits() -> dict[str, float]:
    out: dict[str, float] = {}
    for name, task in app.tasks.items():
        if not name.startswith("tuneharness."):
            continue
        for attr in ("time_limit", "soft_time_limit"):
            value = getattr(task, attr, None)
            if value:
                out[f"{name}.{attr}"] = float(value)
        queue = name.split(".")[1] if name.count(".") >= 2 else None
        if queue and queue not in TASK_TIME_LIMITS_S:
            raise RuntimeError(f"task {name} is not routed to a known queue")
    return out


def _refuse_bad_time_limits() -> None:
    # Celery logs and swallows an Exception raised by a signal receiver; SystemExit stops the
    # process, which is the point: a worker that would run tasks twice must not start.
    try:
        check_time_limits(app.conf, _task_limits())
    except ConfigError as exc:
        raise SystemExit(f"error: {exc}") from None


def _refuse_unshared_store() -> None:
    # Workers on several machines must share the artifact store (app/fleetstore.py). A database
    # that cannot be reached now is the tasks' to report; it does not stop the worker.
    from app.errors import ServiceUnavailable

    try:
        bootstrap.check_fleet_store(record=True)
    except ConfigError as exc:
        raise SystemExit(f"error: {exc}") from None
    except ServiceUnavailable:
        return
    if bootstrap.settings().is_postgres:
        # The pool's children are forked from this process: none may inherit its open connections.
        bootstrap.engine().dispose()


@signals.worker_init.connect
def _check_on_worker_start(**_: Any) -> None:
    _refuse_bad_time_limits()
    _refuse_unshared_store()


@signals.worker_ready.connect
def _watch_beat(**_: Any) -> None:
    # beat cannot report its own freeze: each worker watches the periodic tasks' last successes
    from workers.beatwatch import start_for_worker

    start_for_worker(app.conf.beat_schedule)


@signals.after_setup_logger.connect
@signals.after_setup_task_logger.connect
def _scrub_logs(logger: Any = None, **_: Any) -> None:
    # httpx logs full URLs at INFO: a webhook's URL is its secret (app/logscrub.py).
    from app.logscrub import configure_logging

    configure_logging()
    if logger is not None:
        configure_logging(logger)


_beat_lock: Any = None


@signals.beat_init.connect
def _check_on_beat_start(**_: Any) -> None:
    _refuse_bad_time_limits()
    import atexit

    from workers.beatlock import BeatLock

    global _beat_lock
    lock = BeatLock(str(app.conf.broker_url))
    holder = lock.acquire()
    if holder is not None:
        raise SystemExit(
            f"error: another beat ({holder}) already schedules on this broker; two would run every "
            "watchdog twice. Fix: run exactly one beat (it takes over within 60 s if that one dies)"
        )
    _beat_lock = lock
    atexit.register(lock.release)
