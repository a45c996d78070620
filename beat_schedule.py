"""The periodic schedule, as plain data. Exactly one beat runs it (see README, "One beat").

Periodic work runs as sweeps over all instances, never one task per instance per tick.
"""

BEAT_SCHEDULE: dict[str, dict[str, object]] = {
    "beat-heartbeat": {
        "task": "tuneharness.maintenance.heartbeat",
        "schedule": 60.0,
        "options": {"queue": "maintenance", "expires": 55},
    },
}
