"""Supervisor routes the main tests leave undriven: triage's remedy as a constant, a job given up between hosts."""

from __future__ import annotations

from app.policy.provisioning import GaveUp, new_job
from app.policy.ranking import JobShape, Requirements
from app.policy.supervision import Remedy, SupervisorConfig, route_triage, stop_job

CFG = SupervisorConfig()


def route(remedy: str, *, restarts: int = 0) -> str:
    # The wording says "stop the job": a remedy given wins over the wording.
    return route_triage("oom", "stop the job", exit_code=1, same_host_restarts=restarts, cfg=CFG, remedy=remedy)


def test_triage_remedy_routes_the_dead_trainer() -> None:
    """Each remedy maps to its route whatever the action's wording says."""
    assert route(Remedy.SAME_HOST) == "same_host"
    assert route(Remedy.CONTINUE) == "same_host"
    assert route(Remedy.REPLACE_HOST) == "replace"
    assert route(Remedy.STOP_JOB) == "stop"


def test_a_same_host_remedy_is_replaced_once_the_host_used_its_restarts() -> None:
    """A host that already restarted the trainer `max_same_host_restarts` times is replaced."""
    assert route(Remedy.SAME_HOST, restarts=CFG.max_same_host_restarts - 1) == "same_host"
    assert route(Remedy.SAME_HOST, restarts=CFG.max_same_host_restarts) == "replace"


def test_an_unknown_remedy_goes_to_another_machine() -> None:
    """A remedy this table does not know is routed to a replacement host, never retried in place."""
    assert route("reboot_the_datacenter") == "replace"


def test_a_job_given_up_without_a_host_stops_nothing() -> None:
    """Giving up a job between hosts stops and records nothing; it only fails the job and tells the operator."""
    job = new_job("job-1", req=Requirements(), shape=JobShape(download_gb=1.0, train_s=60.0, disk_gb=10.0))
    failed, acts = stop_job(job, reason="diverged", evidence="loss nan")
    assert failed.phase == "failed" and failed.failure == "diverged: loss nan"
    assert acts == [GaveUp("job-1", "diverged: loss nan")]
