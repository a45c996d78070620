"""Held verified hosts, warm standby and hedged recovery on the real-time path: the provisioning
handler driven against SimMarket on a virtual clock, the way the Celery shells drive it."""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

from app.budget import Budget
from app.db import init_db, make_engine
from app.ledger import Ledger
from app.market import Instance, LaunchSpec, Market
from app.policy.preflight import PreflightReport
from app.policy.provisioning import PreflightResult, Tick, TrainerStatus, new_job
from app.policy.ranking import JobShape, Requirements
from app.services.guardrails import sweep_idle, sweep_reconcile, sweep_ttl
from app.services.provisioning import ProvisioningService, Step
from app.services.receipts import build_receipt
from providers.sim.clock import VirtualClock
from providers.sim.market import SimMarket
from providers.sim.trace import load_trace

SHAPE = JobShape(download_gb=3.0, train_s=120.0, disk_gb=20.0)
OFFER = {"gpu_name": "RTX 3090", "num_gpus": 1, "gpu_ram_gb": 24, "inet_down_mbps": 800, "reliability": 0.995}


def _trace(path: Path, *, slow: tuple[str, ...] = ()) -> Path:
    """Seven healthy RTX 3090s (m-0 cheapest; `slow` ones pull at 30 Mbit/s whatever they advertise)
    and one RTX 4090."""
    hosts: list[dict[str, Any]] = []
    for i in range(7):
        truth: dict[str, Any] = {"pull_mbps": 30} if f"m-{i}" in slow else {}
        hosts.append({"machine_id": f"m-{i}", "offer": {**OFFER, "dph": round(0.10 + 0.01 * i, 2)}, "truth": truth})
    hosts.append({"machine_id": "m-4090", "offer": {**OFFER, "gpu_name": "RTX 4090", "dph": 0.4}, "truth": {}})
    path.write_text(
        json.dumps(
            {
                "format": "tuneharness-market-trace/1",
                "name": "held",
                "workload": {"image_gb": 2, "model_gb": 1},
                "hosts": hosts,
            }
        )
    )
    return path


class Fleet:
    """The handler plus what the Celery shells do: each job's next wake-up, preflights at once,
    standby jobs a step started, other jobs a step moved."""

    def __init__(self, tmp: Path, *, slow: tuple[str, ...] = ()) -> None:
        self.engine = make_engine(f"sqlite:///{tmp / 'th.db'}")
        init_db(self.engine)
        self.clock = VirtualClock()
        self.market = SimMarket(load_trace(_trace(tmp / "trace.json", slow=slow)), self.clock)
        budget = Budget(self.engine, Ledger(self.engine))
        for job in ("job-a", "job-b", "job-c"):
            budget.set_cap(job, 5.0)
        self.images: dict[str, str] = {}
        self.preflights: list[tuple[str, str]] = []  # (key job, instance)
        self.svc = ProvisioningService(
            self.engine,
            market_for=lambda _name: self.market,
            clock=self.clock,
            run_preflight=self.preflight,
            launch_spec_for=lambda job: LaunchSpec(
                image=self.images.get(job, "img"), disk_gb=20, label="", ssh_public_key=f"ssh-ed25519 {job}"
            ),
        )
        self.pending: dict[str, tuple[float, str | None]] = {}  # job -> (when, preflight instance)
        self.handed: dict[str, str] = {}

    def preflight(self, market: Market, job_id: str, instance_id: str) -> PreflightResult:
        self.preflights.append((job_id, instance_id))
        raw = self.market.referee.preflight_report(instance_id)
        return (
            PreflightResult(None, "ssh_unreachable", "no SSH")
            if raw is None
            else PreflightResult(PreflightReport.from_mapping(raw))
        )

    def schedule(self, step: Step) -> Step:
        now = self.clock.now()
        for sid in step.spawned:
            self.pending[sid] = (now, None)
        for other in step.also:
            self.schedule(other)
        if step.preflight_instance is not None:
            self.pending[step.job_id] = (now, step.preflight_instance)
        elif step.wake_at is not None and step.handed_over is None:
            self.pending[step.job_id] = (step.wake_at, None)
        else:
            self.pending.pop(step.job_id, None)
        if step.handed_over is not None:
            self.handed[step.job_id] = step.handed_over
        return step

    def run(self, until: Any, *, limit: int = 3000) -> None:
        for _ in range(limit):
            if until():
                return
            if not self.pending:
                raise AssertionError("nothing left to run")
            job_id, (at, inst) = min(self.pending.items(), key=lambda kv: (kv[1][0], kv[0]))
            del self.pending[job_id]
            self.clock.set(max(self.clock.now(), at))
            self.schedule(self.svc.preflight(job_id, inst) if inst else self.svc.step(job_id))
        raise AssertionError("did not settle")

    def start(self, job_id: str, *, req: Requirements | None = None, standby_hosts: int = 0) -> Step:
        return self.schedule(
            self.svc.start(job_id, req=req or Requirements(), shape=SHAPE, standby_hosts=standby_hosts)
        )

    def train(self, job_id: str, **kw: Any) -> str:
        """Start the job and run the fleet until it trains; its instance."""
        self.start(job_id, **kw)
        self.run(lambda: job_id in self.handed)
        return self.handed[job_id]

    def status(self, instance_id: str, phase: Any) -> TrainerStatus:
        return TrainerStatus(
            instance=self.market.status(instance_id),
            phase=phase,
            work_s=120.0,
            checkpoint_work_s=120.0 if phase == "finished" else 0.0,
            heartbeat_at=self.clock.now(),
        )

    def finish(self, job_id: str) -> Step:
        return self.schedule(self.svc.observe(job_id, self.status(self.handed.pop(job_id), "finished")))

    def lose(self, job_id: str) -> Step:
        """The job's host vanishes; the supervisor reports it (as `_lost` does)."""
        inst = self.handed.pop(job_id)
        self.market.destroy(inst)
        return self.schedule(self.svc.observe(job_id, self.status(inst, None)))

    def recover_with_hedges(self, job_id: str) -> list[Any]:
        """Train the job, lose its host, run until it trains again and every standby job it
        started has ended; its hosts held then (the hedges that lost the race)."""
        self.train(job_id)
        self.lose(job_id)
        self.run(lambda: job_id in self.handed)
        self.run(lambda: self.standby_jobs_ended(job_id))
        return self.svc.pool.held(owner=job_id)

    def standby_jobs_ended(self, owner: str) -> bool:
        """Every standby job of `owner` is done or failed."""
        return all(
            s[0].phase in ("done", "failed")
            for j in self.svc.pool.standby_jobs(owner)
            if (s := self.svc.state(j.job_id)) is not None
        )

    def rows(self, job: str | None = None, kind: str | None = None) -> list[Any]:
        return list(Ledger(self.engine).rows(job=job, kind=kind))

    def rental(self, instance_id: str) -> Any:
        r = self.svc.rentals.by_instance("sim", instance_id)
        assert r is not None
        return r


