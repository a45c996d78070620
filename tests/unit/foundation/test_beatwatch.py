"""The workers notice a frozen beat: a periodic task three intervals late raises `beat_overdue`, once."""

from __future__ import annotations

from workers.beatwatch import BeatWatch, late_tasks


class _Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_never_ran_counts_only_after_three_intervals_of_watching() -> None:
    """A task that never ran is not late in a worker's first three intervals (beat may be starting)."""
    assert late_tasks({}, {"reaper": 300.0}, now=1000.0, watching_since=500.0) == []
    assert late_tasks({}, {"reaper": 300.0}, now=1401.0, watching_since=500.0) == [("reaper", 901.0)]


def test_a_stale_success_is_late_and_a_fresh_one_is_not() -> None:
    """Last success older than three intervals: late; within them: on time."""
    intervals = {"heartbeat": 60.0, "reaper": 300.0}
    last = {"heartbeat": 10_000.0 - 200.0, "reaper": 10_000.0 - 100.0}
    assert late_tasks(last, intervals, now=10_000.0, watching_since=0.0) == [("heartbeat", 200.0)]


def test_watch_alerts_with_a_key_per_task_and_hour() -> None:
    """Each check alerts every late task with a stable key, so repeats and other workers dedupe."""
    clock = _Clock(0.0)
    sent: list[tuple[str, str, str]] = []
    watch = BeatWatch(
        {"heartbeat": 60.0},
        read_last=lambda: {"heartbeat": 0.0},
        alert=lambda kind, text, key: sent.append((kind, text, key)),
        check_every_s=60.0,
        clock=clock,
    )
    clock.t = 100.0
    assert watch.check_once() == []
    clock.t = 181.0
    assert watch.check_once() == ["heartbeat"]
    clock.t = 241.0
    watch.check_once()
    assert [k for _, _, k in sent] == ["beat_overdue:heartbeat:0", "beat_overdue:heartbeat:0"]
    assert sent[0][0] == "beat_overdue" and "is beat running" in sent[0][1]
