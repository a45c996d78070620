"""A provider the job allows that cannot be used (its key refused, its key not set) is skipped with a
warning while another remains, and blocks the job's provisioning when none does."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.alerts import InMemoryNotifier
from app.blocking import ProvidersUnusable
from app.budget import Budget
from app.db import init_db, make_engine
from app.errors import SettingsError
from app.ledger import Ledger
from app.market import LaunchSpec, Market
from app.policy.provisioning import PreflightResult
from app.policy.ranking import JobShape, Requirements
from app.services.provisioning import ProvisioningService
from providers.fakes import FakeVast, sample_vast_offers
from providers.sim.clock import VirtualClock
from providers.sim.market import SimMarket
from providers.sim.trace import load_trace
from providers.vast import VastMarket

SHAPE = JobShape(download_gb=3.0, train_s=120.0, disk_gb=20.0)
SECRET = "refused-key-0123456789"


def _service(tmp: Path, markets: dict[str, Market | None], notifier: InMemoryNotifier) -> ProvisioningService:
    engine = make_engine(f"sqlite:///{tmp / 'th.db'}")
    init_db(engine)
    Budget(engine, Ledger(engine)).set_cap("job-1", 5.0)

    def market_for(name: str) -> Market:
        market = markets[name]
        if market is None:
            raise SettingsError(f"{name.upper()}_API_KEY", "is not set", f"export {name.upper()}_API_KEY=<key>")
        return market

    def no_preflight(market: Market, job_id: str, instance_id: str) -> PreflightResult:
        raise AssertionError("the test stops before any preflight")

    return ProvisioningService(
        engine,
        market_for=market_for,
        clock=VirtualClock(),
        run_preflight=no_preflight,
        launch_spec_for=lambda _job: LaunchSpec(image="img", disk_gb=20, label="", ssh_public_key="ssh-ed25519 k"),
        notifier=notifier,
    )


def test_a_refused_and_a_missing_key_are_skipped_and_the_job_rents_on_sim(tmp_path: Path) -> None:
    """Vast refuses the key (401 from the fake), RunPod has none: both skipped on the ledger and in an
    alert (no key in either), and the job rents on the simulated marketplace."""
    notifier = InMemoryNotifier()
    with FakeVast(api_key="the-right-key-987654", offers=sample_vast_offers()) as vast:
        sim = SimMarket(load_trace("smoke"), VirtualClock())
        markets: dict[str, Market | None] = {
            "vast": VastMarket(api_key=SECRET, api_url=vast.url),
            "runpod": None,
            "sim": sim,
        }
        svc = _service(tmp_path, markets, notifier)
        step = svc.start("job-1", req=Requirements(providers=("vast", "runpod", "sim")), shape=SHAPE)
    assert step.phase == "booting"
    rows = Ledger(svc.engine).rows(job="job-1")
    skipped = {r.provider: r.reason for r in rows if r.kind == "provider_skipped"}
    assert set(skipped) == {"vast", "runpod"}
    assert "refused" in skipped["vast"] and "RUNPOD_API_KEY: is not set" in skipped["runpod"]
    assert [r.provider for r in rows if r.kind == "instance_created"] == ["sim"]
    assert sorted(a.summary.split()[0] for a in notifier.alerts if a.kind == "provider_skipped") == ["runpod", "vast"]
    assert SECRET not in repr(rows) + repr(notifier.alerts)


def test_with_no_usable_provider_left_the_step_raises_the_reason_and_the_fix(tmp_path: Path) -> None:
    """Every provider the job allows unusable: `ProvidersUnusable` (an operator error the worker turns
    into a blocked job) naming each one, and nothing is rented."""
    svc = _service(tmp_path, {"vast": None, "runpod": None}, InMemoryNotifier())
    with pytest.raises(ProvidersUnusable) as caught:
        svc.start("job-1", req=Requirements(providers=("vast", "runpod")), shape=SHAPE)
    assert set(caught.value.problems) == {"vast", "runpod"}
    assert "VAST_API_KEY" in caught.value.reason and "resume" in caught.value.fix
    assert not [r for r in Ledger(svc.engine).rows(job="job-1") if r.kind == "instance_created"]
