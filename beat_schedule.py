"""The periodic schedule, as plain data. Exactly one beat runs it (see README, "One beat").

Periodic work runs as sweeps over all instances, never one task per instance per tick. `expires`
drops a tick that waited longer than its interval (a backlog must not stop things twice).

Periods are seconds of the provisioning clock. Against the shared simulated marketplace that clock
runs `scale` times faster than the wall clock, and so does the schedule (`scaled`); the campaign
simulator runs its sweeps at the same periods in virtual time.
"""

from typing import Any

FIVE_MINUTES_S = 300.0

BEAT_SCHEDULE: dict[str, dict[str, Any]] = {
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
    "price-increases": {
        "task": "tuneharness.maintenance.answer_price_increases",
        "schedule": FIVE_MINUTES_S,
        "options": {"queue": "maintenance", "expires": FIVE_MINUTES_S - 5},
    },
    "redrive": {
        "task": "tuneharness.maintenance.redrive",
        "schedule": FIVE_MINUTES_S,
        "options": {"queue": "maintenance", "expires": FIVE_MINUTES_S - 5},
    },
    "budget-monitor": {
        "task": "tuneharness.maintenance.budget_monitor",
        "schedule": 60.0,
        "options": {"queue": "maintenance", "expires": 55},
    },
    "research-runs": {
        "task": "tuneharness.maintenance.research_sweep",
        "schedule": 60.0,
        "options": {"queue": "maintenance", "expires": 55},
    },
}


def scaled(schedule: dict[str, dict[str, Any]], scale: float) -> dict[str, dict[str, Any]]:
    """The schedule with every period and expiry in wall seconds when the clock runs `scale` times
    faster than the wall clock."""
    out: dict[str, dict[str, Any]] = {}
    for name, entry in schedule.items():
        options = dict(entry.get("options") or {})
        if "expires" in options:
            options["expires"] = float(options["expires"]) / scale
        out[name] = {**entry, "schedule": float(entry["schedule"]) / scale, "options": options}
    return out


def period_s(name: str) -> float:
    """One entry's period, in seconds of the provisioning clock."""
    return float(str(BEAT_SCHEDULE[name]["schedule"]))
