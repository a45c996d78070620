"""Triage's reading of a dead trainer's log, corrected by what the supervisor knows: the step it
reached and its exit code (`app.policy.supervision.read_with_facts`)."""

from __future__ import annotations

import pytest

from app.policy.supervision import (
    FactsVerdict,
    Remedy,
    SupervisorConfig,
    TrainerExit,
    read_with_facts,
    route_triage,
)


@pytest.mark.parametrize("state", ["cuda_fault", "diverged", "unknown", "oom"])
def test_a_run_that_reached_its_last_step_is_completed_whatever_its_tail(state: str) -> None:
    got = read_with_facts(state, Remedy.STOP_JOB.value, exit_code=1, step=20, max_steps=20)
    assert (got.state, got.remedy) == ("completed", Remedy.COLLECT.value)
    assert got.fact is not None and "step 20 of 20" in got.fact
    route = route_triage(got.state, "", exit_code=1, same_host_restarts=0, cfg=SupervisorConfig(), remedy=got.remedy)
    assert route == "same_host"


def test_one_step_short_of_the_end_the_log_decides() -> None:
    got = read_with_facts("cuda_fault", Remedy.REPLACE_HOST.value, exit_code=1, step=19, max_steps=20)
    assert got == FactsVerdict("cuda_fault", Remedy.REPLACE_HOST.value, None)


@pytest.mark.parametrize("max_steps", [None, 0])
def test_without_a_known_last_step_the_log_decides(max_steps: int | None) -> None:
    got = read_with_facts("diverged", Remedy.STOP_JOB.value, exit_code=1, step=5, max_steps=max_steps)
    assert got == FactsVerdict("diverged", Remedy.STOP_JOB.value, None)


@pytest.mark.parametrize("code", [TrainerExit.BAD_JOB, TrainerExit.REFUSED, TrainerExit.DISK_FULL])
def test_refusals_keep_their_own_routes_even_at_the_last_step(code: int) -> None:
    got = read_with_facts("progressing", Remedy.CONTINUE.value, exit_code=code, step=20, max_steps=20)
    assert got == FactsVerdict("progressing", Remedy.CONTINUE.value, None)


@pytest.mark.parametrize(("code", "state"), [(137, "progressing"), (-9, "unknown")])
def test_a_sigkill_with_a_healthy_log_is_the_oom_killer(code: int, state: str) -> None:
    got = read_with_facts(state, Remedy.CONTINUE.value, exit_code=code, step=5, max_steps=20)
    assert (got.state, got.remedy) == ("oom", Remedy.SAME_HOST.value)
    assert got.fact is not None and f"exit {code}" in got.fact


@pytest.mark.parametrize(("code", "state"), [(137, "cuda_fault"), (1, "progressing"), (None, "progressing")])
def test_other_deaths_keep_the_logs_reading(code: int | None, state: str) -> None:
    got = read_with_facts(state, "x", exit_code=code, step=5, max_steps=20)
    assert got == FactsVerdict(state, "x", None)
