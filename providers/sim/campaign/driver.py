"""The campaign simulator: the fleet's policy driven in virtual time against `SimMarket`.

The second driver of the policy Celery drives in real time. An event queue of wake-ups in virtual
seconds, a `VirtualClock` the simulated marketplace reads, and the virtual-time `Effects`: every
job's observations go through `app.interpreter.drive` (the one interpreter both drivers share),
and everything above one job (the standby pool and its hedged refills, holds and their expiry,
the budget monitor, the reservation) is decided by `app.policy.fleet`. The trainer on each host is
played by `SimTrainer`, and the supervisor's own judgement (`assess`, triage of the log tail,
`route_triage`) reads it. The receipt comes from the marketplace's referee, never from what the
policy believed.

The campaign keeps one standby pool for all its jobs (production keeps one per job that asks for
it); its sweeps run at beat's periods (`beat_schedule.py`) in virtual seconds.

No Celery import: the simulator runs in the CLI's process.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from app.interpreter import apply, drive, tend
from app.market import LaunchSpec, MarketError, Offer, OfferQuery
from app.policy.fleet import (
    Drop,
    HeldLook,
    Release,
    Renew,
    RiskSpan,
    budget_exhausted,
    budget_verdict,
    exposure,
    hold_terms,
    judge_held,
    pool_missing,
    pool_target,
    pull_rate_seen,
    recoveries_waiting,
    refill_chains,
    reservation_usd,
    standby_wanted,
)
from app.policy.gpus import canonical_gpu, hardware_key, same_gpu
from app.policy.preflight import PreflightReport
from app.policy.provisioning import (
    Adopt,
    Adopted,
    BudgetCapReached,
    Create,
    CreateResult,
    Destroy,
    FailureSeen,
    Finished,
    GaveUp,
    Hold,
    JobState,
    MarketView,
    Observation,
    Polled,
    PreflightResult,
    ProvisioningConfig,
    Record,
    Recovered,
    RecoveryProgress,
    RunPreflight,
    StartTraining,
    Stop,
    Tick,
    TrainerStatus,
    WakeAt,
    WantStandby,
    guarded_config,
    hand_over,
    naive_config,
    new_job,
    oracle_config,
)
from app.policy.ranking import JobShape, Requirements, attempt_cost_usd
from app.policy.reputation import (
    MachineRecord,
    record_boot,
    record_create,
    record_failure,
    record_preflight_passed,
    record_slice_finished,
)
from app.policy.retry import HeldHost
from app.policy.speeds import SpeedSample, speed_model
from app.policy.supervision import HostProbe, SupervisorConfig, assess, read_with_facts, route_triage, stop_job
from app.triage.rules import classify
from beat_schedule import period_s
from providers.sim.campaign.referee import TrainerSpan, receipt
from providers.sim.campaign.trainer import CUDA_ERROR, OOM_ERROR, OOM_S, TRAINER_CRASH_S, SimTrainer
from providers.sim.clock import VirtualClock
from providers.sim.market import SimMarket
from providers.sim.observe import bootstrap_s, datasheet_tflops_bf16, healthy_tflops_bf16, image_stack
from providers.sim.trace import Trace

__all__ = ["POLICIES", "Campaign", "CampaignResult"]

POLICIES: dict[str, Callable[[], ProvisioningConfig]] = {
    "guarded": guarded_config,
    "naive": naive_config,
    "oracle": oracle_config,
}
PREFLIGHT_S = 15.0  # SSH connect, torch import, warm-up and the ~10 s timed matmul
PREFLIGHT_NO_CUDA_S = 5.0  # SSH connect, torch import, and CUDA's init failing at once: no matmul
MAX_SIM_S = 30 * 24 * 3600.0
# The sweeps run at beat's periods, as in production: the budget monitor, and the held hosts'
# sweep (a hold that ended, or whose instance went away, is dealt with there).
BUDGET_CHECK_S = period_s("budget-monitor")
HOLDS_CHECK_S = period_s("held-hosts")
POOL = "campaign"  # the one standby pool's owner


SpeedMemory = Mapping[str, Mapping[str, Sequence[float]]]


@dataclass
class CampaignResult:
    """The referee's receipt (exactly the documented fields), the decisions made, and the jobs
    that did not finish with why."""

    receipt: dict[str, Any]
    ledger: list[dict[str, Any]] = field(default_factory=list)
    unfinished: dict[str, str] = field(default_factory=dict)
    # Per recovery, from the referee: `detect_s` (loss to the lost host stopped) and
    # `replacement_pull_s` (the image pull of the host the job resumed on).
    recovery_facts: list[dict[str, float]] = field(default_factory=list)
    # What the campaign learned of GPU speeds (GPU model -> machine -> TFLOP/s of each passing
    # preflight), the memory a later campaign can start from (`known_speeds`).
    speeds: SpeedMemory = field(default_factory=dict)


@dataclass
class _Live:
    job_id: str
    offer: Offer
    created_at: float
    trained: bool = False
    reserved_usd: float = 0.0


class Campaign:
    """One campaign: the event loop and the virtual-time effects of every action."""

    def __init__(
        self,
        trace: Trace,
        policy: str,
        *,
        jobs: int | None,
        seed: int,
        trace_label: str,
        standby_hosts: int | None = None,
        progress_hedge_max: int | None = None,
        monitor_s: float | None = None,
        bootstrap: bool = True,
        known_speeds: SpeedMemory | None = None,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; known: {sorted(POLICIES)}")
        self.trace = trace
        self.policy = policy
        self.trace_label = trace_label
        # `python -m trainer bootstrap` before each first preflight (TUNEHARNESS_BOOTSTRAP in real
        # time); the instances whose disk already holds the stack it installed
        self.bootstrap = bootstrap
        self.stack_installed: set[str] = set()
        self.cfg = POLICIES[policy]()
        if standby_hosts is not None:
            if standby_hosts < 0:
                raise ValueError(f"standby_hosts must be >= 0, got {standby_hosts}")
            self.cfg = replace(self.cfg, standby_hosts=standby_hosts)
        if progress_hedge_max is not None and self.cfg.recovery_hedge > 1:
            if progress_hedge_max < 0:
                raise ValueError(f"progress_hedge_max must be >= 0, got {progress_hedge_max}")
            self.cfg = replace(self.cfg, progress_hedge_max=progress_hedge_max)
        if monitor_s is not None:  # the supervisor's poll period (TUNEHARNESS_MONITOR_S in real time)
            if not 0 < monitor_s < float("inf"):
                raise ValueError(f"monitor_s must be a positive number of seconds, got {monitor_s}")
            self.cfg = replace(self.cfg, monitor_s=monitor_s)
        # The supervisor's judgement: the naive renter restarts nothing on the same host.
        self.sup_cfg = SupervisorConfig(
            monitor_s=self.cfg.monitor_s, max_same_host_restarts=0 if self.cfg.destroy_lost_hosts else 2
        )
        self.clock = VirtualClock()
        self.t0 = self.clock.now()
        self.market = SimMarket(trace, self.clock)
        self.referee = self.market.referee
        self.rng = random.Random(seed)
        w = trace.workload
        self.workload = w
        self.n_jobs = jobs if jobs is not None else w.jobs
        self.budget_usd = w.budget_usd
        self.req = Requirements()
        self.shape = JobShape(download_gb=w.download_gb, train_s=w.train_seconds, disk_gb=w.disk_gb)
        self.jobs: dict[str, JobState] = {
            f"job-{i + 1}": new_job(f"job-{i + 1}", req=self.req, shape=self.shape) for i in range(self.n_jobs)
        }
        self.real_jobs: tuple[str, ...] = tuple(self.jobs)
        self.standby_ids: set[str] = set()
        self.hedges_of: dict[str, list[str]] = {}  # recovering job -> the standby jobs hedging for it
        self.pull_rates: list[float] = []  # GB/s of every pull watched (finished boots, killed pulls)
        self.standby_spans: dict[str, tuple[float, float | None]] = {}  # instance -> waiting as standby
        self.budget_stopped = False
        self.wake_at: dict[str, float] = {}
        self.queue: list[tuple[float, int, int, str, str, Any]] = []
        self.seq = itertools.count()
        self.records: dict[str, MachineRecord] = {}
        # The campaign's memory of passing preflights: GPU model -> machine -> bf16 TFLOP/s measured.
        # `known_speeds` starts it with what earlier campaigns measured (production keeps this memory
        # in its database across jobs: a deployment that has run before is not starting cold).
        self.speeds: dict[str, dict[str, list[float]]] = {
            model: {machine: list(values) for machine, values in machines.items()}
            for model, machines in (known_speeds or {}).items()
        }
        self.held: dict[str, HeldHost] = {}
        self.live: dict[str, _Live] = {}  # instance id -> what we rented it for
        self.trainers: dict[str, SimTrainer] = {}  # instance id -> trainer
        self.all_trainers: list[SimTrainer] = []
        self.trainer_stops: dict[int, float] = {}  # id(trainer) -> when the job left it
        self.restarts: dict[str, int] = {}  # instance -> trainer deaths resumed on the same host
        self.destroyed_on_failure: set[str] = set()
        self.recoveries: list[dict[str, Any]] = []
        self.recovery_facts: list[dict[str, float]] = []
        self.loss_noticed: dict[str, float] = {}  # job -> when its lost/hung host was stopped
        self.ledger: list[dict[str, Any]] = []
        self.spans: dict[str, RiskSpan] = {}  # verified hosts exposed right now
        self.closed_spans: list[RiskSpan] = []
        self.pool_size = self.cfg.standby_hosts
        self.done_jobs: set[str] = set()
        self.failed: dict[str, str] = {}

    # -- event queue ------------------------------------------------------------------------
    def _push(self, at: float, kind: str, job_id: str, payload: Any = None, prio: int = 1) -> None:
        heapq.heappush(self.queue, (at, prio, next(self.seq), kind, job_id, payload))

    def _wake(self, job_id: str, at: float) -> None:
        self.wake_at[job_id] = at
        self._push(at, "wake", job_id, at)

    def _log(self, kind: str, **fields: Any) -> None:
        self.ledger.append({"t_s": round(self.clock.now() - self.t0, 3), "kind": kind, **fields})

    # -- the loop ---------------------------------------------------------------------------
    def _real_jobs_over(self) -> bool:
        return all(j in self.done_jobs or j in self.failed for j in self.real_jobs)

    def run(self) -> dict[str, Any]:
        for job_id in self.jobs:
            self._wake(job_id, self.t0)
        if self.budget_usd is not None and self.cfg.watch_budget:
            self._push(self.t0, "budget_check", "")
        self._top_up_standby()
        while self.queue and not self._real_jobs_over():
            at, _prio, _seq, kind, job_id, payload = heapq.heappop(self.queue)
            if at - self.t0 > MAX_SIM_S:
                break
            if at > self.clock.now():
                self.clock.set(at)
            if kind == "budget_check":
                self._check_budget()
            elif kind == "pool_check":
                self._check_pool()
            elif kind == "wake":
                if self.wake_at.get(job_id) != payload:
                    continue  # superseded
                self._on_wake(job_id)
            elif kind == "preflight":
                owner = self._job_of_instance(payload[0])  # the attempt may have been handed over
                if owner is not None and self.jobs[owner].phase == "preflight":
                    self._feed(owner, self._with_knowledge(payload[1]))
            elif kind == "oracle":
                iid, reason, evidence = payload
                owner = self._job_of_instance(iid)
                if owner is not None and self.jobs[owner].phase in ("booting", "preflight", "training"):
                    self._feed(owner, FailureSeen(reason, evidence))
            self._top_up_standby()
        for job_id in self.real_jobs:
            job = self.jobs[job_id]
            if job.phase not in ("done", "failed") and job_id not in self.failed:
                self.failed[job_id] = f"unfinished in phase {job.phase}"
        end = self.clock.now()
        for iid in list(self.held):
            self._stop_instance(self.held.pop(iid).instance_id, reason="campaign over", evidence="")
        for job_id in self.standby_ids:  # standby jobs still provisioning: nothing left to wait for
            att = self.jobs[job_id].attempt
            if att is not None:
                self._stop_instance(att.instance_id, reason="campaign over", evidence="standby no longer needed")
        return receipt(
            self.referee,
            end=end,
            t0=self.t0,
            policy=self.policy,
            trace=self.trace_label,
            destroyed_on_failure=self.destroyed_on_failure,
            trainers=self._trainer_spans(end),
            recoveries=self.recoveries,
            finished=len(self.done_jobs),
            unfinished=self.failed,
            real_jobs=self.real_jobs,
            budget_usd=self.budget_usd,
            standby_hosts=self.cfg.standby_hosts,
            standby_spans=self.standby_spans,
        )

    def _trainer_spans(self, end: float) -> list[TrainerSpan]:
        out = []
        for tr in self.all_trainers:
            gone = tr.dies_at if tr.dies_at is not None else math.inf
            assigned_until = min(self.trainer_stops.get(id(tr), end), gone, tr.finish_at())
            trained = tr.training_seconds(assigned_until)
            out.append(TrainerSpan(trained, max(0.0, assigned_until - tr.training_from - trained)))
        return out

    # -- the standby pool and held hosts (decided by app.policy.fleet) -----------------------
    def _pool_active(self) -> bool:
        return not self._real_jobs_over() and not self.budget_stopped

    def _waiting(self, *, besides: HeldHost | None = None) -> int:
        return sum(1 for h in self.held.values() if h.standby and h is not besides)

    def _missing(self, *, besides: HeldHost | None = None) -> int:
        """How many more verified hosts the standby pool wants (none once every job is over)."""
        if self.cfg.standby_hosts <= 0:
            return 0
        return pool_missing(
            target=self._pool_target(), waiting=self._waiting(besides=besides), active=self._pool_active()
        )

    def _pool_target(self) -> int:
        now = self.clock.now()
        seen = exposure([*self.closed_spans, *self.spans.values()], now=now)
        size = pool_target(self.cfg, configured=self.cfg.standby_hosts, seen=seen)
        if size != self.pool_size:
            self.pool_size = size
            self._log(
                "standby_pool",
                size=size,
                losses=seen.losses,
                exposure_s=round(seen.exposure_s, 1),
                hosts_at_risk=seen.at_risk,
                refill_s=round(seen.refill_s, 1),
            )
        return size

    def _at_risk(self, iid: str) -> None:
        """A verified host (training or waiting) is now exposed to being lost."""
        if iid not in self.spans:
            now = self.clock.now()
            self.spans[iid] = RiskSpan(created_at=self._instance_created_at(iid, now), verified_at=now)

    def _off_risk(self, iid: str, *, lost: bool) -> None:
        span = self.spans.pop(iid, None)
        if span is not None:
            self.closed_spans.append(replace(span, ended_at=self.clock.now(), lost=lost))

    def _job_of_instance(self, iid: str) -> str | None:
        for job_id, job in self.jobs.items():
            if job.attempt is not None and job.attempt.instance_id == iid:
                return job_id
        return None

    def _new_standby_job(self, *, hedge_for: str | None = None, why: str = "", rentals: int | None = None) -> str:
        job_id = f"standby-{len(self.standby_ids) + 1}"
        self.standby_ids.add(job_id)
        if hedge_for is not None:
            self.hedges_of.setdefault(hedge_for, []).append(job_id)
        self.jobs[job_id] = new_job(job_id, req=self.req, shape=self.shape, standby=True, rentals_max=rentals)
        self._log("standby_wanted", job=job_id, hedge_for=hedge_for, why=why, rentals=rentals)
        return job_id

    def _recovery_served_by(self, job_id: str) -> str | None:
        """The waiting recovery this job's provisioning works for (itself, or the job it hedges for)."""
        rec = next((j for j, hs in self.hedges_of.items() if job_id in hs), job_id)
        job = self.jobs.get(rec)
        if job is None or job.standby or job.lost_at is None or job.phase not in ("queued", "booting", "preflight"):
            return None
        return rec

    def _watch_pull(self, before: JobState, after: JobState) -> None:
        """Remember the pull rate of an attempt that just left its boot."""
        rate = pull_rate_seen(before, after, now=self.clock.now())
        if rate is not None:
            self.pull_rates.append(rate)

    def _check_recovery_progress(self, job_id: str) -> None:
        """Show a waiting recovery the chains working for it (progress-aware hedging)."""
        if self.cfg.progress_hedge_max <= 0 or self.cfg.recovery_hedge <= 1:
            return
        rec = self._recovery_served_by(job_id)
        if rec is None:
            return
        chains = tuple(self.jobs[h] for h in self.hedges_of.get(rec, ()))
        view = MarketView(records=dict(self.records), pull_rates_gb_per_s=tuple(self.pull_rates))
        self._feed(rec, RecoveryProgress(chains=chains, view=view))

    def _recovering(self) -> bool:
        return any(
            self.jobs[j].lost_at is not None for j in self.real_jobs if self.jobs[j].phase not in ("done", "failed")
        )

    def _top_up_standby(self) -> None:
        pending = sum(1 for j in self.standby_ids if self.jobs[j].phase not in ("done", "failed"))
        for _ in range(refill_chains(self.cfg, missing=self._missing(), pending=pending, records=self.records)):
            self._wake(self._new_standby_job(), self.clock.now())

    def _offer_to_recoveries(self) -> None:
        """A verified host waits: a recovering job whose own replacement is still booting hands that
        attempt over to a standby job and adopts the waiting host; a queued one looks at once."""
        now = self.clock.now()
        for job in recoveries_waiting([self.jobs[j] for j in self.real_jobs]):
            if not self.held:
                return
            job_id = job.job_id
            job = self.jobs[job_id]
            if job.phase != "queued":
                standby_id = f"standby-{len(self.standby_ids) + 1}"
                moved = hand_over(job, standby_id=standby_id)
                if moved is None:
                    continue
                back, standby = moved
                self.standby_ids.add(standby_id)
                self.jobs[job_id], self.jobs[standby_id] = back, standby
                assert standby.attempt is not None
                iid = standby.attempt.instance_id
                self.standby_spans[iid] = (now, None)
                self._log("handed_over", job=job_id, to=standby_id, instance=iid)
                self._wake(standby_id, now)
            self._feed(job_id, Tick(view=self._view(self.jobs[job_id])))

    def _look(self, h: HeldHost, *, state: str | None) -> HeldLook:
        live = self.live.get(h.instance_id)
        return HeldLook(h, held_work=live is not None and live.trained, state=state)

    def _check_pool(self) -> None:
        """The held hosts' sweep: a hold that ended is renewed or released, a host that vanished
        while it waited is dropped and recorded (app.policy.fleet.judge_held)."""
        now = self.clock.now()
        looks = [self._look(h, state=self.market.status(h.instance_id).state) for h in list(self.held.values())]
        tend(
            self,
            [
                judge_held(look, now=now, cfg=self.cfg, missing_besides=self._missing(besides=look.host))
                for look in looks
            ],
        )
        if self.held:
            self._push(now + HOLDS_CHECK_S, "pool_check", "")

    # -- HoldEffects ---------------------------------------------------------------------------
    def release(self, act: Release) -> None:
        iid = act.host.instance_id
        if self.held.pop(iid, None) is None:
            return
        if act.destroy:
            self._off_risk(iid, lost=False)
            self._end_span(iid)
            self.live.pop(iid, None)
            self.market.destroy(iid)
            self._log(
                "destroyed",
                job="",
                instance=iid,
                machine=act.host.machine_id,
                reason=act.reason,
                evidence="never held work",
            )
        else:
            self._stop_instance(iid, reason=act.reason, evidence="no compatible job within the hold")

    def renew(self, act: Renew) -> None:
        now = self.clock.now()
        h = replace(act.host, hold_until=act.until, standby=act.standby)
        self.held[h.instance_id] = h
        if h.standby:
            self.standby_spans.setdefault(h.instance_id, (now, None))
        self._log(
            "hold_renewed",
            instance=h.instance_id,
            machine=h.machine_id,
            until_s=h.hold_until - self.t0,
            reason=act.reason,
        )

    def drop(self, act: Drop) -> None:
        h = act.host
        self.held.pop(h.instance_id, None)
        self._off_risk(h.instance_id, lost=act.lost)
        self._stop_instance(h.instance_id, reason="lost", evidence=act.evidence)
        self._record_failure(h.machine_id, h.provider, "lost", act.evidence)

    # -- the budget monitor --------------------------------------------------------------------
    def _check_budget(self) -> None:
        """End every job before what bills now could cross the cap."""
        assert self.budget_usd is not None
        now = self.clock.now()
        spent = 0.0
        burn_per_s = 0.0
        for bill in self.referee.bills():
            spent += bill.total_usd
            if bill.ended_at is None:
                offer = self.referee.host_of(bill.instance_id).offer
                burn_per_s += offer.storage_per_gb_month * bill.disk_gb / 720.0 / 3600.0
                if bill.instance_id in self.live or bill.instance_id in self.held:
                    burn_per_s += offer.dph / 3600.0
        if budget_verdict(spent_usd=spent, burn_usd_per_s=burn_per_s, cap_usd=self.budget_usd, cfg=self.cfg) != "stop":
            self._push(now + BUDGET_CHECK_S, "budget_check", "")
            return
        self.budget_stopped = True
        cap = f"campaign budget ${self.budget_usd:.2f}"
        evidence = f"${spent:.4f} billed, ${burn_per_s * 3600:.4f}/h still billing"
        self._log("budget_cap", spent_usd=round(spent, 4), budget_usd=self.budget_usd)
        for job_id in list(self.jobs):
            if self.jobs[job_id].phase not in ("done", "failed"):
                self._feed(job_id, BudgetCapReached(cap, evidence))
        tend(
            self,
            [
                Release(h, destroy=not self._look(h, state=None).held_work, reason="budget_cap")
                for h in list(self.held.values())
            ],
        )

    # -- observations -----------------------------------------------------------------------
    def _on_wake(self, job_id: str) -> None:
        job = self.jobs[job_id]
        att = job.attempt
        obs: Observation
        if (
            job.phase == "queued"
            and job_id in self.standby_ids
            and not standby_wanted(missing=self._missing(), recovering=self._recovering(), active=self._pool_active())
        ):
            # Between attempts and nobody needs it any more: stop rolling the dice.
            self.jobs[job_id] = replace(job, phase="done", failure="no longer needed")
            self._log("standby_cancelled", job=job_id)
            return
        if job.phase == "queued":
            view = self._view(job)
            if budget_exhausted(
                budget_left_usd=view.budget_left_usd,
                anything_live=bool(self.live or self.held),
                cheapest_attempt_usd=self._cheapest_attempt(list(view.offers)),
            ):
                cap = f"campaign budget ${self.budget_usd:.2f}"
                obs = BudgetCapReached(cap, f"${view.budget_left_usd:.4f} left, less than the cheapest attempt")
            else:
                obs = Tick(view=view)
        elif att is None:
            return
        elif job.phase in ("booting", "preflight"):
            obs = Polled(self.market.status(att.instance_id))
        elif job.phase == "training":
            watched = self._supervise(job)
            if watched is None:
                return
            obs = watched
        else:
            return
        self._feed(job_id, obs)
        if isinstance(obs, Polled):
            self._watch_pull(job, self.jobs[job_id])
            self._check_recovery_progress(job_id)

    def _feed(self, job_id: str, obs: Observation) -> None:
        """Decide on the observation and apply the actions (the shared interpreter)."""
        drive(self.jobs[job_id], obs, self, self.cfg)

    def _samples(self, gpu_name: str) -> tuple[SpeedSample, ...]:
        """The passing preflights of this GPU model the campaign has seen (its memory of speeds)."""
        by_machine = self.speeds.get(speed_model(gpu_name), {})
        return tuple(SpeedSample(machine, value) for machine, values in by_machine.items() for value in values)

    def _view(self, job: JobState) -> MarketView:
        offers = self.market.search_offers(OfferQuery(limit=0))
        budget_left = None
        if self.budget_usd is not None and self.cfg.watch_budget:
            budget_left = self.budget_usd - self._committed_usd()
        return MarketView(
            offers=tuple(offers),
            records=dict(self.records),
            held=tuple(self.held.values()),
            budget_left_usd=budget_left,
        )

    def _cheapest_attempt(self, offers: list[Offer]) -> float:
        return min((self._attempt_cost(o) for o in offers), default=math.inf)

    def _attempt_cost(self, o: Offer) -> float:
        s = self.shape
        return attempt_cost_usd(
            dph_total=o.dph_total,
            storage_per_gb_month=o.storage_per_gb_month,
            inet_down_per_gb=o.inet_down_per_gb,
            inet_down_mbps=o.inet_down_mbps,
            download_gb=s.download_gb,
            train_s=s.train_s,
            disk_gb=s.disk_gb,
            overhead_s=s.overhead_s,
        )

    def _committed_usd(self) -> float:
        """Billed so far (the provider's invoice) plus what live rentals may still cost."""
        total = 0.0
        for bill in self.referee.bills():
            total += bill.total_usd
            live = self.live.get(bill.instance_id)
            if live is not None:
                total += max(0.0, live.reserved_usd - bill.total_usd)
        return total

    def _supervise(self, job: JobState) -> TrainerStatus | None:
        """One supervisor poll of a training job, judged as the real-time supervisor judges it: the
        probe through `assess`, a dead trainer's log tail through triage and `route_triage`."""
        att = job.attempt
        assert att is not None
        iid = att.instance_id
        inst = self.market.status(iid)
        tr = self.trainers.get(iid)
        now = self.clock.now()
        if tr is None:
            return TrainerStatus(inst, None)
        if inst.state in ("gone", "exited"):
            verdict = assess(HostProbe(provider_state=inst.state, ssh_ok=False), ssh_failures=1, cfg=self.sup_cfg)
            assert verdict.kind == "lost"
            return TrainerStatus(inst, None, heartbeat_at=tr.last_heartbeat(now))
        seen = tr.view(now)
        probe = HostProbe(
            provider_state=inst.state,
            ssh_ok=True,
            alive=seen.alive,
            phase=seen.phase,
            step=int(seen.work_s),
            exit_code=seen.exit_code,
        )
        verdict = assess(probe, ssh_failures=0, cfg=self.sup_cfg)
        if verdict.kind == "finished":
            return TrainerStatus(
                inst, "finished", work_s=seen.work_s, checkpoint_work_s=seen.checkpoint_work_s, heartbeat_at=now
            )
        if verdict.kind != "dead":
            return TrainerStatus(
                inst,
                "training",
                work_s=seen.work_s,
                checkpoint_work_s=seen.checkpoint_work_s,
                heartbeat_at=seen.heartbeat_at,
            )
        answer = classify(seen.log_tail)
        # what the supervisor knows beside the tail, as the real-time supervisor reads it: work
        # seconds stand for steps, the workload's training seconds for max_steps
        facts = read_with_facts(
            answer.guess if not answer.sure else answer.state,
            str(answer.remedy),
            exit_code=seen.exit_code,
            step=int(seen.work_s),
            max_steps=int(job.shape.train_s),
        )
        route = route_triage(
            facts.state,
            answer.action,
            exit_code=seen.exit_code,
            same_host_restarts=self.restarts.get(iid, 0),
            cfg=self.sup_cfg,
            remedy=facts.remedy,
        )
        self._log("trainer_died", job=job.job_id, instance=iid, triage=facts.state, route=route)
        if route == "same_host":
            self.restarts[iid] = self.restarts.get(iid, 0) + 1
            self._start_trainer(job.job_id, iid, resume_from_work_s=seen.checkpoint_work_s)
            self._wake(job.job_id, now + self.cfg.monitor_s)
            return None
        if route == "replace":
            return TrainerStatus(
                inst,
                "failed",
                work_s=seen.work_s,
                checkpoint_work_s=seen.checkpoint_work_s,
                heartbeat_at=seen.heartbeat_at,
                error=f"{facts.state}: {seen.log_tail}",
            )
        stopped, actions = stop_job(job, reason=f"training failed ({facts.state})", evidence=seen.log_tail)
        self.jobs[job.job_id] = stopped
        for act in actions:
            apply(self, stopped, act)
        return None

    # -- Effects (app.interpreter) --------------------------------------------------------------
    def now(self) -> float:
        return self.clock.now()

    def jitter(self) -> float:
        return self.rng.random()

    def decided(self, job: JobState) -> None:
        self.jobs[job.job_id] = job

    def wake(self, job: JobState, act: WakeAt) -> None:
        self._wake(act.job_id, max(act.at, self.clock.now()))

    def create(self, job: JobState, act: Create) -> Observation:
        spec = LaunchSpec(
            image="tuneharness/trainer:sim",
            disk_gb=self.workload.disk_gb,
            label=f"th-{act.job_id}",
            ssh_public_key="ssh-ed25519 sim",
        )
        try:
            iid = self.market.create(act.offer, spec)
        except MarketError as exc:
            self._log("create_failed", job=act.job_id, offer=act.offer.offer_id, error=str(exc))
            return CreateResult(act.offer, None, str(exc))
        reserved = reservation_usd(act.offer, self.shape, self.cfg)
        self.live[iid] = _Live(act.job_id, act.offer, self.clock.now(), reserved_usd=reserved)
        if act.job_id in self.standby_ids:
            self.standby_spans[iid] = (self.clock.now(), None)
        self._log(
            "created",
            job=act.job_id,
            instance=iid,
            machine=act.offer.machine_id,
            rate_usd_per_hour=act.offer.dph_total,
            reason=act.why,
        )
        if self.cfg.failures_seen_at_once:
            self._schedule_oracle(act.job_id, iid, act.offer)
        return CreateResult(act.offer, iid)

    def adopt(self, job: JobState, act: Adopt) -> Observation | None:
        now = self.clock.now()
        h = self.held.pop(act.held.instance_id, None)
        if h is None:
            self._wake(act.job_id, now)
            return None
        state = self.market.status(h.instance_id).state
        if state != "running":  # it vanished while it waited: drop it, look again
            self.held[h.instance_id] = h
            tend(self, [Drop(h, lost=True, evidence=f"held host reported {state} when adopted")])
            self._wake(act.job_id, now)
            return None
        span = self.standby_spans.get(h.instance_id)
        if span is not None and span[1] is None:
            self.standby_spans[h.instance_id] = (span[0], now)
        self.live[h.instance_id] = _Live(
            act.job_id,
            h.as_offer(),
            now,
            trained=True,
        )
        self._log("host_adopted", job=act.job_id, instance=h.instance_id, machine=h.machine_id)
        return Adopted(h)

    def destroy(self, job: JobState, act: Destroy) -> None:
        if act.reason in ("lost", "hang"):
            self.loss_noticed[act.job_id] = self.clock.now()
        live = self.live.pop(act.instance_id, None)
        if live is not None and not live.trained:
            self.destroyed_on_failure.add(act.instance_id)
        self._end_trainer(act.instance_id)
        self.market.destroy(act.instance_id)
        self._log(
            "destroyed",
            job=act.job_id,
            instance=act.instance_id,
            machine=act.machine_id,
            reason=act.reason,
            evidence=act.evidence,
        )

    def stop(self, job: JobState, act: Stop) -> None:
        if act.reason in ("lost", "hang"):
            self.loss_noticed[act.job_id] = self.clock.now()
            self._off_risk(act.instance_id, lost=True)
        self.live.pop(act.instance_id, None)
        self._stop_instance(act.instance_id, reason=act.reason, evidence=act.evidence, job=act.job_id)

    def record(self, job: JobState, act: Record) -> None:
        now = self.clock.now()
        rec = self.records.get(act.machine_id) or MachineRecord(machine_id=act.machine_id, provider=act.provider)
        if act.event == "create":
            rec = record_create(rec, now=now)
        elif act.event == "boot":
            rec = record_boot(rec, now=now)
        elif act.event == "preflight_passed":
            rec = record_preflight_passed(rec, now=now)
            if act.gpu_model is not None and act.tflops_bf16 is not None:
                self.speeds.setdefault(act.gpu_model, {}).setdefault(act.machine_id, []).append(act.tflops_bf16)
        elif act.event == "slice_finished":
            rec = record_slice_finished(rec, now=now)
        else:
            self._record_failure(act.machine_id, act.provider, act.reason or "lost", act.evidence)
            return
        self.records[act.machine_id] = rec

    def _record_failure(self, machine_id: str, provider: str, reason: str, evidence: str) -> None:
        rec = self.records.get(machine_id) or MachineRecord(machine_id=machine_id, provider=provider)
        rec = record_failure(rec, reason=reason, now=self.clock.now())
        self._log(
            "host_failed",
            machine=machine_id,
            reason=reason,
            evidence=evidence,
            quarantined=rec.quarantine_permanent or rec.quarantined_until is not None,
        )
        self.records[machine_id] = rec

    def _with_knowledge(self, res: PreflightResult) -> PreflightResult:
        """The preflight's result with what the campaign has learned by now: the passing preflights
        of the reported model, and the record of the hardware the report identifies."""
        report = res.report
        if report is None:
            return res
        hw = hardware_key(gpu_uuid=report.gpu_uuid, host_machine_id=report.host_machine_id)
        return replace(
            res, speeds=self._samples(report.gpu_name or ""), hardware=None if hw is None else self.records.get(hw)
        )

    def run_preflight(self, job: JobState, act: RunPreflight) -> None:
        raw = self.referee.preflight_report(act.instance_id)
        installing_s = 0.0
        if raw is not None and self.bootstrap:  # the bootstrap first, in the preflight's time
            truth = self.referee.truth_of(act.instance_id)
            installing_s = bootstrap_s(truth, cached=act.instance_id in self.stack_installed)
            self.stack_installed.add(act.instance_id)
            raw = {**raw, "stack": image_stack(truth.image, bootstrapped=True)}
        res = (
            PreflightResult(None, "ssh_unreachable", "no SSH endpoint")
            if raw is None
            else PreflightResult(PreflightReport.from_mapping(raw))
        )
        took = installing_s + (
            PREFLIGHT_NO_CUDA_S if raw is not None and not raw.get("cuda_initialised") else PREFLIGHT_S
        )
        self._push(self.clock.now() + took, "preflight", act.job_id, (act.instance_id, res), prio=0)

    def start_training(self, job: JobState, act: StartTraining) -> None:
        live = self.live.get(act.instance_id)
        if live is not None:
            live.trained = True
        self._start_trainer(act.job_id, act.instance_id, resume_from_work_s=act.resume_from_work_s)

    def hold(self, job: JobState, act: Hold) -> None:
        now = self.clock.now()
        if self.budget_stopped:
            self._stop_instance(act.host.instance_id, reason="budget_cap", evidence="no holds after the cap")
            return
        host = hold_terms(act.host, now=now, cfg=self.cfg, missing=self._missing())
        if not self.held:
            self._push(now + HOLDS_CHECK_S, "pool_check", "")
        self.held[host.instance_id] = host
        self._at_risk(host.instance_id)
        live = self.live.get(host.instance_id)
        if live is not None:  # what the hold may still bill
            live.reserved_usd = (
                self.referee.bill(host.instance_id).total_usd
                + act.host.dph_total * min(act.host.hold_until - now, 3600.0) / 3600.0
            )
        self._log(
            "held", job=act.job_id, instance=host.instance_id, until_s=host.hold_until - self.t0, standby=host.standby
        )
        self._offer_to_recoveries()

    def want_standby(self, job: JobState, act: WantStandby) -> None:
        for _ in range(act.count):
            self._wake(self._new_standby_job(hedge_for=act.job_id, why=act.why, rentals=act.rentals), self.clock.now())

    def recovered(self, job: JobState, act: Recovered) -> None:
        self.hedges_of.pop(act.job_id, None)
        att = self.jobs[act.job_id].attempt
        self.recovery_facts.append(
            {
                "detect_s": self.loss_noticed.get(act.job_id, act.lost_at) - act.lost_at,
                "replacement_pull_s": self.referee.pull_seconds(att.instance_id) if att is not None else 0.0,
            }
        )
        self.recoveries.append(
            {
                "job": act.job_id,
                "machine_id": act.machine_id,
                "cause": act.cause,
                "lost_at_s": round(act.lost_at - self.t0, 3),
                "resumed_at_s": round(act.resumed_at - self.t0, 3),
            }
        )

    def finished(self, job: JobState, act: Finished) -> None:
        if act.job_id not in self.standby_ids:
            self.done_jobs.add(act.job_id)
        self._log("job_finished", job=act.job_id)

    def gave_up(self, job: JobState, act: GaveUp) -> None:
        if act.job_id not in self.standby_ids:
            self.failed[act.job_id] = act.reason
        self._log("job_failed", job=act.job_id, reason=act.reason)

    # -- the simulated world ---------------------------------------------------------------------
    def _schedule_oracle(self, job_id: str, iid: str, offer: Offer) -> None:
        """The earliest instant anyone could observe each failure of this host."""
        truth = self.referee.truth_of(iid)
        created = self.clock.now()
        pull_s = self.referee.pull_seconds(iid)
        ready = created + pull_s
        events: list[tuple[float, str, str]] = []
        if truth.freeze_at_s is not None:
            events.append((created + truth.freeze_at_s, "boot_frozen", "oracle: freeze_at_s"))
        if truth.fatal_at_s is not None:
            events.append((created + truth.fatal_at_s, "boot_fatal", "oracle: fatal_at_s"))
        if truth.dies_at_s is not None:
            reason = "boot_vanished" if truth.dies_at_s < pull_s else "lost"
            events.append((created + truth.dies_at_s, reason, "oracle: dies_at_s"))
        if truth.hangs_at_s is not None:
            events.append((created + max(truth.hangs_at_s, pull_s), "hang", "oracle: hangs_at_s"))
        if truth.fatal_at_s is None and truth.freeze_at_s is None:
            if not truth.computes:
                events.append((ready, "no_compute", "oracle: computes false"))
            elif not same_gpu(offer.gpu_name, truth.actual_gpu_name):
                events.append((ready, "gpu_mismatch", "oracle: actual_gpu_name"))
            elif truth.actual_gpu_ram_gb < 0.95 * offer.gpu_ram_gb:
                events.append((ready, "vram_short", "oracle: actual_gpu_ram_gb"))
            elif truth.tflops_factor < 0.85:
                events.append((ready, "throttled", "oracle: tflops_factor"))
        for at, reason, evidence in events:
            self._push(at, "oracle", job_id, (iid, reason, evidence), prio=0)

    def _start_trainer(self, job_id: str, iid: str, *, resume_from_work_s: float) -> None:
        now = self.clock.now()
        live = self.live.get(iid)
        truth = self.referee.truth_of(iid)
        host = self.referee.host_of(iid)
        created = live.created_at if live is not None else now
        speed = truth.tflops_factor
        # a card of another model than offered computes at its own model's healthy speed
        offered = self.trace.gpu_models.get(canonical_gpu(host.offer.gpu_name))
        want = datasheet_tflops_bf16(host.offer.gpu_name)
        want = None if want is None else want * (offered.healthy_fraction if offered else 1.0)
        got = healthy_tflops_bf16(truth)
        if want and got and not same_gpu(host.offer.gpu_name, truth.actual_gpu_name):
            speed *= got / want
        fails_at: float | None = None
        error: str | None = None
        if not truth.computes:
            fails_at, error = now + TRAINER_CRASH_S, CUDA_ERROR
        elif truth.actual_gpu_ram_gb < 0.95 * host.offer.gpu_ram_gb:
            fails_at, error = now + OOM_S, OOM_ERROR
        first_create = self._instance_created_at(iid, created)
        self._end_trainer(iid)
        tr = SimTrainer(
            instance_id=iid,
            started_at=now,
            resume_work_s=resume_from_work_s,
            train_s=self.workload.train_seconds,
            checkpoint_every_s=self.workload.checkpoint_every_s,
            speed=speed,
            fails_at=fails_at,
            fail_error=error,
            hangs_at=None if truth.hangs_at_s is None else max(now, first_create + truth.hangs_at_s),
            dies_at=None if truth.dies_at_s is None else first_create + truth.dies_at_s,
        )
        self.trainers[iid] = tr
        self.all_trainers.append(tr)
        self._at_risk(iid)
        self._log("training_started", job=job_id, instance=iid, resume_from_work_s=resume_from_work_s)

    def _instance_created_at(self, iid: str, default: float) -> float:
        bill = self.referee.bill(iid)
        return bill.created_at if bill else default

    def _end_trainer(self, iid: str) -> None:
        tr = self.trainers.pop(iid, None)
        if tr is not None:
            self.trainer_stops[id(tr)] = self.clock.now()

    def _end_span(self, iid: str) -> None:
        span = self.standby_spans.get(iid)
        if span is not None and span[1] is None:
            self.standby_spans[iid] = (span[0], self.clock.now())

    def _stop_instance(self, iid: str, *, reason: str, evidence: str, job: str = "") -> None:
        self._off_risk(iid, lost=False)
        self.live.pop(iid, None)
        self._end_span(iid)
        self._end_trainer(iid)
        self.market.stop(iid)
        self._log("stopped", job=job, instance=iid, reason=reason, evidence=evidence)
