"""The periodic schedule, as plain data. Exactly one beat runs it (see README, "One beat").

Periodic work runs as sweeps over all instances, never one task per instance per tick. `expires`
drops a tick that waited longer than its interval (a backlog must not stop things twice).
"""

FIVE_MINUTES_S = 300.0

BEAT_SCHEDULE: dict[str, dict[str, object]] = {
    "beat-heartbeat": {
        "task": "tuneharness.maintenance.heartbeat",
        "schedule": 60.0,
        "options": {"queue": "maintenance", "expires": 55},
    },
    "idle-watchdog": {
        "task": "tuneharness.maintenance.idle_watchdog",
        "schedule": FIVE_MINUTES_S,
        "options": {"queue": "maintenance", "expires": FIVE_MINUTES_S - 5},
    },
    "reaper": {
        "task": "tuneharness.maintenance.reaper",
        "schedule": FIVE_MINUTES_S,
        "options": {"queue": "maintenance", "expires": FIVE_MINUTES_S - 5},
    },
    "reconciler": {
        "task": "tuneharness.maintenance.reconcile",
        "schedule": FIVE_MINUTES_S,
        "options": {"queue": "maintenance", "expires": FIVE_MINUTES_S - 5},
    },
    "alert-outbox": {
        "task": "tuneharness.maintenance.flush_alerts",
        "schedule": 120.0,
        "options": {"queue": "maintenance", "expires": 115},
    },
    "rearm-monitors": {
        "task": "tuneharness.maintenance.rearm_monitors",
        "schedule": 120.0,
        "options": {"queue": "maintenance", "expires": 115},
    },
    "held-hosts": {
        "task": "tuneharness.maintenance.sweep_holds",
        "schedule": 60.0,
        "options": {"queue": "maintenance", "expires": 55},
    },
    "budget-monitor": {
        "task": "tuneharness.maintenance.budget_monitor",
        "schedule": 60.0,
        "options": {"queue": "maintenance", "expires": 55},
    },
}
