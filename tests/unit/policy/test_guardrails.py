"""Pure guardrail decisions: idle, TTL, reconcile, budget levels, labels."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from app.policy.guardrails import (
    Adopt,
    Known,
    Listed,
    MarkLost,
    StopOrphan,
    budget_level,
    idle_verdict,
    label_for,
    parse_label,
    past_kill_time,
    reconcile,
)


@given(job=st.from_regex(r"[A-Za-z0-9_.]{1,12}(-[A-Za-z0-9_.]{1,6})?", fullmatch=True),
       attempt=st.integers(1, 999), kill_at=st.integers(0, 2**33))
def test_labels_round_trip(job: str, attempt: int, kill_at: int) -> None:
    """Every label we write parses back to its job, attempt and kill-time."""
    assert parse_label(label_for(job, attempt, kill_at)) == (job, attempt, kill_at)


def test_foreign_labels_are_not_ours() -> None:
    """Labels we did not write parse to None."""
    for label in (None, "", "my-training-box", "th-", "th-job-a1", "th-job-a1-kNaN"):
        assert parse_label(label) is None


def test_idle_clock_starts_at_first_idle_sample_and_resets_on_work() -> None:
    """The idle spell starts at the first low sample, stops at the grace, resets when busy."""
    v = idle_verdict(gpu_util_pct=0.0, job_phase="training", idle_since=None, now=100.0, grace_s=1800)
    assert (v.idle_since, v.stop) == (100.0, False)
    v = idle_verdict(gpu_util_pct=2.0, job_phase="training", idle_since=100.0, now=1900.0, grace_s=1800)
    assert v.stop and "1800s" in v.evidence
    v = idle_verdict(gpu_util_pct=60.0, job_phase="training", idle_since=100.0, now=1900.0, grace_s=1800)
    assert (v.idle_since, v.stop) == (None, False)


def test_unknown_utilisation_and_busy_phases_never_stop() -> None:
    """No figure decides nothing; pulling or between slices is not idle."""
    assert not idle_verdict(gpu_util_pct=None, job_phase=None, idle_since=0.0, now=1e9).stop
    assert not idle_verdict(gpu_util_pct=0.0, job_phase="pulling", idle_since=0.0, now=1e9).stop
    assert not idle_verdict(gpu_util_pct=0.0, job_phase="between_slices", idle_since=0.0, now=1e9).stop


def test_kill_time() -> None:
    """Past the kill-time means at or after it."""
    assert past_kill_time(kill_at=10, now=10) and not past_kill_time(kill_at=10, now=9.9)


def _listed(iid: str, label: str | None, state: str = "running", started: float | None = 0.0) -> Listed:
    return Listed(iid, label, state, started, first_seen_at=0.0)


def test_reconcile_adopts_intents_stops_old_orphans_and_marks_lost() -> None:
    """Intent labels are adopted; unknown labelled instances past the grace are stopped; missing are lost."""
    known = [
        Known("j1:1", label_for("j1", 1, 999), None, "intent", 0.0),
        Known("j2:1", label_for("j2", 1, 999), "i-2", "active", 0.0),
        Known("j3:1", label_for("j3", 1, 999), "i-3", "active", 0.0),
    ]
    listed = [
        _listed("i-1", label_for("j1", 1, 999)),
        _listed("i-2", label_for("j2", 1, 999)),
        _listed("i-9", label_for("ghost", 1, 999)),
        _listed("i-8", label_for("young", 1, 999), started=250.0),
        _listed("i-7", "not-ours"),
    ]
    actions = reconcile(known=known, listed=listed, listing_complete=True, now=300.0, orphan_grace_s=240.0)
    assert Adopt("j1:1", "i-1", actions[0].evidence) in actions  # type: ignore[union-attr]
    assert [a.instance_id for a in actions if isinstance(a, StopOrphan)] == ["i-9"]
    assert [a.rental_id for a in actions if isinstance(a, MarkLost)] == ["j3:1"]


def test_reconcile_decides_nothing_on_a_partial_listing() -> None:
    """A failed or partial listing must not mark anything lost or stop anything."""
    known = [Known("j:1", label_for("j", 1, 9), "i-1", "active", 0.0)]
    assert reconcile(known=known, listed=[], listing_complete=False, now=1e6, orphan_grace_s=1) == []


def test_budget_levels() -> None:
    """ok below 80%, warning from 80%, stop at 100% (and for a zero cap)."""
    assert budget_level(committed_usd=7.9, cap_usd=10) == "ok"
    assert budget_level(committed_usd=8.0, cap_usd=10) == "warning"
    assert budget_level(committed_usd=10.0, cap_usd=10) == "stop"
    assert budget_level(committed_usd=0.0, cap_usd=0) == "stop"
