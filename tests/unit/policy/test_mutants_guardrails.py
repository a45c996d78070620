"""The money guardrails at their exact boundaries and with their exact evidence, so that a changed
comparison, default or reason in app/policy/guardrails.py fails a test (make mutation)."""

from __future__ import annotations

from app.policy.guardrails import (
    Adopt,
    IdleVerdict,
    Known,
    Listed,
    MarkLost,
    StopOrphan,
    believable_checkpoint_step,
    believable_step,
    budget_level,
    idle_verdict,
    label_for,
    reconcile,
)

GRACE_S = 1800.0
OURS = label_for("job-1", 1, 99_999)
OTHER_OURS = label_for("job-2", 1, 99_999)


def test_a_step_exactly_at_max_steps_is_believed() -> None:
    """A report equal to the job's own max_steps is the last step, not a lie."""
    assert believable_step(reported=100, previous=40, max_steps=100) == 100
    assert believable_step(reported=101, previous=40, max_steps=100) == 40


def test_a_checkpoint_exactly_at_the_training_step_is_believed() -> None:
    """A checkpoint written at the believed step is complete; one past it is not."""
    assert believable_checkpoint_step(reported=50, previous=20, step=50) == 50
    assert believable_checkpoint_step(reported=51, previous=20, step=50) == 20


def test_a_cap_below_one_dollar_still_grades_the_spend() -> None:
    """Only a cap of zero or less stops at once; a $0.50 cap with $0.10 committed is ok."""
    assert budget_level(committed_usd=0.1, cap_usd=0.5) == "ok"
    assert budget_level(committed_usd=0.4, cap_usd=0.5) == "warning"
    assert budget_level(committed_usd=0.5, cap_usd=0.5) == "stop"
    assert budget_level(committed_usd=0.0, cap_usd=0.0) == "stop"


def test_a_busy_phase_is_never_idle_and_says_which_phase() -> None:
    """Pulling an image leaves the GPU at 0% without being idle; the evidence names the phase."""
    v = idle_verdict(gpu_util_pct=0.0, job_phase="pulling", idle_since=100.0, now=5000.0)
    assert v == IdleVerdict(None, False, "job phase pulling: busy without the GPU")


def test_a_step_stalled_exactly_the_grace_stops_whatever_the_gpu_says() -> None:
    """At exactly grace_s without a step, a host printing 100% is stopped; the spell began at the last step."""
    v = idle_verdict(gpu_util_pct=100.0, job_phase="training", idle_since=None, now=2800.0, step_advanced_at=1000.0)
    assert v == IdleVerdict(
        1000.0, True, "training step not advanced for 1800s (grace 1800s), whatever the GPU reports"
    )


def test_a_stalled_step_keeps_the_earlier_start_of_the_idle_spell() -> None:
    """The idle spell starts at the earlier of the GPU's idle start and the last step."""
    earlier_idle = idle_verdict(
        gpu_util_pct=0.0, job_phase="training", idle_since=500.0, now=2900.0, step_advanced_at=1000.0
    )
    assert earlier_idle.idle_since == 500.0
    later_idle = idle_verdict(
        gpu_util_pct=0.0, job_phase="training", idle_since=1500.0, now=2900.0, step_advanced_at=1000.0
    )
    assert later_idle == IdleVerdict(
        1000.0, True, "training step not advanced for 1900s (grace 1800s), whatever the GPU reports"
    )


def test_a_step_advanced_within_the_grace_leaves_the_gpu_to_decide() -> None:
    """One second short of the grace, the step decides nothing: a busy GPU is busy."""
    v = idle_verdict(gpu_util_pct=90.0, job_phase="training", idle_since=None, now=2799.0, step_advanced_at=1000.0)
    assert v == IdleVerdict(None, False, "GPU 90% busy")


def test_unknown_utilisation_keeps_the_idle_spell_as_it_was() -> None:
    """A NaN reading neither starts nor ends an idle spell."""
    v = idle_verdict(gpu_util_pct=float("nan"), job_phase="training", idle_since=700.0, now=900.0)
    assert v == IdleVerdict(700.0, False, "GPU utilisation unknown")


def test_utilisation_exactly_at_the_threshold_is_busy() -> None:
    """5% at a 5% threshold is busy and ends an idle spell."""
    v = idle_verdict(gpu_util_pct=5.0, job_phase="training", idle_since=100.0, now=900.0)
    assert v == IdleVerdict(None, False, "GPU 5% busy")


