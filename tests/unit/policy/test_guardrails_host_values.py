"""Numbers a host reports are bounded before they decide money, and a budget stop's wait has a deadline."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.policy.guardrails import (
    BUDGET_CHECKPOINT_WAIT_S,
    as_step,
    believable_checkpoint_step,
    believable_step,
    believable_util,
    checkpoint_wait_over,
    idle_verdict,
)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0, 100.5, 1e9])
def test_an_impossible_utilisation_is_unknown(value: float) -> None:
    """NaN, infinity and anything outside [0, 100] read as unknown, never as busy."""
    assert believable_util(value) is None
    assert not idle_verdict(gpu_util_pct=value, job_phase=None, idle_since=0.0, now=10_000.0).stop
    assert (
        idle_verdict(gpu_util_pct=value, job_phase=None, idle_since=None, now=1.0).evidence == "GPU utilisation unknown"
    )


def test_a_possible_utilisation_is_kept() -> None:
    """0, 55.5 and 100 are taken as reported; None stays unknown."""
    assert [believable_util(v) for v in (0.0, 55.5, 100.0, None)] == [0.0, 55.5, 100.0, None]


def test_a_step_beyond_max_steps_or_going_backwards_is_not_believed() -> None:
    """The previous step stands when a host reports past max_steps, backwards, or garbage."""
    assert believable_step(reported=150, previous=100, max_steps=200) == 150
    assert believable_step(reported=10**9, previous=100, max_steps=200) == 100
    assert believable_step(reported=50, previous=100, max_steps=200) == 100
    for junk in (float("nan"), -3, 2.5, "x", True, None):
        assert believable_step(reported=junk, previous=7, max_steps=200) == 7
    assert believable_step(reported="120", previous=7, max_steps=None) == 120


def test_a_checkpoint_ahead_of_the_step_or_going_backwards_is_not_believed() -> None:
    """A host cannot keep its checkpoint unsafe by naming one beyond the step it reached."""
    assert believable_checkpoint_step(reported=50, previous=0, step=60) == 50
    assert believable_checkpoint_step(reported=10**9, previous=50, step=60) == 50
    assert believable_checkpoint_step(reported=40, previous=50, step=60) == 50
    assert believable_checkpoint_step(reported=float("nan"), previous=50, step=60) == 50


def test_as_step_takes_whole_non_negative_numbers_only() -> None:
    """Whole numbers (also as text) are steps; anything else is None."""
    assert [as_step(v) for v in (0, 3, 3.0, "12")] == [0, 3, 3, 12]
    assert [as_step(v) for v in (-1, 2.5, math.inf, "a", None, [1])] == [None] * 6


@given(
    reported=st.one_of(st.integers(-(10**12), 10**12), st.floats(allow_nan=True)),
    previous=st.integers(0, 10_000),
    max_steps=st.integers(0, 10_000),
)
def test_the_believed_step_never_passes_max_steps_nor_goes_backwards(
    reported: float, previous: int, max_steps: int
) -> None:
    """Whatever a host reports, the believed step lies between the previous one and max_steps."""
    step = believable_step(reported=reported, previous=min(previous, max_steps), max_steps=max_steps)
    assert min(previous, max_steps) <= step <= max_steps


def test_the_budget_stop_waits_for_a_checkpoint_until_its_deadline_only() -> None:
    """Within the wait it waits; at the deadline it stops whatever the host says."""
    assert BUDGET_CHECKPOINT_WAIT_S == 900.0
    assert not checkpoint_wait_over(waiting_since=1000.0, now=1899.0, max_wait_s=900.0)
    assert checkpoint_wait_over(waiting_since=1000.0, now=1900.0, max_wait_s=900.0)


def test_a_stalled_step_makes_a_busy_host_idle_after_the_grace_only() -> None:
    """GPU 100% but no step for the grace: stop; within the grace or with a busy-without-GPU phase: not."""
    stalled = idle_verdict(
        gpu_util_pct=100.0, job_phase="training", idle_since=None, now=2000.0, grace_s=1800.0, step_advanced_at=100.0
    )
    assert stalled.stop and stalled.idle_since == 100.0
    recent = idle_verdict(
        gpu_util_pct=100.0, job_phase="training", idle_since=None, now=2000.0, grace_s=1800.0, step_advanced_at=500.0
    )
    assert not recent.stop and recent.idle_since is None
    pulling = idle_verdict(
        gpu_util_pct=0.0, job_phase="pulling", idle_since=None, now=9000.0, grace_s=1800.0, step_advanced_at=0.0
    )
    assert not pulling.stop
