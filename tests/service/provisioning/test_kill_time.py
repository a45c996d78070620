"""Each rental's kill-time comes from its job (not a fixed 6 h), reaches the instance and the reaper,
and moves later only on purpose, with a ledger event."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from app.budget import Budget
from app.db import init_db, make_engine
from app.errors import UserError
from app.ledger import Ledger
from app.market import LaunchSpec, Market, Offer, OfferQuery
from app.policy.fleet import kill_after_s
from app.policy.preflight import PreflightReport
from app.policy.provisioning import PreflightResult
from app.policy.ranking import JobShape, Requirements
from app.rentals import Rental, parse_label
from app.services.guardrails import sweep_ttl
from app.services.provisioning import ProvisioningService, Step
from providers.sim.clock import VirtualClock
from providers.sim.market import SimMarket
from providers.sim.trace import load_trace

SHAPE = JobShape(download_gb=3.0, train_s=2 * 3600.0, disk_gb=20.0)


class RecordingSim(SimMarket):
    """The simulated marketplace, remembering the launch spec each instance was created with."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__(load_trace("smoke"), clock)
        self.specs: dict[str, LaunchSpec] = {}

    def create(self, offer: Offer, spec: LaunchSpec) -> str:
        instance_id = super().create(offer, spec)
        self.specs[instance_id] = spec
        return instance_id


class Harness:
    def __init__(self, tmp: Path, *, ttl_s: float | None = None) -> None:
        self.engine = make_engine(f"sqlite:///{tmp / 'th.db'}")
        init_db(self.engine)
        self.clock = VirtualClock()
        self.market = RecordingSim(self.clock)
        Budget(self.engine, Ledger(self.engine)).set_cap("job-1", 50.0)
        self.svc = ProvisioningService(
            self.engine,
            market_for=lambda _name: self.market,
            clock=self.clock,
            run_preflight=self.preflight,
            launch_spec_for=lambda _job: LaunchSpec(image="img", disk_gb=20, label="", ssh_public_key="ssh-ed25519 k"),
            ttl_s=ttl_s,
        )

    def preflight(self, market: Market, job_id: str, instance_id: str) -> PreflightResult:
        raw = self.market.referee.preflight_report(instance_id)
        assert raw is not None
        return PreflightResult(PreflightReport.from_mapping(raw))

    def train(self, shape: JobShape = SHAPE) -> Rental:
        """Provision job-1 up to the hand-over (as the Celery shells would); its training rental."""
        step: Step = self.svc.start("job-1", req=Requirements(), shape=shape)
        for _ in range(500):
            if step.handed_over:
                break
            if step.preflight_instance:
                step = self.svc.preflight(step.job_id, step.preflight_instance)
                continue
            assert step.wake_at is not None and step.phase not in ("failed", "done"), step
            self.clock.set(max(step.wake_at, self.clock.now()))
            step = self.svc.step(step.job_id)
        rental = self.svc.rental_of(step.handed_over or "")
        assert rental is not None and rental.state == "active"
        return rental


def test_the_kill_time_is_derived_from_the_job_and_reaches_the_instance(tmp_path: Path) -> None:
    """A 2 h job's rental is killed after its derived time (not 6 h): in the row, the label and the
    instance's TUNEHARNESS_KILL_AT; the reaper stops it at that instant and not before."""
    h = Harness(tmp_path)
    rental = h.train()
    offer = h.svc.rentals.offer_of(rental.id)
    assert math.isclose(rental.kill_at - rental.created_at, kill_after_s(offer, SHAPE))
    assert rental.kill_at - rental.created_at != 6 * 3600.0
    assert h.market.specs[rental.instance_id or ""].env["TUNEHARNESS_KILL_AT"] == str(int(rental.kill_at))
    assert parse_label(rental.label) == ("job-1", rental.attempt, int(rental.kill_at))
    markets = {"sim": h.market}
    assert sweep_ttl(h.svc.rentals, markets, now=rental.kill_at - 1).stopped == []
    assert sweep_ttl(h.svc.rentals, markets, now=rental.kill_at).stopped == [rental.instance_id]


def test_a_job_that_names_its_kill_time_gets_it(tmp_path: Path) -> None:
    """needs.kill_after_hours (here 3 h) is the rental's kill-time as written."""
    h = Harness(tmp_path)
    rental = h.train(JobShape(download_gb=3.0, train_s=3600.0, disk_gb=20.0, kill_after_s=3 * 3600.0))
    assert rental.kill_at - rental.created_at == 3 * 3600.0


def test_a_fixed_ttl_and_a_standby_hold(tmp_path: Path) -> None:
    """A standby host's kill-time adds its hold to the job's; a service given a fixed ttl_s uses it."""
    h = Harness(tmp_path)
    offer = h.market.search_offers(OfferQuery())[0]
    waits = h.svc.cfg.standby_hold_s
    assert h.svc.ttl_for(SHAPE, offer, standby=True) == kill_after_s(offer, SHAPE) + waits
    (tmp_path / "fixed").mkdir()
    assert Harness(tmp_path / "fixed", ttl_s=900.0).svc.ttl_for(SHAPE, offer, standby=True) == 900.0


def test_extending_the_kill_time_is_deliberate_and_written_down(tmp_path: Path) -> None:
    """An extension moves kill_at later with one `kill_time_extended` event (old, new, reason); the
    reaper then waits for the new time. A bad amount is refused; a rental the reaper stopped can be
    extended (its paused job resumes on it)."""
    h = Harness(tmp_path)
    rental = h.train()
    old = rental.kill_at
    after = h.svc.rentals.extend_kill_time(rental.id, by_s=3600.0, reason="needs longer", now=h.clock.now())
    assert after is not None and after.kill_at == old + 3600.0
    (event,) = Ledger(h.engine).rows(kind="kill_time_extended")
    assert event.reason == "needs longer" and event.instance == rental.instance_id and event.job == "job-1"
    assert event.payload["old_kill_at"] == old and event.payload["new_kill_at"] == old + 3600.0
    markets = {"sim": h.market}
    assert sweep_ttl(h.svc.rentals, markets, now=old + 1).stopped == []
    assert sweep_ttl(h.svc.rentals, markets, now=old + 3600.0).stopped == [rental.instance_id]
    stopped = h.svc.rentals.extend_kill_time(rental.id, by_s=60.0, reason="late", now=h.clock.now())
    assert stopped is not None and stopped.state == "stopped" and stopped.kill_at == old + 3660.0
    for bad in (0.0, -60.0, math.nan, math.inf, 8 * 24 * 3600.0):
        with pytest.raises(UserError, match="Fix:"):
            h.svc.rentals.extend_kill_time(rental.id, by_s=bad, reason="x", now=h.clock.now())
    assert len(Ledger(h.engine).rows(kind="kill_time_extended")) == 2
