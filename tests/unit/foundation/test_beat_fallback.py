"""When beat is late with a money sweep (budget monitor, reaper, idle watchdog), the workers send it
themselves: one interval plus FALLBACK_SLACK_S after its last success, inside the budget monitor's
90 s look-ahead."""

from __future__ import annotations

from workers.beatwatch import FALLBACK_SLACK_S, FALLBACK_TASKS, BeatWatch, due_fallbacks

INTERVALS = {"budget-monitor": 60.0, "reaper": 300.0, "idle-watchdog": 300.0, "reconciler": 300.0, "redrive": 300.0}


def test_a_money_sweep_late_by_one_interval_and_the_slack_is_due() -> None:
    last = {"budget-monitor": 1000.0, "reaper": 1000.0, "idle-watchdog": 1000.0, "reconciler": 1000.0}
    assert due_fallbacks(last, INTERVALS, now=1000.0 + 60 + FALLBACK_SLACK_S, watching_since=0.0) == []
    assert due_fallbacks(last, INTERVALS, now=1000.0 + 60 + FALLBACK_SLACK_S + 1, watching_since=0.0) == [
        "budget-monitor"
    ]
    late = due_fallbacks(last, INTERVALS, now=1000.0 + 300 + FALLBACK_SLACK_S + 1, watching_since=0.0)
    assert late == ["budget-monitor", "reaper", "idle-watchdog", "reconciler"]
    assert 60 + FALLBACK_SLACK_S < 90  # inside the budget monitor's look-ahead (budget_guard_s)
    assert set(FALLBACK_TASKS) == {"budget-monitor", "reaper", "idle-watchdog", "reconciler"}
    assert "redrive" not in FALLBACK_TASKS and "sweep_holds" not in FALLBACK_TASKS  # these stop no money


def test_a_sweep_that_never_ran_counts_from_when_watching_began() -> None:
    assert due_fallbacks({}, INTERVALS, now=500.0 + 60, watching_since=500.0) == []
    assert due_fallbacks({}, INTERVALS, now=500.0 + 81, watching_since=500.0) == ["budget-monitor"]


def test_the_watch_sends_what_is_due_and_still_alerts_late_tasks() -> None:
    sent: list[str] = []
    alerts: list[str] = []
    now = [0.0]
    watch = BeatWatch(
        INTERVALS,
        read_last=lambda: {
            "budget-monitor": 0.0,
            "reaper": 0.0,
            "idle-watchdog": 0.0,
            "reconciler": 0.0,
            "redrive": 0.0,
        },
        alert=lambda kind, text, key: alerts.append(key),
        check_every_s=10.0,
        clock=lambda: now[0],
        run_late=sent.append,
    )
    now[0] = 85.0
    watch.check_once()
    assert sent == ["budget-monitor"] and alerts == []
    now[0] = 1000.0
    watch.check_once()
    assert sent[1:] == ["budget-monitor", "reaper", "idle-watchdog", "reconciler"] and alerts  # alerted as before
