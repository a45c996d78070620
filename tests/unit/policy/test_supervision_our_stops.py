"""Our own stops are not losses: who stopped a host decides whether its job pauses or resumes."""

from __future__ import annotations

import pytest

from app.policy.supervision import (
    HostProbe,
    Paused,
    Resume,
    ResumeFacts,
    StoppedByUs,
    StopReason,
    SupervisorConfig,
    assess,
    at_cap,
    judge_our_stop,
    settling,
    stop_reason_of,
)

CFG = SupervisorConfig()
NOW = 10_000.0
LATER = NOW + 6 * 3600.0  # a kill-time well ahead


def _judge(reason: StopReason, *, room: bool = False, kill_at: float = LATER) -> Paused | Resume:
    return judge_our_stop(StoppedByUs(reason, NOW - 60.0), ResumeFacts(budget_room=room, kill_at=kill_at), now=NOW)


def test_a_budget_stop_pauses_until_the_cap_has_room() -> None:
    """Budget: paused while the cap is full (the message names the fix), resumed once it has room."""
    paused = _judge(StopReason.BUDGET, room=False)
    assert isinstance(paused, Paused) and paused.reason is StopReason.BUDGET and "cap-usd" in paused.why
    assert isinstance(_judge(StopReason.BUDGET, room=True), Resume)


def test_a_kill_time_stop_pauses_until_the_kill_time_is_extended() -> None:
    """Kill-time: paused while the kill-time is reached (it needs a longer one), resumed once it lies ahead."""
    paused = _judge(StopReason.KILL_TIME, kill_at=NOW - 1.0)
    assert isinstance(paused, Paused) and paused.reason is StopReason.KILL_TIME and "longer kill-time" in paused.why
    assert isinstance(_judge(StopReason.KILL_TIME, kill_at=LATER), Resume)


def test_an_idle_stop_resumes_at_once() -> None:
    """Idle: nobody drove the GPU, the job still needs it: resume on the same host."""
    assert isinstance(_judge(StopReason.IDLE), Resume)


@pytest.mark.parametrize("reason", [StopReason.OPERATOR, StopReason.RECONCILER, StopReason.OTHER])
def test_other_stops_wait_for_the_operator(reason: StopReason) -> None:
    """Operator, reconciler or an unnamed stop: paused, saying only the operator resumes it, whatever the budget."""
    paused = _judge(reason, room=True)
    assert isinstance(paused, Paused) and "only the operator" in paused.why
    resumed = judge_our_stop(
        StoppedByUs(reason, NOW), ResumeFacts(budget_room=True, kill_at=LATER, operator_resumed=True), now=NOW
    )
    assert isinstance(resumed, Resume)


@pytest.mark.parametrize("reason", [StopReason.BUDGET, StopReason.IDLE])
def test_no_host_is_started_again_at_its_kill_time(reason: StopReason) -> None:
    """Whatever the reason, a host within ten minutes of its kill-time stays paused: the reaper would stop it."""
    paused = _judge(reason, room=True, kill_at=NOW + 60.0)
    assert isinstance(paused, Paused) and paused.reason is reason and "kill-time" in paused.why


def test_stop_reasons_are_read_from_named_values_only() -> None:
    """A stop event's `stopped_by` maps to its StopReason; anything else, or nothing, is OTHER."""
    assert stop_reason_of("budget") is StopReason.BUDGET
    assert stop_reason_of("kill_time") is StopReason.KILL_TIME
    assert stop_reason_of("budget_stop") is StopReason.OTHER
    assert stop_reason_of(None) is StopReason.OTHER and stop_reason_of(3) is StopReason.OTHER


def test_at_the_cap_a_training_host_with_work_pauses_and_anything_else_ends() -> None:
    """The budget monitor pauses a training job's host that holds work; a booting, standby or held host ends."""
    assert at_cap(job_phase="training", held_work=True) == "pause"
    assert at_cap(job_phase="training", held_work=False) == "end"
    assert at_cap(job_phase=None, held_work=True) == "end"
    assert at_cap(job_phase="provisioning", held_work=True) == "end"


def test_a_restarting_host_is_not_lost_within_its_grace() -> None:
    """A host we started again answers no SSH for a while: restarting, not lost, until restart_grace_s; gone is gone."""
    down = HostProbe("stopped", ssh_ok=False)
    assert assess(down, ssh_failures=5, cfg=CFG, restarting_for_s=60.0).kind == "restarting"
    assert (
        assess(HostProbe("exited", ssh_ok=False), ssh_failures=5, cfg=CFG, restarting_for_s=60.0).kind == "restarting"
    )
    assert assess(down, ssh_failures=5, cfg=CFG, restarting_for_s=CFG.restart_grace_s).kind == "lost"
    assert assess(HostProbe("gone", ssh_ok=False), ssh_failures=1, cfg=CFG, restarting_for_s=1.0).kind == "lost"
    assert assess(down, ssh_failures=5, cfg=CFG).kind == "lost"


def test_a_resumed_job_settles_until_it_passes_its_old_step_or_a_stall_window() -> None:
    """After a resume, progress is not judged until the step passes the one reached before the pause, or stall_s."""
    assert settling(resumed=True, step=5, paused_step=6, since_launch_s=100.0, stall_s=600.0)
    assert not settling(resumed=True, step=7, paused_step=6, since_launch_s=100.0, stall_s=600.0)
    assert not settling(resumed=True, step=5, paused_step=6, since_launch_s=600.0, stall_s=600.0)
    assert not settling(resumed=False, step=5, paused_step=6, since_launch_s=100.0, stall_s=600.0)
