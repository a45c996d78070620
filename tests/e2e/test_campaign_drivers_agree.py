"""One trace, two drivers: the campaign simulator in virtual time and the real-time fleet (Redis, a
Celery worker and beat, `sim serve` with a real sshd per host, the real trainer on the CPU, the
database) run the same policy on the `proof` trace and get the same receipt from the referee."""

from __future__ import annotations

from pathlib import Path

import pytest

from providers.sim.campaign import run_campaign_file
from providers.sim.campaign.realtime import run_campaign_realtime

SAME = ("creates", "dead_hosts", "good_hosts_destroyed", "jobs_completed", "jobs_failed")
CLOSE = ("dead_host_cost_usd", "total_cost_usd")


@pytest.mark.slow
@pytest.mark.solo
def test_the_proof_trace_gives_one_receipt_through_both_drivers(tmp_path: Path) -> None:
    """A frozen pull, a stale driver, a host vanishing mid-training and two jobs: the same counts,
    recoveries included, and dead-host and total cost within 10% of each other. The real-time run
    starts its own redis-server, worker, beat and sim server in `tmp_path`."""
    # both supervisors poll every 10 s: a job's end is seen at most 10 s apart in the two drivers
    virtual = run_campaign_file("proof", monitor_s=10.0).receipt
    real = run_campaign_realtime("proof", scale=3.0, workdir=tmp_path / "celery", monitor_s=10.0).receipt
    assert virtual["unfinished_jobs"] == [] and real["unfinished_jobs"] == [], real["unfinished_jobs"]
    for key in SAME:
        assert real[key] == virtual[key], (key, virtual[key], real[key])
    assert len(real["recoveries"]) == len(virtual["recoveries"]) == 1
    for key in CLOSE:
        assert real[key] == pytest.approx(virtual[key], rel=0.10), (key, virtual[key], real[key])
    assert set(real) == set(virtual)  # the same receipt, field for field
