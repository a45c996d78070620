"""The per-job step lease (`app.services.leases`) on a real SQLite database, and what a step does
when another step of its job holds the lease for too long."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.db import init_db, make_engine
from app.ledger import Ledger
from app.market import LaunchSpec, OfferQuery
from app.policy.provisioning import MarketView, Tick, TrainerStatus, new_job
from app.policy.ranking import JobShape, Requirements
from app.services.leases import StepLeases
from app.services.provisioning import ProvisioningService, StepBusy
from providers.sim.clock import VirtualClock
from providers.sim.market import SimMarket
from providers.sim.trace import load_trace


class Wall:
    """A wall clock the test moves; `sleep` moves it too, so waiting costs no real time."""

    def __init__(self) -> None:
        self.t = 1_000.0

    def now(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def _leases(url: str, **kw: float) -> tuple[StepLeases, Wall]:
    engine = make_engine(url)
    init_db(engine)
    wall = Wall()
    return StepLeases(engine, now=wall.now, sleep=wall.sleep, **kw), wall


def test_one_holder_at_a_time_until_release_or_expiry(db_url: str) -> None:
    leases, wall = _leases(db_url, ttl_s=60.0)
    a = leases.try_acquire("job-1")
    assert a is not None and leases.holder("job-1") == a
    assert leases.try_acquire("job-1") is None
    assert leases.try_acquire("job-2") is not None  # other jobs are not held up
    leases.release("job-1", a)
    b = leases.try_acquire("job-1")
    assert b is not None and b != a
    wall.t += 61.0  # b's holder died inside its step: the lease expires
    c = leases.try_acquire("job-1")
    assert c is not None
    leases.release("job-1", b)  # the late holder's release must not free the new holder's lease
    assert leases.holder("job-1") == c


def test_held_waits_then_gives_up_and_is_reentrant_in_one_thread(db_url: str) -> None:
    leases, wall = _leases(db_url, ttl_s=600.0, wait_s=5.0)
    other = leases.try_acquire("job-1")
    assert other is not None
    start = wall.t
    with leases.held("job-1") as held:
        assert held is False
    assert wall.t - start >= 5.0
    leases.release("job-1", other)
    with leases.held("job-1") as held:
        assert held is True
        with leases.held("job-1") as again:  # the same thread: no wait for itself
            assert again is True
        assert leases.holder("job-1") is not None
    assert leases.holder("job-1") is None


def test_eight_threads_hold_one_lease_one_at_a_time(db_url: str) -> None:
    """Real threads and real time: each gets the lease once, and never two at once."""
    import threading

    engine = make_engine(db_url)
    init_db(engine)
    leases = StepLeases(engine, poll_s=0.005)
    inside, most, done = [0], [0], []
    guard = threading.Lock()

    all_trying = threading.Barrier(8, timeout=10)  # every thread asks for the lease at the same moment

    def step(i: int) -> None:
        all_trying.wait()
        with leases.held("job-1") as held:
            assert held
            with guard:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
            with guard:
                inside[0] -= 1
            done.append(i)

    threads = [threading.Thread(target=step, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(done) == list(range(8)) and most[0] == 1
    assert leases.holder("job-1") is None


def test_a_step_that_cannot_get_its_lease_applies_nothing_and_comes_back(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'th.db'}")
    init_db(engine)
    clock = VirtualClock()
    market = SimMarket(load_trace("smoke"), clock)
    svc = ProvisioningService(
        engine,
        market_for=lambda _name: market,
        clock=clock,
        run_preflight=lambda *a: None,  # type: ignore[arg-type,return-value]
        launch_spec_for=lambda _job: LaunchSpec(image="img", disk_gb=20, label="", ssh_public_key="ssh-ed25519 k"),
    )
    svc.leases.wait_s = 0.05
    job = new_job("job-1", req=Requirements(), shape=JobShape(download_gb=3.0, train_s=120.0, disk_gb=20.0))
    assert svc.save([(job, 0, clock.now())])
    assert svc.leases.try_acquire("job-1") is not None  # a stuck step of the same job
    step = svc._run(job, 1, Tick(MarketView(offers=tuple(market.search_offers(OfferQuery())))))
    assert step.phase == "queued" and step.wake_at is not None and step.wake_at > clock.now()
    assert market.referee.instance_ids() == []
    assert [r.kind for r in Ledger(engine).rows(job="job-1")] == ["step_busy"]
    with pytest.raises(StepBusy, match="another provisioning step"):
        svc.observe(
            "job-1",
            TrainerStatus(
                instance=None,
                phase=None,
                work_s=0.0,
                checkpoint_work_s=0.0,  # type: ignore[arg-type]
                heartbeat_at=clock.now(),
            ),
        )
    state = svc.state("job-1")
    assert state is not None and state[1] == 1  # nothing saved


def test_a_slow_step_keeps_its_lease_past_the_ttl(db_url: str) -> None:
    """A step that runs three times longer than the lease's ttl (a provider call retrying) still holds
    it the whole time: no second step gets in; once it ends, the lease is free at once."""
    import threading

    from support.services import wait_until

    engine = make_engine(db_url)
    init_db(engine)
    leases = StepLeases(engine, ttl_s=0.6)
    inside, finish = threading.Event(), threading.Event()

    def slow_step() -> None:
        with leases.held("job-1") as held:
            assert held
            inside.set()
            finish.wait(10)  # the step's provider call, still running

    t = threading.Thread(target=slow_step)
    t.start()
    assert inside.wait(10)
    # for three times the ttl, no second step gets the lease
    assert not wait_until(lambda: leases.try_acquire("job-1") is not None, timeout_s=3 * leases.ttl_s)
    finish.set()
    t.join(10)
    assert leases.try_acquire("job-1") is not None
