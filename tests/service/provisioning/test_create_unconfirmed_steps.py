"""The provisioning service keeps an unconfirmed create's intent: the next step adopts the instance
the vendor did rent, or, after `create_confirm_s` with nothing listed, abandons it and rents anew."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.budget import Budget
from app.db import init_db, make_engine
from app.ledger import Ledger
from app.market import CreateUnconfirmed, LaunchSpec, Offer
from app.policy.provisioning import PreflightResult
from app.policy.ranking import JobShape, Requirements
from app.services.provisioning import ProvisioningService
from providers.sim.clock import VirtualClock
from providers.sim.market import SimMarket
from providers.sim.trace import load_trace

SHAPE = JobShape(download_gb=3.0, train_s=120.0, disk_gb=20.0)


class LostAnswers:
    """The marketplace, except that the first create's answer is lost: `acted` says whether the vendor
    rented it anyway; `hidden` hides what the lost create rented from that many listings."""

    def __init__(self, market: SimMarket, *, acted: bool, hidden: int = 0) -> None:
        self.market, self.acted, self.hidden = market, acted, hidden
        self.lost: str | None = None
        self.creates = 0

    def create(self, offer: Offer, spec: LaunchSpec) -> str:
        self.creates += 1
        if self.creates == 1:
            if self.acted:
                self.lost = self.market.create(offer, spec)
            raise CreateUnconfirmed("PUT /asks/ timed out (the vendor may have acted on it)", provider="sim")
        return self.market.create(offer, spec)

    def list_instances(self, label_prefix: str = "") -> list[Any]:
        found = self.market.list_instances(label_prefix)
        if self.hidden > 0:
            self.hidden -= 1
            return [i for i in found if i.instance_id != self.lost]
        return found

    def __getattr__(self, name: str) -> Any:
        return getattr(self.market, name)


def _service(tmp_path: Path, market: Any, clock: VirtualClock) -> ProvisioningService:
    engine = make_engine(f"sqlite:///{tmp_path / 'th.db'}")
    init_db(engine)
    Budget(engine, Ledger(engine)).set_cap("job-1", 5.0)
    return ProvisioningService(
        engine,
        market_for=lambda _name: market,
        clock=clock,
        run_preflight=lambda *_: PreflightResult(None, "ssh_unreachable", "not in this test"),
        launch_spec_for=lambda _job: LaunchSpec(image="img", disk_gb=20, label="", ssh_public_key="ssh-ed25519 k"),
    )


def test_the_next_step_adopts_what_the_lost_create_rented(tmp_path: Path) -> None:
    """Given a create answered by a timeout after the vendor rented, when the job steps on, then it
    boots on that very instance: one rental, one vendor create, the reservation never released."""
    clock = VirtualClock()
    market = LostAnswers(SimMarket(load_trace("smoke"), clock), acted=True, hidden=2)
    svc = _service(tmp_path, market, clock)
    step = svc.start("job-1", req=Requirements(), shape=SHAPE)
    assert step.phase == "queued" and step.wake_at == clock.now() + svc.cfg.create_confirm_poll_s
    (intent,) = svc.rentals.all(job="job-1")
    assert intent.state == "intent" and set(svc.rentals.reservations_of(intent.id)) <= svc.rentals.budget.held("job-1")
    assert [e.kind for e in svc.ledger.rows(kind="create_unconfirmed")] == ["create_unconfirmed"]
    clock.advance(svc.cfg.create_confirm_poll_s)
    step = svc.step("job-1")  # still hidden from the listing: wait again, create nothing
    assert step.phase == "queued" and market.creates == 1
    clock.advance(svc.cfg.create_confirm_poll_s)
    assert svc.step("job-1").phase == "booting"
    loaded = svc.state("job-1")
    assert loaded is not None and loaded[0].attempt is not None and loaded[0].attempt.instance_id == market.lost
    assert [r.state for r in svc.rentals.all(job="job-1")] == ["active"] and market.creates == 1


def test_a_create_never_listed_is_abandoned_after_the_window(tmp_path: Path) -> None:
    """Given a lost answer and no instance ever listed under the label, when `create_confirm_s` has
    passed, then that intent is abandoned (reservation released) and the job rents under a new attempt."""
    clock = VirtualClock()
    market = LostAnswers(SimMarket(load_trace("smoke"), clock), acted=False)
    svc = _service(tmp_path, market, clock)
    assert svc.start("job-1", req=Requirements(), shape=SHAPE).phase == "queued"
    clock.advance(svc.cfg.create_confirm_s)
    step = svc.step("job-1")
    if step.phase == "queued":  # the abandon step; the next one rents
        step = svc.step("job-1")
    assert step.phase == "booting"
    rentals = svc.rentals.all(job="job-1")
    assert [(r.attempt, r.state) for r in rentals] == [(1, "abandoned"), (2, "active")]
    held = svc.rentals.budget.held("job-1")
    assert not set(svc.rentals.reservations_of(rentals[0].id)) & held and market.creates == 2
