"""A job whose wake-up is long past has lost the task that should step it: `overdue` names it, and
only it (a live chain always wakes at or before its wake-up)."""

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


class Wall(VirtualClock):
    """A clock the test moves, whose seconds are wall seconds (as production's is)."""

    def wall_seconds(self, clock_s: float) -> float:
        return clock_s


def test_only_a_wake_up_long_past_is_overdue(tmp_path: Path) -> None:
    """Within the grace a job is on time (its task may be queued); past it, it is overdue."""
    engine = make_engine(f"sqlite:///{tmp_path / 'th.db'}")
    init_db(engine)
    clock = Wall()
    Budget(engine, Ledger(engine)).set_cap("job-1", 5.0)
    svc = ProvisioningService(
        engine,
        market_for=lambda _name: SimMarket(load_trace("smoke"), clock),
        clock=clock,
        run_preflight=lambda *_: PreflightResult(None, "ssh_unreachable", "not in this test"),
        launch_spec_for=lambda _job: LaunchSpec(image="img", disk_gb=20, label="", ssh_public_key="ssh-ed25519 k"),
    )
    step = svc.start("job-1", req=Requirements(), shape=JobShape(download_gb=3.0, train_s=120.0, disk_gb=20.0))
    assert step.wake_at is not None
    clock.set(step.wake_at + 599.0)
    assert svc.overdue(grace_wall_s=600.0) == []
    clock.set(step.wake_at + 601.0)
    assert svc.overdue(grace_wall_s=600.0) == ["job-1"]
    svc.step("job-1")  # stepped again: its next wake-up lies ahead
    assert svc.overdue(grace_wall_s=600.0) == []
