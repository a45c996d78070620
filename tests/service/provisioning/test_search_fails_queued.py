"""A queued job whose offer search fails (429, 5xx) waits and looks again: it is not ended as
"budget cap reached" because an empty search priced no attempt."""

from __future__ import annotations

from pathlib import Path

from app.budget import Budget
from app.db import init_db, make_engine
from app.ledger import Ledger
from app.market import LaunchSpec
from app.policy.provisioning import PreflightResult
from app.policy.ranking import JobShape, Requirements
from app.services.provisioning import ProvisioningService
from providers.sim.clock import VirtualClock
from providers.sim.market import SimMarket
from providers.sim.trace import load_trace
from support.nemesis import FaultyMarket


def test_a_failed_search_does_not_end_the_job_at_its_cap(tmp_path: Path) -> None:
    """Given a job with $5 left and nothing rented, when its first search answers 429, then it stays
    queued with a wake-up, and the next step rents."""
    engine = make_engine(f"sqlite:///{tmp_path / 'th.db'}")
    init_db(engine)
    clock = VirtualClock()
    Budget(engine, Ledger(engine)).set_cap("job-1", 5.0)
    market = FaultyMarket(SimMarket(load_trace("smoke"), clock))
    svc = ProvisioningService(
        engine,
        market_for=lambda _name: market,
        clock=clock,
        run_preflight=lambda *_: PreflightResult(None, "ssh_unreachable", "not in this test"),
        launch_spec_for=lambda _job: LaunchSpec(image="img", disk_gb=20, label="", ssh_public_key="ssh-ed25519 k"),
    )
    market.arm("rate_limited_429", on="search")
    step = svc.start("job-1", req=Requirements(), shape=JobShape(download_gb=3.0, train_s=120.0, disk_gb=20.0))
    assert market.fired["rate_limited_429"] == 1
    assert step.phase == "queued" and step.wake_at is not None, step
    clock.set(step.wake_at)
    assert svc.step("job-1").phase == "booting"
