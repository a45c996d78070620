"""Celery configuration as data, and the start-up check that keeps it honest.

Redis redelivers a message that is not acknowledged within the visibility timeout. With
`task_acks_late`, a task still running (or a countdown still waiting) past it would run twice,
so the timeout is set in all three places Celery reads it, and start-up refuses a configuration
where any task's hard time limit or any countdown we use reaches it.
"""

from __future__ import annotations

from typing import Any

from app.errors import ConfigError
from app.settings import Settings

__all__ = [
    "MAX_COUNTDOWN_S",
    "QUEUES",
    "TASK_ROUTES",
    "TASK_TIME_LIMITS_S",
    "VISIBILITY_TIMEOUT_S",
    "build_config",
    "check_time_limits",
]

QUEUES = ("provision", "ssh", "monitor", "evaluate", "maintenance")

# Task name prefix -> queue. Tasks are named "tuneharness.<queue-area>.<verb>".
TASK_ROUTES: dict[str, dict[str, str]] = {f"tuneharness.{q}.*": {"queue": q} for q in QUEUES}

# (soft, hard) limits per queue; a task may tighten them, never loosen past the visibility check.
TASK_TIME_LIMITS_S: dict[str, tuple[int, int]] = {
    "provision": (120, 150),
    "ssh": (300, 360),
    "monitor": (120, 150),
    "evaluate": (1800, 1900),
    "maintenance": (240, 300),
}
DEFAULT_SOFT_TIME_LIMIT_S = 300
DEFAULT_TIME_LIMIT_S = 360

# The longest countdown any task re-enqueues itself with (boot watch, monitor, backoff).
MAX_COUNTDOWN_S = 900

VISIBILITY_TIMEOUT_S = 7200


def build_config(settings: Settings) -> dict[str, Any]:
    """The Celery configuration for `settings` (no connection is made)."""
    transport = {"visibility_timeout": VISIBILITY_TIMEOUT_S}
    return {
        "broker_url": settings.broker_url,
        "result_backend": settings.result_url,
        # JSON only: no pickle, tasks pass ids, not objects.
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        # A task is acknowledged after it ran; a worker lost mid-task puts it back.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "task_soft_time_limit": DEFAULT_SOFT_TIME_LIMIT_S,
        "task_time_limit": DEFAULT_TIME_LIMIT_S,
        # The visibility timeout, in the three places Celery reads it.
        "broker_transport_options": dict(transport),
        "result_backend_transport_options": dict(transport),
        "visibility_timeout": VISIBILITY_TIMEOUT_S,
        "task_queues_names": list(QUEUES),
        "task_default_queue": "maintenance",
        "task_routes": TASK_ROUTES,
        "task_create_missing_queues": True,
        # Events on, so Flower sees every task.
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        "task_track_started": True,
        "result_expires": 24 * 3600,
        "broker_connection_retry_on_startup": True,
        "timezone": "UTC",
        "enable_utc": True,
    }


def check_time_limits(conf: Any, task_limits: dict[str, float] | None = None) -> None:
    """Refuse a configuration whose visibility timeout does not exceed every limit and countdown."""
    places = {
        "broker_transport_options.visibility_timeout": (conf.get("broker_transport_options") or {}).get(
            "visibility_timeout"
        ),
        "result_backend_transport_options.visibility_timeout": (conf.get("result_backend_transport_options") or {}).get(
            "visibility_timeout"
        ),
        "visibility_timeout": conf.get("visibility_timeout"),
    }
    missing = [k for k, v in places.items() if v is None]
    if missing:
        raise ConfigError(
            f"visibility timeout not set in {', '.join(missing)}. Fix: set it in all three places "
            "(workers/config.py build_config)"
        )
    values = {int(v) for v in places.values()}
    if len(values) != 1:
        raise ConfigError(f"visibility timeouts disagree: {places}. Fix: set one value in all three places")
    vt = values.pop()
    limits: dict[str, float] = {
        "task_time_limit": float(conf.get("task_time_limit") or 0),
        "task_soft_time_limit": float(conf.get("task_soft_time_limit") or 0),
        "MAX_COUNTDOWN_S": float(MAX_COUNTDOWN_S),
    }
    for queue, (soft, hard) in TASK_TIME_LIMITS_S.items():
        limits[f"{queue} soft limit"] = soft
        limits[f"{queue} hard limit"] = hard
    limits.update(task_limits or {})
    name, longest = max(limits.items(), key=lambda kv: kv[1])
    if longest >= vt:
        raise ConfigError(
            f"visibility timeout {vt}s is not longer than {name} ({longest:.0f}s): a task would be "
            "delivered twice. Fix: raise VISIBILITY_TIMEOUT_S or lower the limit"
        )
