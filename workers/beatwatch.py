"""A frozen beat is noticed by the workers, not by beat itself.

The periodic tasks (watchdogs, reaper, reconciler, budget monitor) are scheduled by the one beat;
a task that beat schedules cannot report that beat has stopped. Each worker's main process runs
one daemon thread instead: every `check_every_s` it reads each periodic task's last success
(`app.liveness`) and, when one is older than three of its intervals, sends `beat_overdue` through
the notifier directly (the alert outbox is flushed by a beat task too, so it is not relied on).
The alert's key is per task and hour, so several workers and repeated checks send it once.
A worker gives beat three intervals from its own start before it counts a task that never ran.

The money sweeps (FALLBACK_TASKS: budget monitor, reaper, idle watchdog, reconciler) are not left
to beat alone: one interval plus FALLBACK_SLACK_S after one last succeeded, a worker sends it
itself, once per interval across the fleet (a Redis SET NX key). The sweeps are safe to run beside
a resumed beat's (each stop is made once).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["FALLBACK_SLACK_S", "FALLBACK_TASKS", "BeatWatch", "due_fallbacks", "late_tasks"]

# The sweeps that stop money (the reconciler stops what a lost create answer left running unknown
# to the registry, which no cap counts yet). When beat is late with one of them, the workers send it themselves
# (once per interval across the fleet): a paused or lost beat must not let hosts bill past their
# caps or kill-times. The budget monitor's stop looks `budget_guard_s` (90 s) ahead, so its
# fallback comes within that: one interval (60 s) plus FALLBACK_SLACK_S.
FALLBACK_TASKS = ("budget-monitor", "reaper", "idle-watchdog", "reconciler")
FALLBACK_SLACK_S = 20.0


def late_tasks(
    last: Mapping[str, float], intervals_s: Mapping[str, float], *, now: float, watching_since: float
) -> list[tuple[str, float]]:
    """(name, seconds since last success or since watching began) of tasks overdue by 3 intervals."""
    from app.liveness import overdue

    late = []
    for o in overdue(last, intervals_s, now=now):
        age = o.age_s if o.age_s is not None else now - watching_since
        if age > 3.0 * o.interval_s and now - watching_since > 3.0 * o.interval_s:
            late.append((o.name, age))
    return late


def due_fallbacks(
    last: Mapping[str, float],
    intervals_s: Mapping[str, float],
    *,
    now: float,
    watching_since: float,
    slack_s: float = FALLBACK_SLACK_S,
    names: tuple[str, ...] = FALLBACK_TASKS,
) -> list[str]:
    """The money sweeps whose last success (or, never run, the start of watching) is more than one
    interval plus `slack_s` ago: the workers run these themselves."""
    out = []
    for name in names:
        interval = intervals_s.get(name)
        if interval is None:
            continue
        since = max(last.get(name, watching_since), watching_since)
        if now - since > interval + slack_s:
            out.append(name)
    return out


class BeatWatch:
    """The thread; `check_once` is what it does each period (tests call it directly)."""

    def __init__(
        self,
        intervals_s: Mapping[str, float],
        *,
        read_last: Callable[[], Mapping[str, float]],
        alert: Callable[[str, str, str], None],
        check_every_s: float,
        clock: Callable[[], float] = time.time,
        run_late: Callable[[str], None] | None = None,
    ) -> None:
        self.intervals_s = dict(intervals_s)
        self.read_last = read_last
        self.alert = alert
        self.run_late = run_late  # sends a late money sweep itself (`due_fallbacks`)
        self.check_every_s = check_every_s
        self.clock = clock
        self.started = clock()
        self._stop = threading.Event()

    def check_once(self) -> list[str]:
        now = self.clock()
        last = self.read_last()
        if self.run_late is not None:
            for name in due_fallbacks(last, self.intervals_s, now=now, watching_since=self.started):
                self.run_late(name)
        late = late_tasks(last, self.intervals_s, now=now, watching_since=self.started)
        for name, age in late:
            self.alert(
                "beat_overdue",
                f"periodic task {name} last succeeded {age:.0f}s ago (every {self.intervals_s[name]:.0f}s): "
                "is beat running? Fix: start exactly one beat (`tuneharness up` does) and check `tuneharness doctor`",
                f"beat_overdue:{name}:{int(now // 3600)}",
            )
        return [n for n, _ in late]

    def _loop(self) -> None:
        while not self._stop.wait(self.check_every_s):
            try:
                self.check_once()
            except Exception:  # the database or the webhook is down: try again next period
                continue

    def start(self) -> None:
        threading.Thread(target=self._loop, name="beat-watch", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()


def start_for_worker(schedule: Mapping[str, Mapping[str, Any]]) -> BeatWatch:
    """The worker's watch over `schedule` (beat's, as this process scaled it), alerting via the notifier."""
    from app import bootstrap
    from app.alerts import Alert
    from app.liveness import last_successes

    intervals = {name: float(str(entry["schedule"])) for name, entry in schedule.items()}

    def alert(kind: str, text: str, key: str) -> None:
        bootstrap.notifier(background=False).notify(Alert(kind, text, key=key))

    def run_late(name: str) -> None:
        """Send beat's entry for `name` as beat would, once per interval across every worker."""
        import os
        import socket

        import redis

        from workers.celery_app import app as celery_app

        entry, interval = schedule[name], intervals[name]
        key = f"tuneharness:beat-fallback:{name}:{int(time.time() // interval)}"
        client = redis.Redis.from_url(bootstrap.settings().broker_url)
        if client.set(key, f"{socket.gethostname()}:{os.getpid()}", nx=True, ex=max(1, int(2 * interval) + 1)):
            options = dict(entry.get("options") or {})
            celery_app.send_task(str(entry["task"]), queue=options.get("queue"), expires=options.get("expires"))

    watch = BeatWatch(
        intervals,
        read_last=lambda: last_successes(bootstrap.engine()),
        alert=alert,
        # often enough that a late budget monitor is sent within its look-ahead (FALLBACK_SLACK_S)
        check_every_s=min(min(intervals.values()), FALLBACK_SLACK_S / 2),
        run_late=run_late,
    )
    watch.start()
    return watch