def test_a_finished_jobs_host_is_held_and_the_next_compatible_job_adopts_it(tmp_path: Path) -> None:
    """Given job-a finished on a verified host, when job-b (same needs) starts, then it trains on
    that host at once: no create, no preflight; hold and adopt are ledger events."""
    f = Fleet(tmp_path)
    inst = f.train("job-a")
    f.finish("job-a")
    held = f.svc.pool.held()
    assert [(h.instance_id, h.standby, h.held_work, h.owner) for h in held] == [(inst, False, True, "job-a")]
    assert f.rental(inst).state == "active"
    assert [r.instance for r in f.rows(kind="host_held")] == [inst]
    creates, preflights = len(f.market.referee.instance_ids()), len(f.preflights)

    step = f.start("job-b")
    assert step.handed_over == inst and step.phase == "training"
    assert len(f.market.referee.instance_ids()) == creates and len(f.preflights) == preflights
    kinds = [r.kind for r in f.rows(job="job-b")]
    assert "host_adopted" in kinds and "training_handed_over" in kinds
    assert "offer_chosen" not in kinds and "instance_created" not in kinds
    adopted = f.rows(kind="host_adopted")[0]
    assert adopted.instance == inst and adopted.payload["rental_job"] == "job-a"
    assert f.svc.pool.held() == [] and f.svc.pool.held(states=("adopted",))[0].adopted_by == "job-b"


def test_an_incompatible_job_does_not_adopt_the_held_host(tmp_path: Path) -> None:
    """A job that needs another GPU, or another image, rents its own host; the held one waits."""
    f = Fleet(tmp_path)
    inst = f.train("job-a")
    f.finish("job-a")
    other_gpu = f.train("job-b", req=Requirements(gpu_names=("RTX 4090",)))
    f.images["job-c"] = "another-image"
    other_image = f.train("job-c")
    assert inst not in (other_gpu, other_image)
    assert f.market.status(other_gpu).machine_id == "m-4090"
    assert [h.instance_id for h in f.svc.pool.held()] == [inst]
    assert not f.rows(kind="host_adopted")


