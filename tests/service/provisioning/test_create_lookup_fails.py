"""A create whose answer was lost keeps its intent while the vendor cannot be asked: a look-up by
label that fails (429, 5xx, an incomplete listing) proves nothing about the instance the vendor
may have rented, so the rental is not abandoned and its reservation is not released."""

from __future__ import annotations

from pathlib import Path

import pytest

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


@pytest.mark.parametrize("lookup_fault", ["listing_incomplete", "rate_limited_429", "server_error_5xx"])
def test_a_failed_lookup_after_a_lost_answer_keeps_the_intent(tmp_path: Path, lookup_fault: str) -> None:
    """Given a create the vendor accepted but whose answer was lost, when the next step's look-up by
    label fails, then the rental stays an intent with its reservation, and the step after adopts
    the instance: the vendor's instance is never one that no rental knows."""
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
    market.arm("create_timeout_after_accept")
    step = svc.start("job-1", req=Requirements(), shape=JobShape(download_gb=3.0, train_s=120.0, disk_gb=20.0))
    [rental] = svc.rentals.all(job="job-1")
    assert rental.state == "intent" and sum(market.creates_by_label.values()) == 1

    market.arm(lookup_fault, on="list")
    assert step.wake_at is not None
    clock.set(step.wake_at)
    step = svc.step("job-1")
    assert market.fired[lookup_fault] == 1
    kept = svc.rentals.get(rental.id)
    assert kept is not None and kept.state == "intent", kept
    assert svc.rentals.budget.held("job-1") == set(svc.rentals.reservations_of(rental.id))

    assert step.wake_at is not None
    clock.set(step.wake_at)
    svc.step("job-1")
    adopted = svc.rentals.get(rental.id)
    assert adopted is not None and adopted.state == "active" and adopted.instance_id is not None
    assert sum(market.creates_by_label.values()) == 1
