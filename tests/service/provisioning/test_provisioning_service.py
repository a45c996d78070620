"""The real-time provisioning handler, driven step by step against SimMarket on a virtual clock."""

from __future__ import annotations

from pathlib import Path

from app.budget import Budget
from app.db import init_db, make_engine
from app.ledger import Ledger
from app.market import LaunchSpec, Market, OfferQuery
from app.policy.codec import dump_job, load_job
from app.policy.preflight import PreflightReport
from app.policy.provisioning import PreflightResult
from app.policy.ranking import JobShape, Requirements
from app.policy.reputation import is_quarantined
from app.services.provisioning import ProvisioningService, Step
from providers.sim.clock import VirtualClock
from providers.sim.market import SimMarket
from providers.sim.trace import load_trace

SHAPE = JobShape(download_gb=3.0, train_s=120.0, disk_gb=20.0)


class Harness:
    """The smoke trace (frozen, fatal, stale driver, healthy) behind the handler; preflights from truth."""

    def __init__(self, tmp: Path) -> None:
        self.engine = make_engine(f"sqlite:///{tmp / 'th.db'}")
        init_db(self.engine)
        self.clock = VirtualClock()
        self.market = SimMarket(load_trace("smoke"), self.clock)
        Budget(self.engine, Ledger(self.engine)).set_cap("job-1", 5.0)
        self.svc = ProvisioningService(
            self.engine,
            market_for=lambda _name: self.market,
            clock=self.clock,
            run_preflight=self.preflight,
            launch_spec_for=lambda _job: LaunchSpec(image="img", disk_gb=20, label="", ssh_public_key="ssh-ed25519 k"),
        )

    def preflight(self, market: Market, job_id: str, instance_id: str) -> PreflightResult:
        self.clock.advance(15.0)
        raw = self.market.referee.preflight_report(instance_id)
        return (
            PreflightResult(None, "ssh_unreachable", "no SSH")
            if raw is None
            else PreflightResult(PreflightReport.from_mapping(raw))
        )

    def drive(self, step: Step, *, limit: int = 500) -> Step:
        """What the Celery shells do: sleep until wake_at (virtually), run the preflight task, repeat."""
        for _ in range(limit):
            if step.handed_over or step.phase in ("failed", "done"):
                return step
            if step.preflight_instance:
                step = self.svc.preflight(step.job_id, step.preflight_instance)
                continue
            assert step.wake_at is not None, step
            if step.wake_at > self.clock.now():
                self.clock.set(step.wake_at)
            step = self.svc.step(step.job_id)
        raise AssertionError("did not settle")


def test_three_duds_are_caught_and_the_job_lands_on_the_healthy_host(tmp_path: Path) -> None:
    """Frozen pull, fatal pull and stale driver are destroyed and quarantined; training goes to m-good."""
    h = Harness(tmp_path)
    step = h.drive(h.svc.start("job-1", req=Requirements(), shape=SHAPE))
    assert step.handed_over is not None and step.phase == "training"
    assert h.market.status(step.handed_over).machine_id == "m-good"
    for machine in ("m-frozen", "m-fatal", "m-stale"):
        view = h.svc.reputation.get("sim", machine)
        assert view is not None and is_quarantined(view.record, now=h.clock.now())
    rows = Ledger(h.engine).rows()
    destroyed = {r.machine: r.payload for r in rows if r.kind == "instance_destroyed"}
    assert set(destroyed) == {"m-frozen", "m-fatal", "m-stale"}
    assert all(p.get("by") == "automation" and p.get("evidence") for p in destroyed.values())
    failed = {r.machine: r.reason for r in rows if r.kind == "host_failed"}
    assert failed == {"m-frozen": "boot_frozen", "m-fatal": "boot_fatal", "m-stale": "no_compute"}
    kinds = [r.kind for r in rows]
    assert kinds.count("instance_created") == 4 and "preflight_passed" in kinds and "training_handed_over" in kinds
    rental = h.svc.rentals.all(job="job-1")[-1]
    assert rental.held_work and rental.state == "active"


def test_a_redelivered_step_changes_nothing_twice(tmp_path: Path) -> None:
    """The same queued step run twice from the same state (a redelivered task) creates one instance:
    the second re-reads the state under the job's step lease, finds it moved on, and applies nothing."""
    from app.policy.provisioning import MarketView, Tick, new_job

    h = Harness(tmp_path)
    job = new_job("job-1", req=Requirements(), shape=SHAPE)
    assert h.svc.save([(job, 0, h.clock.now())])
    view = MarketView(offers=tuple(h.market.search_offers(OfferQuery())))
    first = h.svc._run(job, 1, Tick(view))
    second = h.svc._run(job, 1, Tick(view))
    assert first.phase == second.phase == "booting"
    assert len(h.market.referee.instance_ids()) == 1
    kinds = [r.kind for r in Ledger(h.engine).rows(job="job-1")]
    assert kinds.count("instance_created") == 1 and "provisioning_conflict" not in kinds


