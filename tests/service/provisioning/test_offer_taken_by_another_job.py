"""Two jobs provisioning at once (a gated job's seed runs): an offer taken by the other job costs
one try, not the job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.budget import Budget
from app.db import init_db, make_engine
from app.ledger import Ledger
from app.market import LaunchSpec, Offer, OfferQuery
from app.policy.provisioning import PreflightResult
from app.policy.ranking import JobShape, Requirements
from app.services.provisioning import ProvisioningService
from providers.sim.clock import VirtualClock
from providers.sim.market import SimMarket
from providers.sim.trace import load_trace

SHAPE = JobShape(download_gb=3.0, train_s=120.0, disk_gb=20.0)


class StaleSearchOnce:
    """The marketplace as a job saw it a moment ago: the first search returns a snapshot taken before
    another job rented from it; everything else (and later searches) is the live market."""

    def __init__(self, market: SimMarket, snapshot: list[Offer]) -> None:
        self.market, self.snapshot = market, snapshot

    def search_offers(self, query: OfferQuery) -> list[Offer]:
        if self.snapshot:
            offers, self.snapshot = self.snapshot, []
            return offers
        return list(self.market.search_offers(query))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.market, name)


def test_an_offer_taken_by_another_job_is_skipped_and_the_next_try_creates(tmp_path: Path) -> None:
    """Given job-2 ranking offers that job-1 has just rented, when its create finds the offer gone, then its
    next try rents another offer under a new attempt number (the abandoned one is not reused)."""
    engine = make_engine(f"sqlite:///{tmp_path / 'th.db'}")
    init_db(engine)
    clock = VirtualClock()
    market = SimMarket(load_trace("smoke"), clock)
    budget = Budget(engine, Ledger(engine))
    for job in ("job-1", "job-2"):
        budget.set_cap(job, 5.0)
    snapshot = list(market.search_offers(OfferQuery()))
    stale = StaleSearchOnce(market, snapshot)

    def svc(m: Any) -> ProvisioningService:
        return ProvisioningService(
            engine,
            market_for=lambda _name: m,
            clock=clock,
            run_preflight=lambda *_: PreflightResult(None, "ssh_unreachable", "not in this test"),
            launch_spec_for=lambda _job: LaunchSpec(image="img", disk_gb=20, label="", ssh_public_key="ssh-ed25519 k"),
        )

    first = svc(market).start("job-1", req=Requirements(), shape=SHAPE)
    assert first.phase == "booting"
    taken = svc(market).rentals.all(job="job-1")[0].offer_id

    tried = svc(stale).start("job-2", req=Requirements(), shape=SHAPE)
    second = svc(stale).step("job-2") if tried.phase == "queued" else tried

    assert second.phase == "booting", second
    rentals = svc(market).rentals.all(job="job-2")
    assert [r.state for r in rentals] == ["abandoned", "active"]
    assert rentals[0].offer_id == taken and rentals[1].offer_id != taken
    assert [r.attempt for r in rentals] == [1, 2]