def test_two_jobs_racing_for_one_held_host_exactly_one_adopts(tmp_path: Path) -> None:
    """Two queued jobs decide to adopt the same held host at the same moment: one claim wins; the
    other looks again at once and rents its own."""
    f = Fleet(tmp_path)
    inst = f.train("job-a")
    f.finish("job-a")
    jobs = [new_job(j, req=Requirements(), shape=SHAPE) for j in ("job-b", "job-c")]
    for job in jobs:
        assert f.svc.save([(job, 0, f.clock.now())])
    views = [f.svc._view(job) for job in jobs]
    assert all(v.held and v.held[0].instance_id == inst for v in views)
    barrier = threading.Barrier(2)
    results: dict[str, Step] = {}

    def race(i: int) -> None:
        barrier.wait()
        results[jobs[i].job_id] = f.svc._run(jobs[i], 1, Tick(views[i]))

    threads = [threading.Thread(target=race, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [j for j, s in results.items() if s.handed_over == inst]
    assert len(winners) == 1
    loser = next(j for j in results if j not in winners)
    assert results[loser].phase == "queued" and results[loser].wake_at == f.clock.now()
    assert [r.job for r in f.rows(kind="host_adopted")] == winners
    assert [r.payload["provisioning_job"] for r in f.rows(kind="adopt_lost")] == [loser]
    f.schedule(results[loser])
    f.run(lambda: loser in f.handed)
    assert f.handed[loser] != inst


def test_many_concurrent_claims_on_one_held_host_have_one_winner(tmp_path: Path) -> None:
    """Eight threads claim the same held host: exactly one gets it."""
    f = Fleet(tmp_path)
    inst = f.train("job-a")
    f.finish("job-a")
    barrier = threading.Barrier(8)
    got: list[object] = []

    def claim(i: int) -> None:
        barrier.wait()
        got.append(f.svc.pool.claim(inst, job_id=f"job-{i}", now=f.clock.now()))

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(1 for g in got if g is not None) == 1


def test_the_expiry_sweep_stops_a_held_host_that_held_work_and_never_destroys_it(tmp_path: Path) -> None:
    """Past its hold, the sweep stops the finished job's host (it held work): stopped, not destroyed."""
    f = Fleet(tmp_path)
    inst = f.train("job-a")
    f.finish("job-a")
    (held,) = f.svc.pool.held()
    f.clock.set(held.hold_until - 1)
    assert f.svc.sweep_holds().released == [] and f.rental(inst).state == "active"
    f.clock.set(held.hold_until + 1)
    report = f.svc.sweep_holds()
    assert report.released == [inst]
    assert f.rental(inst).state == "stopped" and f.market.status(inst).state == "stopped"
    assert not [r for r in f.rows(kind="instance_destroyed") if r.instance == inst]
    stop = [r for r in f.rows(kind="instance_stopped") if r.instance == inst]
    assert len(stop) == 1 and stop[0].reason == "hold expired"
    released = f.rows(kind="host_released")
    assert len(released) == 1 and released[0].payload["action"] == "stopped"
    assert f.svc.sweep_holds().released == []  # a second sweep finds nothing


class _IdleMarket:
    """The sim marketplace with every running GPU idle (what a held host looks like)."""

    def __init__(self, market: SimMarket) -> None:
        self.market = market
        self.name = "sim"

    def status(self, instance_id: str) -> Instance:
        return replace(self.market.status(instance_id), gpu_util=0.0)

    def stop(self, instance_id: str) -> None:
        self.market.stop(instance_id)


def test_the_idle_watchdog_leaves_a_held_host_alone_until_its_hold_ends(tmp_path: Path) -> None:
    """A held host idles on purpose: the watchdog neither stops it nor starts its idle spell before
    hold_until; afterwards it is an idle host like any other."""
    f = Fleet(tmp_path)
    inst = f.train("job-a")
    f.finish("job-a")
    (held,) = f.svc.pool.held()
    markets: Any = {"sim": _IdleMarket(f.market)}

    def sweep() -> list[str]:
        until = f.svc.pool.held_until()
        return sweep_idle(
            f.svc.rentals,
            markets,
            now=f.clock.now(),
            grace_s=60.0,
            job_phase=lambda _j: "done",
            held_until=lambda r: until.get((r.provider, r.instance_id or "")),
        ).stopped

    assert sweep() == []
    f.clock.set(held.hold_until - 10)
    assert sweep() == [] and f.rental(inst).idle_since is None and f.rental(inst).state == "active"
    f.clock.set(held.hold_until + 1)
    assert sweep() == []  # its idle spell starts now
    f.clock.advance(61)
    assert sweep() == [inst]
    assert not [r for r in f.rows(kind="instance_destroyed") if r.instance == inst]


def test_the_reaper_and_the_reconciler_still_cover_held_hosts(tmp_path: Path) -> None:
    """A held host is a known, labelled rental: the reconciler leaves it running, the reaper stops it
    at its kill-time, and the next hold sweep takes it off the list."""
    f = Fleet(tmp_path)
    inst = f.train("job-a")
    f.finish("job-a")
    markets: Any = {"sim": f.market}
    rec = sweep_reconcile(f.svc.rentals, markets, now=f.clock.now(), orphan_grace_s=0.0)
    assert rec.stopped == [] and f.rental(inst).state == "active"
    (held,) = f.svc.pool.held()
    assert held.hold_until <= f.rental(inst).kill_at
    assert sweep_ttl(f.svc.rentals, markets, now=f.rental(inst).kill_at + 1).stopped == [inst]
    assert f.svc.sweep_holds().dropped == [inst] and f.svc.pool.held() == []


def test_standby_hosts_keep_one_verified_host_and_a_recovery_adopts_it(tmp_path: Path) -> None:
    """standby_hosts=1: once job-a trains, a standby job rents and verifies a second host under
    job-a's name and budget; when job-a's host vanishes, the recovery adopts it (no create, no
    preflight) and the pool is refilled; when job-a ends, the standby hosts are released."""
    f = Fleet(tmp_path)
    first = f.train("job-a", standby_hosts=1)
    f.run(lambda: any(h.standby for h in f.svc.pool.held()))
    (standby,) = f.svc.pool.held()
    assert standby.owner == "job-a" and standby.released_by == "job-a.standby-1" and not standby.held_work
    rental = f.rental(standby.instance_id)
    assert rental.job == "job-a" and rental.attempt > 1000 and rental.label.startswith("th-job-a-a100")
    assert ("job-a", standby.instance_id) in f.preflights  # verified with job-a's key
    by_job = build_receipt(f.svc.rentals, Ledger(f.engine), now=f.clock.now()).as_dict()["by_job"]
    assert set(by_job) == {"job-a"}

    creates, preflights = len(f.market.referee.instance_ids()), len(f.preflights)
    step = f.lose("job-a")
    assert step.phase == "queued"
    f.run(lambda: "job-a" in f.handed)
    assert f.handed["job-a"] == standby.instance_id != first
    assert len(f.market.referee.instance_ids()) == creates  # the recovery rented nothing
    assert len(f.preflights) == preflights
    adopted = f.rows(kind="host_adopted")
    assert len(adopted) == 1 and adopted[0].payload["standby"] is True
    assert any(r.kind == "provisioning_recovered" for r in f.rows(job="job-a"))
    assert "job-a.standby-2" in f.pending  # the pool refills

    f.run(lambda: len([h for h in f.svc.pool.held() if h.standby]) == 1)
    (refill,) = [h for h in f.svc.pool.held() if h.standby]
    f.finish("job-a")
    assert f.rental(refill.instance_id).state == "destroyed"  # it never held work
    assert f.rental(standby.instance_id).state == "active"  # it trained: held for the next job, never destroyed
    for r in f.rows(kind="instance_destroyed"):
        assert not f.svc.rentals.by_instance("sim", r.instance).held_work  # type: ignore[union-attr]


def test_a_hedged_recovery_starts_standby_jobs_and_holds_the_extras(tmp_path: Path) -> None:
    """No verified host waits when job-a's host is lost: the recovery's own create goes to a slow
    host and standby jobs start beside it; the first verified host takes the job (its own attempt
    is handed to a standby job), and the other verified hosts are held: the job keeps no pool, so
    they get the ordinary hold, for any compatible job (app.policy.fleet.hold_terms)."""
    f = Fleet(tmp_path, slow=("m-1",))
    first = f.train("job-a")
    assert f.market.status(first).machine_id == "m-0"
    step = f.lose("job-a")
    f.run(lambda: "job-a" in f.pending)
    step = f.schedule(f.svc.step("job-a"))
    assert step.phase == "booting" and len(step.spawned) >= 2
    state = f.svc.state("job-a")
    assert state is not None and state[0].attempt is not None and state[0].attempt.machine_id == "m-1"
    wanted = f.rows(kind="standby_wanted")
    assert wanted and wanted[0].job == "job-a" and wanted[0].payload["purpose"] == "hedge"

    f.run(lambda: "job-a" in f.handed)
    got = f.market.status(f.handed["job-a"]).machine_id
    assert got not in ("m-0", "m-1")  # a hedge's host, verified before the slow one
    assert [r.kind for r in f.rows(job="job-a")].count("attempt_handed_over") == 1
    adopted = [r for r in f.rows(job="job-a") if r.kind == "host_adopted"]
    assert len(adopted) == 1 and ".standby-" in adopted[0].payload["released_by"]  # a hedge's host

    f.run(lambda: f.standby_jobs_ended("job-a"))
    held = f.svc.pool.held(owner="job-a")
    assert held and all(not h.held_work and not h.standby for h in held)
    assert all(h.hold_until <= h.verified_at + f.svc.cfg.hold_s for h in held)
    machines = {h.machine_id for h in held}
    assert "m-1" in machines  # the recovery's own slow attempt, finished by the standby job it was handed to
    for r in f.svc.rentals.all(job="job-a"):  # every hedge reserved and billed under job-a
        assert r.reservation_id is not None


def test_hedges_beyond_the_pool_get_only_the_ordinary_hold_and_the_sweep_releases_them(tmp_path: Path) -> None:
    """Without a pool, the hedges that lost the race are held for the ordinary 10 minutes only, then
    destroyed by the sweep (they never held work); the recovered job keeps training."""
    f = Fleet(tmp_path, slow=("m-1",))
    extras = f.recover_with_hedges("job-a")
    assert extras and all(h.hold_until <= h.verified_at + f.svc.cfg.hold_s for h in extras)
    f.clock.set(max(h.hold_until for h in extras) + 1)
    report = f.svc.sweep_holds()
    assert sorted(report.released) == sorted(h.instance_id for h in extras)
    assert all(f.rental(h.instance_id).state == "destroyed" for h in extras)
    assert f.rental(f.handed["job-a"]).state == "active"
    assert all(r.payload["action"] == "destroyed" for r in f.rows(kind="host_released"))


def test_a_host_adopted_from_another_job_is_transferred_to_the_adopter(tmp_path: Path) -> None:
    """Given job-a and job-b with their own budgets, when job-b adopts job-a's held host, then
    job-b's budget holds a reservation for its use, job-a is charged only up to the adoption,
    receipts split the bill at that instant, job-a's budget monitor never stops the host under
    job-b, and job-b's supervisor opens the host with the key it was launched with."""
    from types import SimpleNamespace

    from app.services.guardrails import sweep_budgets
    from app.services.supervisor import SupervisorService

    f = Fleet(tmp_path)
    budget = f.svc.rentals.budget
    inst = f.train("job-a")
    f.clock.advance(600)
    f.finish("job-a")
    f.clock.advance(60)
    step = f.start("job-b")
    assert step.handed_over == inst
    adopted_at = f.clock.now()
    rental = f.rental(inst)

    # Then the rental is job-b's from the adoption on, a ledger event with time and rate.
    assert rental.job == "job-b" and rental.state == "active"
    (moved,) = f.rows(kind="rental_transferred")
    assert moved.job == "job-b" and moved.instance == inst and moved.rate_usd_per_hour == rental.rate_usd_per_hour
    assert moved.payload["from_job"] == "job-a" and moved.payload["at"] == adopted_at

    # job-b's budget reserved for its training before the transfer; job-a's reservation is settled.
    by_name = {s.name: s for s in budget.status()}
    assert by_name["job-b"].reserved_usd > 0
    assert set(f.svc.rentals.reservations_of(rental.id)) <= budget.held("job-b")
    assert budget.held("job-a") == set()
    rate = rental.rate_usd_per_hour or 0.0
    storage_per_h = (rental.storage_per_gb_month or 0.0) * rental.disk_gb / 720.0
    share_a = (rate + storage_per_h) * (adopted_at - rental.created_at) / 3600.0
    assert abs(by_name["job-a"].spent_usd - share_a) < 1e-6

    # job-b trains for an hour; the operator meanwhile caps job-a at twice what it had spent.
    f.clock.advance(3600)
    budget.set_cap("job-a", share_a * 2)
    report = sweep_budgets(budget, rentals=f.svc.rentals, markets={"sim": f.market}, now=f.clock.now())
    assert inst not in report.stopped and f.rental(inst).state == "active"
    assert not any(w.startswith("job-a:") for w in report.warnings)

    # Receipts attribute the time after the adoption to job-b.
    now = f.clock.now()
    ledger = Ledger(f.engine)
    whole = build_receipt(f.svc.rentals, ledger, now=now).as_dict()["by_job"]
    assert abs(whole["job-a"] - share_a) < 1e-6
    assert abs(whole["job-b"] - (rate + storage_per_h) * (now - adopted_at) / 3600.0) < 1e-6
    assert abs(build_receipt(f.svc.rentals, ledger, now=now, job="job-a").as_dict()["total_usd"] - share_a) < 1e-6
    assert (
        abs(build_receipt(f.svc.rentals, ledger, now=now, job="job-b").as_dict()["total_usd"] - whole["job-b"]) < 1e-6
    )

    # job-b's supervisor opens the host with the key whose public half is on it (job-a's).
    keys: list[str] = []
    stub: Any = SimpleNamespace(provisioning=f.svc, shell_for=lambda _inst, key_job: keys.append(key_job))
    SupervisorService._shell(stub, f.market.status(inst), "job-b")
    assert [f"ssh-ed25519 {k}" for k in keys] == [f.svc.rentals.spec_of(rental.id).ssh_public_key]


def test_an_adoption_that_does_not_fit_the_adopters_budget_is_refused_and_it_rents_its_own(tmp_path: Path) -> None:
    """job-b's budget cannot cover its training on job-a's held host: the adoption is refused (a
    ledger event), the host stays held and job-a's, and job-b, whose cap cannot pay for any attempt
    and which has nothing running, ends naming its budget."""
    f = Fleet(tmp_path)
    inst = f.train("job-a")
    f.finish("job-a")
    f.svc.rentals.budget.set_cap("job-b", 0.0)
    step = f.start("job-b")
    assert step.handed_over is None
    refused = f.rows(kind="adopt_refused")
    assert len(refused) == 1 and refused[0].job == "job-b" and refused[0].instance == inst
    assert f.rental(inst).job == "job-a" and [h.instance_id for h in f.svc.pool.held()] == [inst]
    assert not f.rows(kind="rental_transferred")
    f.run(lambda: bool(f.rows(job="job-b", kind="provisioning_failed")))
    assert "budget" in f.rows(job="job-b", kind="provisioning_failed")[0].reason
    assert len(f.rows(kind="adopt_refused")) == 1  # not offered to job-b again
    assert f.rental(inst).job == "job-a" and f.svc.rentals.budget.held("job-b") == set()


def test_the_reaper_the_reconciler_and_the_idle_watchdog_cover_a_transferred_rental(tmp_path: Path) -> None:
    """After job-b adopts job-a's host, the reconciler still knows it, the idle watchdog reads
    job-b's phase (between slices: not idle), not finished job-a's, and the reaper stops it at
    its kill-time."""
    f = Fleet(tmp_path)
    inst = f.train("job-a")
    f.finish("job-a")
    assert f.start("job-b").handed_over == inst and f.rental(inst).job == "job-b"
    markets: Any = {"sim": f.market}
    assert sweep_reconcile(f.svc.rentals, markets, now=f.clock.now(), orphan_grace_s=0.0).stopped == []
    phases = {"job-a": "done", "job-b": "between_slices"}
    asked: list[str] = []

    def phase(job: str) -> str | None:
        asked.append(job)
        return phases.get(job)

    idle: Any = {"sim": _IdleMarket(f.market)}
    for _ in range(3):
        f.clock.advance(61)
        assert sweep_idle(f.svc.rentals, idle, now=f.clock.now(), grace_s=60.0, job_phase=phase).stopped == []
    assert set(asked) == {"job-b"}
    assert sweep_ttl(f.svc.rentals, markets, now=f.rental(inst).kill_at + 1).stopped == [inst]
    assert f.rental(inst).state == "stopped"


class Crash(Exception):
    """The process died here (a worker killed mid-task)."""


def _active_unreferenced(f: Fleet, owner: str) -> list[str]:
    """Active rentals of `owner` that nothing drives: no provisioning state's attempt, no hold,
    not the host it trains on."""
    driving: set[str] = set(f.handed.values())
    for job_id in [owner] + [sj.job_id for sj in f.svc.pool.standby_jobs(owner)]:
        loaded = f.svc.state(job_id)
        if loaded is not None and loaded[0].attempt is not None and loaded[0].phase not in ("done", "failed"):
            driving.add(loaded[0].attempt.instance_id)
    driving |= {h.instance_id for h in f.svc.pool.held(owner=owner)}
    return [
        r.instance_id
        for r in f.svc.rentals.all(states=("active",), job=owner)
        if r.instance_id is not None and r.instance_id not in driving
    ]


def test_a_crash_in_the_middle_of_a_hand_over_leaves_the_booting_attempt_driven(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """Given a hedged recovery whose hedge is verified while the job's own attempt still boots,
    when the process dies while the hand-over writes the standby job that takes that attempt,
    then the job still drives that rental itself (the hand-over wrote nothing), and after the
    redelivered tasks and the next sweep no active rental is left without a state or a hold."""
    import app.policy.codec as codec

    f = Fleet(tmp_path, slow=("m-1",))
    f.train("job-a")
    f.lose("job-a")
    real_dump = codec.dump_job
    crashed: list[str] = []

    def dump_job(job: Any) -> Any:
        sj = f.svc.pool.standby_job(job.job_id)
        if not crashed and sj is not None and sj.purpose == "hand_over":
            crashed.append(job.job_id)
            raise Crash(f"killed while saving {job.job_id}")
        return real_dump(job)

    monkeypatch.setattr(codec, "dump_job", dump_job)
    for _ in range(3000):  # Fleet.run, with the crashed task redelivered (acks_late)
        if "job-a" in f.handed:
            break
        job_id, (at, inst) = min(f.pending.items(), key=lambda kv: (kv[1][0], kv[0]))
        del f.pending[job_id]
        f.clock.set(max(f.clock.now(), at))
        try:
            f.schedule(f.svc.preflight(job_id, inst) if inst else f.svc.step(job_id))
        except Crash:
            f.pending[job_id] = (f.clock.now(), inst)
    assert crashed, "the hand-over never ran: the scenario did not reach the crash"
    assert "job-a" in f.handed
    for step in f.svc.sweep_holds().steps:
        f.schedule(step)
    assert _active_unreferenced(f, "job-a") == []
    f.run(lambda: f.standby_jobs_ended("job-a"))
    assert _active_unreferenced(f, "job-a") == []
    # the slow m-1 rental ends accounted for: trained on, held, or released by automation
    (m1,) = [r for r in f.svc.rentals.all(job="job-a") if r.machine_id == "m-1"]
    assert (
        m1.state != "active"
        or m1.instance_id in f.handed.values()
        or any(h.instance_id == m1.instance_id for h in f.svc.pool.held(owner="job-a"))
    )


def test_two_steps_of_one_recovery_at_once_adopt_one_host_between_them(tmp_path: Path, monkeypatch: Any) -> None:
    """Two standby hosts verified at the same moment each step the recovering job (two Celery
    tasks): the step that claims first adopts; the other, which loaded the same state, claims
    nothing more, emits no adoption and saves nothing (found by the Celery hedged-recovery test,
    where it left one job with two adopted hosts)."""
    f = Fleet(tmp_path)
    f.train("job-a", standby_hosts=2)
    f.run(lambda: len([h for h in f.svc.pool.held() if h.standby]) == 2)
    step = f.lose("job-a")
    assert step.phase == "queued"
    stale = f.svc.state("job-a")  # what the second task loaded before the first one saved
    assert stale is not None
    first = f.svc.step("job-a")
    assert first.handed_over is not None
    real_state = f.svc.state
    monkeypatch.setattr(f.svc, "state", lambda job_id: stale if job_id == "job-a" else real_state(job_id))
    second = f.svc.step("job-a")
    monkeypatch.setattr(f.svc, "state", real_state)

    assert second.handed_over is None
    adopted = f.rows(job="job-a", kind="host_adopted")
    assert [r.instance for r in adopted] == [first.handed_over]
    assert len(f.rows(job="job-a", kind="training_handed_over")) == 2  # the first training and this recovery
    assert [r.kind for r in f.rows(job="job-a")].count("adopt_skipped") == 1
    still = [h for h in f.svc.pool.held() if h.standby]
    assert len(still) == 1 and still[0].instance_id != first.handed_over  # the other host waits on
    state = f.svc.state("job-a")
    assert state is not None and state[0].phase == "training" and state[0].attempt is not None
    assert state[0].attempt.instance_id == first.handed_over


def test_a_standby_host_verified_while_the_recoverys_own_host_passes_preflight_is_held_not_handed_over(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """Both hosts pass their preflights at the same instant (two Celery tasks): the recovering
    job's own preflight step holds the job's step lease while it hands training over; the standby
    job's offer waits for that lease, then finds the job training and leaves its host held. Before
    the offer took the lease it handed the job's attempt to a standby job mid-step: the job's own
    step then lost its save after marking that rental as having held work (a known limit)."""
    f = Fleet(tmp_path)
    f.train("job-a")
    f.lose("job-a")

    def preflights() -> dict[str, str]:
        return {j: inst for j, (_, inst) in f.pending.items() if inst is not None}

    for _ in range(100):  # Fleet.run, holding preflights back until job-a's and a standby's are due
        ready = preflights()
        if "job-a" in ready and len(ready) >= 2:
            break
        job_id, (at, _) = min(((j, v) for j, v in f.pending.items() if v[1] is None), key=lambda kv: (kv[1][0], kv[0]))
        del f.pending[job_id]
        f.clock.set(max(f.clock.now(), at))
        f.schedule(f.svc.step(job_id))
    own = f.pending.pop("job-a")[1]
    standby_id, (_, standby_inst) = next((j, v) for j, v in f.pending.items() if v[1] is not None)
    del f.pending[standby_id]
    assert own is not None and standby_inst is not None

    inside, go_on = threading.Event(), threading.Event()
    from app.services.provisioning.effects import StepEffects

    real_start = StepEffects.start_training

    def slow_start(self: StepEffects, job: Any, act: Any) -> None:
        if job.job_id == "job-a":
            inside.set()
            assert go_on.wait(10)
        real_start(self, job, act)

    monkeypatch.setattr(StepEffects, "start_training", slow_start)
    steps: dict[str, Step] = {}
    mine = threading.Thread(target=lambda: steps.__setitem__("own", f.svc.preflight("job-a", own)))
    theirs = threading.Thread(target=lambda: steps.__setitem__("standby", f.svc.preflight(standby_id, standby_inst)))
    mine.start()
    assert inside.wait(10)
    theirs.start()
    theirs.join(1.0)
    assert theirs.is_alive()  # its host is held; its offer waits for job-a's lease
    go_on.set()
    mine.join(10)
    theirs.join(30)
    assert steps["own"].handed_over == own
    assert steps["standby"].also == ()
    kinds = [r.kind for r in f.rows(job="job-a")]
    assert "attempt_handed_over" not in kinds and "provisioning_conflict" not in kinds
    assert [h.instance_id for h in f.svc.pool.held(owner="job-a")] == [standby_inst]
    state = f.svc.state("job-a")
    assert state is not None and state[0].phase == "training" and state[0].attempt is not None
    assert state[0].attempt.instance_id == own


def test_a_standby_host_held_long_for_a_recovery_that_took_another_gets_the_ordinary_hold(tmp_path: Path) -> None:
    """Two standby hosts verified at once for one recovery: the first is held until its kill-time
    (the recovery wanted one), the second is the one adopted. Once the job trains again, the hold
    sweep gives the long-held host (beyond the job's pool of 0) the ordinary 10-minute hold, then
    releases it: it does not bill until its kill-time (found in the Celery hedged-recovery test)."""
    f = Fleet(tmp_path, slow=("m-1",))
    held = f.recover_with_hedges("job-a")
    assert held
    now = f.clock.now()
    long_one = held[0]
    # as a race of two verified hosts can leave it: a standby hold until the kill-time
    assert f.svc.pool.renew(long_one.id, hold_until=f.rental(long_one.instance_id).kill_at, standby=True)
    f.svc.sweep_holds()
    (after,) = [h for h in f.svc.pool.held(owner="job-a") if h.id == long_one.id]
    assert after.hold_until == now + f.svc.cfg.hold_s
    assert [r.instance for r in f.rows(kind="host_hold_shortened")] == [long_one.instance_id]
    f.clock.set(now + f.svc.cfg.hold_s + 1)
    report = f.svc.sweep_holds()
    assert long_one.instance_id in report.released
    assert f.rental(long_one.instance_id).state != "active"


def test_a_job_at_its_cap_ends_through_the_policy_with_its_standby_jobs(tmp_path: Path) -> None:
    """Given job-a training with a standby pool, when its budget reaches the cap, then the budget
    monitor ends it through the provisioning policy (BudgetCapReached): its training host is stopped
    (it held work), its standby host released, the job fails naming the cap, and nothing new is
    rented for it."""
    from app.services.guardrails import sweep_budgets

    f = Fleet(tmp_path)
    first = f.train("job-a", standby_hosts=1)
    f.run(lambda: any(h.standby for h in f.svc.pool.held()))
    budget = f.svc.rentals.budget
    budget.set_cap("job-a", 0.01)  # already spent
    ended: list[Step] = []

    def end_job(job: str, cap: str, evidence: str) -> bool:
        steps = f.svc.end_at_cap(job, cap=cap, evidence=evidence)
        ended.extend(steps)
        return bool(steps)

    report = sweep_budgets(
        budget,
        rentals=f.svc.rentals,
        markets={"sim": f.market},
        now=f.clock.now(),
        checkpoint_safe=lambda job: True,
        end_job=end_job,
    )
    assert report.warnings == ["job-a:stop"] and first in report.stopped
    state = f.svc.state("job-a")
    assert state is not None and state[0].phase == "failed" and "budget cap reached" in (state[0].failure or "")
    assert ended and ended[0].phase == "failed"
    assert f.rental(first).state == "stopped"  # it held work: stopped, never destroyed
    assert [h for h in f.svc.pool.held() if h.standby] == []  # the pool went with the job
    assert any(r.kind == "provisioning_failed" and "budget" in r.reason for r in f.rows(job="job-a"))
    creates = len(f.market.referee.instance_ids())
    f.clock.set(f.clock.now() + 3600)
    for job_id in list(f.pending):
        f.schedule(f.svc.step(job_id))
    assert len(f.market.referee.instance_ids()) == creates


def test_progress_aware_hedging_runs_in_real_time_too(tmp_path: Path) -> None:
    """With progress_hedge_max set, a recovery whose own replacement pulls slower than a fresh
    rental would (at the median pull rate watched so far) gets one more single rental, as in the
    campaign simulator (RecoveryProgress is fed by both drivers)."""
    f = Fleet(tmp_path, slow=("m-1",))
    f.svc.cfg = replace(f.svc.cfg, progress_hedge_max=3)
    f.train("job-a")
    assert f.svc.pool.pull_rates()  # the first boot's rate was watched
    f.lose("job-a")
    f.run(lambda: "job-a" in f.handed)
    wanted = [r for r in f.rows(job="job-a", kind="standby_wanted") if "slower than a fresh rental" in r.reason]
    assert wanted, [r.reason for r in f.rows(job="job-a", kind="standby_wanted")]
