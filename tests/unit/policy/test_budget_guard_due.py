"""When a job's own poll holds its budget caps: only while the beat's budget monitor does not cover
the time until that job's next poll."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from app.policy.supervision import budget_guard_due


def test_a_monitor_that_never_passed_leaves_the_caps_to_the_poll() -> None:
    """No budget monitor pass on record: the poll holds the caps."""
    assert budget_guard_due(monitor_ok_age_s=None, poll_s=30.0, guard_s=90.0)


def test_a_recent_monitor_pass_covers_the_poll() -> None:
    """A pass 10 s ago looked 90 s ahead; the next poll in 30 s is inside that: nothing to add."""
    assert not budget_guard_due(monitor_ok_age_s=10.0, poll_s=30.0, guard_s=90.0)


def test_a_pass_whose_look_ahead_ends_before_the_next_poll_does_not_cover_it() -> None:
    """A pass 61 s ago covers 29 s more; the next poll is 30 s away: the poll holds the caps."""
    assert budget_guard_due(monitor_ok_age_s=61.0, poll_s=30.0, guard_s=90.0)
    assert not budget_guard_due(monitor_ok_age_s=60.0, poll_s=30.0, guard_s=90.0)


def test_a_pass_dated_in_the_future_is_not_believed() -> None:
    """A last success later than now (a clock that jumped): the poll holds the caps."""
    assert budget_guard_due(monitor_ok_age_s=-5.0, poll_s=30.0, guard_s=90.0)


@given(
    age=st.floats(min_value=0.0, max_value=1e6, allow_nan=False),
    poll=st.floats(min_value=0.0, max_value=1e4, allow_nan=False),
    guard=st.floats(min_value=0.0, max_value=1e4, allow_nan=False),
)
def test_skipping_is_safe_exactly_when_the_look_ahead_reaches_the_next_poll(
    age: float, poll: float, guard: float
) -> None:
    """The poll skips the caps only when the monitor's last look-ahead still covers its next poll."""
    assert budget_guard_due(monitor_ok_age_s=age, poll_s=poll, guard_s=guard) == (age + poll > guard)