def test_two_steps_of_a_queued_job_at_once_rent_one_host(tmp_path: Path) -> None:
    """Two tasks step the same queued job at the same moment (a boot watcher and a redelivery):
    the second waits on the job's step lease while the first is inside the provider's create, then
    finds the job booting and applies nothing. One rental, one instance, no conflict to clean up."""
    import threading

    from app.policy.provisioning import new_job

    h = Harness(tmp_path)
    assert h.svc.save([(new_job("job-1", req=Requirements(), shape=SHAPE), 0, h.clock.now())])
    inside, go_on = threading.Event(), threading.Event()
    real_create = h.market.create
    calls: list[str] = []

    def slow_create(offer: object, spec: LaunchSpec) -> str:
        calls.append(threading.current_thread().name)
        if len(calls) == 1:
            inside.set()
            assert go_on.wait(10)
        return real_create(offer, spec)  # type: ignore[arg-type]

    h.market.create = slow_create  # type: ignore[method-assign]
    steps: dict[str, Step] = {}
    first = threading.Thread(target=lambda: steps.__setitem__("first", h.svc.step("job-1")), name="first")
    second = threading.Thread(target=lambda: steps.__setitem__("second", h.svc.step("job-1")), name="second")
    first.start()
    assert inside.wait(10)
    second.start()
    second.join(0.5)
    assert second.is_alive() and h.svc.leases.holder("job-1") is not None  # waiting on the lease
    go_on.set()
    first.join(10)
    second.join(10)
    assert calls == ["first"]
    assert steps["first"].phase == steps["second"].phase == "booting"
    assert len(h.market.referee.instance_ids()) == 1
    kinds = [r.kind for r in Ledger(h.engine).rows(job="job-1")]
    assert kinds.count("instance_created") == 1 and "provisioning_conflict" not in kinds
    assert h.svc.leases.holder("job-1") is None


def test_a_job_whose_own_cap_cannot_pay_one_attempt_ends_at_once_naming_it(tmp_path: Path) -> None:
    """Nothing of the job runs and its cap cannot cover one attempt: it fails at once, never
    reaching the provider, instead of waiting hours for money that will not come."""
    h = Harness(tmp_path)
    Budget(h.engine, Ledger(h.engine)).set_cap("job-2", 0.0)
    step = h.svc.start("job-2", req=Requirements(), shape=SHAPE)
    assert step.phase == "failed" and h.market.referee.instance_ids() == []
    assert "budget cap reached: budget of job-2" in (step.failure or "")
    assert any(r.kind == "provisioning_failed" for r in Ledger(h.engine).rows(job="job-2"))


def test_a_create_a_period_cap_refuses_waits_for_the_next_period(tmp_path: Path) -> None:
    """The day's cap is spent: the reservation refuses the create (BudgetRefused) and the job looks
    again later; a day cap's room comes back, so the job does not end."""
    h = Harness(tmp_path)
    budget = Budget(h.engine, Ledger(h.engine))
    budget.set_cap("job-2", 5.0)
    budget.set_cap("day", 0.0)
    step = h.svc.start("job-2", req=Requirements(), shape=SHAPE)
    assert step.phase == "queued" and h.market.referee.instance_ids() == []
    assert step.wake_at == h.clock.now() + h.svc.cfg.queue_retry_s
    refused = [r for r in Ledger(h.engine).rows(job="job-2") if r.kind == "create_refused"]
    assert refused and "'day'" in refused[0].reason


def test_a_job_without_any_cap_is_refused_with_the_fix(tmp_path: Path) -> None:
    """No cap for the job and no default cap: nothing is rented and the refusal says what to do."""
    h = Harness(tmp_path)
    step = h.svc.start("job-9", req=Requirements(), shape=SHAPE)
    assert step.phase == "queued" and h.market.referee.instance_ids() == []
    refused = [r for r in Ledger(h.engine).rows(job="job-9") if r.kind == "create_refused"]
    assert refused and "budget set default" in refused[0].reason


def test_state_round_trips_through_json(tmp_path: Path) -> None:
    """The policy state survives the trip through the database between tasks."""
    h = Harness(tmp_path)
    h.svc.start("job-1", req=Requirements(gpu_names=("RTX 3090",)), shape=SHAPE)
    loaded = h.svc.state("job-1")
    assert loaded is not None
    job, version = loaded
    assert version == 2 and job.phase == "booting" and load_job(dump_job(job)) == job