def test_an_idle_spell_within_the_grace_reports_how_long_it_lasted() -> None:
    """Idle since 1000 s, now 1600 s: 600 s of a 1800 s grace, not stopped."""
    v = idle_verdict(gpu_util_pct=1.0, job_phase="training", idle_since=1000.0, now=1600.0)
    assert v == IdleVerdict(1000.0, False, "GPU below 5% for 600s, within grace")


def test_an_idle_spell_past_the_grace_stops_and_keeps_its_start() -> None:
    """Idle since 1000 s, now 2800 s: exactly the grace, stopped, the spell's start kept."""
    v = idle_verdict(gpu_util_pct=1.0, job_phase="training", idle_since=1000.0, now=2800.0)
    assert v == IdleVerdict(1000.0, True, "GPU below 5% for 1800s (grace 1800s)")


def listed(label: str | None, *, iid: str = "i-9", state: str = "running", started_at: float | None = 0.0) -> Listed:
    return Listed(instance_id=iid, label=label, state=state, started_at=started_at, first_seen_at=0.0)


def orphan(iid: str, label: str, age_s: float) -> StopOrphan:
    return StopOrphan(iid, label, f"labelled {label} but unknown to the ledger for {age_s:.0f}s")


def test_only_a_create_intent_is_adopted_not_another_row_without_an_id() -> None:
    """A released row without an instance id is no intent: its label's instance is an orphan."""
    released = Known(rental_id="r1", label=OURS, instance_id=None, state="released", created_at=0.0)
    acts = reconcile(
        known=[released], listed=[listed(OURS)], listing_complete=True, now=GRACE_S, orphan_grace_s=GRACE_S
    )
    assert acts == [orphan("i-9", OURS, GRACE_S)]


def test_an_intent_exactly_the_grace_old_is_adopted_with_its_evidence() -> None:
    """A create intent as old as the grace is no longer in flight: its instance is adopted."""
    intent = Known(rental_id="r1", label=OURS, instance_id=None, state="intent", created_at=100.0)
    acts = reconcile(
        known=[intent], listed=[listed(OURS)], listing_complete=True, now=100.0 + GRACE_S, orphan_grace_s=GRACE_S
    )
    assert acts == [Adopt("r1", "i-9", f"label {OURS} matches a create intent without an instance id")]


def test_a_gone_instance_is_never_adopted() -> None:
    """The provider lists it gone: nothing to adopt, even with a matching intent."""
    intent = Known(rental_id="r1", label=OURS, instance_id=None, state="intent", created_at=0.0)
    acts = reconcile(
        known=[intent], listed=[listed(OURS, state="gone")], listing_complete=True, now=9e4, orphan_grace_s=GRACE_S
    )
    assert acts == []


def test_one_skipped_instance_does_not_end_the_sweep() -> None:
    """Someone else's instance, a create in flight and an already stopped orphan are skipped; the
    running orphan listed after them is still stopped."""
    intent = Known(rental_id="r1", label=OURS, instance_id=None, state="intent", created_at=9e4 - 10.0)
    items = [
        listed("someone-elses-box", iid="i-1"),
        listed(OURS, iid="i-2"),
        listed(OTHER_OURS, iid="i-3", state="stopped"),
        listed(OTHER_OURS, iid="i-4"),
    ]
    acts = reconcile(known=[intent], listed=items, listing_complete=True, now=9e4, orphan_grace_s=GRACE_S)
    assert acts == [orphan("i-4", OTHER_OURS, 9e4)]


def test_an_orphan_without_a_start_time_ages_from_its_first_sighting() -> None:
    """No start time from the provider: its age counts from the sweep that first saw it; at exactly
    the grace it is stopped."""
    acts = reconcile(
        known=[], listed=[listed(OURS, started_at=None)], listing_complete=True, now=GRACE_S, orphan_grace_s=GRACE_S
    )
    assert acts == [orphan("i-9", OURS, GRACE_S)]


def test_a_known_instance_listed_as_gone_or_missing_is_lost() -> None:
    """An active rental listed gone and a stopped one no longer listed are both marked lost."""
    known = [
        Known(rental_id="r1", label=OURS, instance_id="i-1", state="active", created_at=0.0),
        Known(rental_id="r2", label=OTHER_OURS, instance_id="i-2", state="stopped", created_at=0.0),
    ]
    acts = reconcile(
        known=known, listed=[listed(OURS, iid="i-1", state="gone")], listing_complete=True, now=10.0, orphan_grace_s=60
    )
    assert acts == [
        MarkLost("r1", "i-1", "the provider no longer lists it"),
        MarkLost("r2", "i-2", "the provider no longer lists it"),
    ]
