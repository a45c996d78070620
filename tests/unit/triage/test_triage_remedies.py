"""Triage names what to do about a dead trainer as a constant, and the supervisor routes on it."""

from __future__ import annotations

import pytest

from app.policy import supervision
from app.policy.supervision import SupervisorConfig, route_triage
from app.triage.rules import ACTIONS, STATES, Remedy, action_for, classify, remedy_for

CFG = SupervisorConfig()


def test_triage_and_the_supervisor_read_one_remedy_table() -> None:
    """Every remedy triage gives is a supervisor Remedy of the same name and value, and nothing else."""
    assert {m.name: m.value for m in Remedy} == {m.name: m.value for m in supervision.Remedy}


@pytest.mark.parametrize("state", STATES)
def test_routing_on_the_remedy_agrees_with_routing_on_the_actions_wording(state: str) -> None:
    """For every state (and io_error's three kinds) the typed route is the route the wording gave."""
    evidences = (
        [("No space left on device",), ("403 Client Error: Forbidden",), ("Connection reset by peer",)]
        if state == "io_error"
        else [()]
    )
    for ev in evidences:
        for restarts in (0, CFG.max_same_host_restarts):
            by_text = route_triage(state, action_for(state, ev), exit_code=1, same_host_restarts=restarts, cfg=CFG)
            by_remedy = route_triage(
                state, "", exit_code=1, same_host_restarts=restarts, cfg=CFG, remedy=str(remedy_for(state, ev))
            )
            assert by_text == by_remedy, (state, ev, restarts)


def test_exit_codes_outrank_the_remedy_and_an_unknown_remedy_replaces_the_host() -> None:
    """A refused job stops; a serving box or a full disk replaces; a remedy nobody knows replaces."""
    assert route_triage("oom", "", exit_code=2, same_host_restarts=0, cfg=CFG, remedy="same_host") == "stop"
    assert route_triage("oom", "", exit_code=4, same_host_restarts=0, cfg=CFG, remedy="same_host") == "replace"
    assert route_triage("oom", "", exit_code=1, same_host_restarts=0, cfg=CFG, remedy="retry_forever") == "replace"


def test_a_verdicts_remedy_follows_its_state_and_evidence() -> None:
    """classify's verdict carries the remedy of the state it found."""
    v = classify("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    assert v.state == "oom" and v.remedy == Remedy.SAME_HOST
    assert set(ACTIONS) == set(STATES)
