"""The campaign simulator: the provisioning policy driven in virtual time against SimMarket.

A second driver of the same policy functions Celery drives in real time
(`app.policy.provisioning.decide`): an event queue of wake-ups in virtual seconds, a
`VirtualClock` the simulated marketplace reads, and the actions applied through the Market port.
The receipt is computed by the simulated marketplace's own referee (truth and billing), never
from what the policy believed.

Around the per-job state machines the driver keeps what is campaign-wide: the hosts held for the
next job (hold and batch) and the warm standby pool (`standby_hosts`: standby jobs provision
verified hosts that wait; a recovery adopts one instead of pulling the image again), their
liveness (a held host that vanished is dropped and recorded), and the budget (a create reserves
its expected cost; a monitor every `BUDGET_CHECK_S` ends every job with `BudgetCapReached` before
spend can cross the campaign's `budget_usd`).

The one part of "the world" SimMarket does not model is the trainer on a rented host. `_SimTrainer`
plays it here, from the host's truth (speed from `tflops_factor`; `computes: false` fails at
once; VRAM below what the offer claimed runs out of memory; `hangs_at_s` stops progress;
`dies_at_s` loses the work since the last checkpoint). The policy sees only what a supervisor
would read: the provider's instance record and the trainer's status file.

No Celery import: the simulator runs in the CLI's process.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from app.market import LaunchSpec, MarketError, Offer, OfferQuery
from app.policy.bootwatch import pull_rate_gb_per_s
from app.policy.gpus import expected_tflops_bf16, same_gpu
from app.policy.preflight import PreflightReport
from app.policy.provisioning import (
    Action,
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
    decide,
    guarded_config,
    hand_over,
    hedge_width,
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
from app.policy.retry import HeldHost, standby_pool_size
from providers.sim.clock import VirtualClock
from providers.sim.market import SimMarket
from providers.sim.trace import HostTruth, Trace, load_trace

__all__ = ["POLICIES", "CampaignResult", "is_dead_host", "run_campaign", "run_campaign_file"]

POLICIES: dict[str, Callable[[], ProvisioningConfig]] = {
    "guarded": guarded_config,
    "naive": naive_config,
    "oracle": oracle_config,
}
PREFLIGHT_S = 15.0  # SSH connect, torch import, warm-up and the ~10 s timed matmul
TRAINER_CRASH_S = 30.0  # a trainer that cannot compute dies this long after it starts
OOM_S = 90.0  # a host with less VRAM than it claimed runs out of memory this long after start
HEARTBEAT_S = 10.0  # status.json rewrite period
RESERVE_FACTOR = 1.3  # a create reserves this multiple of its expected attempt cost
MAX_SIM_S = 30 * 24 * 3600.0
BUDGET_CHECK_S = 30.0  # the budget monitor's period
BUDGET_GUARD_S = 90.0  # stop when what bills now would cross the cap within this long
POOL_CHECK_S = 30.0  # held hosts are polled this often (one that vanished is dropped)
DEFAULT_REFILL_S = 600.0  # how long a standby refill is assumed to take before any host was verified


def is_dead_host(truth: HostTruth, *, offered_gpu: str, offered_ram_gb: float, pull_s: float) -> str | None:
    """The referee's rule: why a host never delivers a verified computing GPU matching its offer."""
    if truth.fatal_at_s is not None:
        return "fatal pull"
    if truth.freeze_at_s is not None:
        return "frozen pull"
    if truth.dies_at_s is not None and truth.dies_at_s < pull_s:
        return "vanished during boot"
    if not truth.computes:
        return "cannot compute"
    if not same_gpu(offered_gpu, truth.actual_gpu_name):
        return "wrong GPU"
    if truth.actual_gpu_ram_gb < 0.95 * offered_ram_gb:
        return "VRAM short"
    if truth.tflops_factor < 0.85:
        return "throttled"
    return None


@dataclass
class _SimTrainer:
    """The trainer on a sim host, played from truth. Work is measured in full-speed seconds."""

    instance_id: str
    started_at: float
    resume_work_s: float
    train_s: float
    checkpoint_every_s: float
    speed: float  # work seconds per second
    fails_at: float | None  # the trainer exits with an error
    fail_error: str | None
    hangs_at: float | None
    dies_at: float | None

    def _stall_at(self) -> float:
        times = [t for t in (self.fails_at, self.hangs_at, self.dies_at) if t is not None]
        return min(times) if times else math.inf

    def finish_at(self) -> float:
        need = max(self.train_s - self.resume_work_s, 0.0)
        t = self.started_at + need / self.speed if self.speed > 0 else math.inf
        return t if t <= self._stall_at() else math.inf

    def work_at(self, t: float) -> float:
        if t >= self.finish_at():
            return self.train_s
        until = min(t, self._stall_at(), self.finish_at())
        return min(self.train_s, self.resume_work_s + max(0.0, until - self.started_at) * self.speed)

    def training_seconds(self, until: float) -> float:
        """Wall seconds the GPU actually trained until `until`."""
        end = min(until, self._stall_at(), self.finish_at())
        return max(0.0, end - self.started_at)

    def checkpoint_at(self, t: float) -> float:
        w = self.work_at(t)
        if w >= self.train_s:
            return self.train_s
        return max(self.resume_work_s, math.floor(w / self.checkpoint_every_s) * self.checkpoint_every_s)


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


@dataclass
class _Live:
    job_id: str
    offer: Offer
    created_at: float
    trained: bool = False
    reserved_usd: float = 0.0


class _Campaign:
    def __init__(
        self, trace: Trace, policy: str, *, jobs: int | None, seed: int, trace_label: str, standby_hosts: int | None = None,
        progress_hedge_max: int | None = None,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; known: {sorted(POLICIES)}")
        self.trace = trace
        self.policy = policy
        self.trace_label = trace_label
        self.cfg = POLICIES[policy]()
        if standby_hosts is not None:
            if standby_hosts < 0:
                raise ValueError(f"standby_hosts must be >= 0, got {standby_hosts}")
            self.cfg = replace(self.cfg, standby_hosts=standby_hosts)
        if progress_hedge_max is not None and self.cfg.recovery_hedge > 1:
            if progress_hedge_max < 0:
                raise ValueError(f"progress_hedge_max must be >= 0, got {progress_hedge_max}")
            self.cfg = replace(self.cfg, progress_hedge_max=progress_hedge_max)
        self.clock = VirtualClock()
        self.t0 = self.clock.now()
        self.market = SimMarket(trace, self.clock)
        self.referee = self.market.referee
        self.rng = random.Random(seed)
        w = trace.workload
        self.workload = w
        self.n_jobs = jobs if jobs is not None else w.jobs
        self.budget_usd = w.budget_usd
        req = Requirements()
        self.shape = JobShape(download_gb=w.download_gb, train_s=w.train_seconds, disk_gb=w.disk_gb)
        self.req = req
        self.jobs: dict[str, JobState] = {
            f"job-{i + 1}": new_job(f"job-{i + 1}", req=req, shape=self.shape) for i in range(self.n_jobs)
        }
        self.real_jobs: tuple[str, ...] = tuple(self.jobs)
        self.standby_ids: set[str] = set()
        self.hedge_ids: set[str] = set()  # standby jobs started to hedge a recovery
        self.hedges_of: dict[str, list[str]] = {}  # recovering job -> the standby jobs hedging for it
        self.pull_rates: list[float] = []  # GB/s of every pull watched (finished boots, killed pulls)
        self.standby_spans: dict[str, list[float | None]] = {}  # instance -> [start, end]: waiting as standby
        self.budget_stopped = False
        self.wake: dict[str, float] = {}
        self.queue: list[tuple[float, int, int, str, str, Any]] = []
        self.seq = itertools.count()
        self.records: dict[str, MachineRecord] = {}
        self.held: dict[str, HeldHost] = {}
        self.live: dict[str, _Live] = {}  # instance id -> what we rented it for
        self.trainers: dict[str, _SimTrainer] = {}  # instance id -> trainer
        self.all_trainers: list[_SimTrainer] = []
        self.trainer_stops: dict[int, float] = {}  # id(trainer) -> when the job left it
        self.destroyed_untrained: set[str] = set()
        self.recoveries: list[dict[str, Any]] = []
        self.recovery_facts: list[dict[str, float]] = []
        self.loss_noticed: dict[str, float] = {}  # job -> when its lost/hung host was stopped
        self.ledger: list[dict[str, Any]] = []
        # The loss rate of verified hosts, as the driver observes it: hosts at risk since when,
        # exposure of those gone, losses (lost or hung while training or waiting), and how long
        # each verified host took from its create.
        self.at_risk_since: dict[str, float] = {}
        self.exposure_s = 0.0
        self.losses = 0
        self.verify_s: list[float] = []
        self.pool_size = self.cfg.standby_hosts
        self.finished: set[str] = set()
        self.failed: dict[str, str] = {}

    # -- event queue ------------------------------------------------------------------------
    def _push(self, at: float, kind: str, job_id: str, payload: Any = None, prio: int = 1) -> None:
        heapq.heappush(self.queue, (at, prio, next(self.seq), kind, job_id, payload))

    def _wake(self, job_id: str, at: float) -> None:
        self.wake[job_id] = at
        self._push(at, "wake", job_id, at)

    def _log(self, kind: str, **fields: Any) -> None:
        self.ledger.append({"t_s": round(self.clock.now() - self.t0, 3), "kind": kind, **fields})

    # -- the loop ---------------------------------------------------------------------------
    def _real_jobs_over(self) -> bool:
        return all(j in self.finished or j in self.failed for j in self.real_jobs)

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
                if self.wake.get(job_id) != payload:
                    continue  # superseded
                self._on_wake(job_id)
            elif kind == "preflight":
                owner = self._job_of_instance(payload[0])  # the attempt may have been handed over
                if owner is not None and self.jobs[owner].phase == "preflight":
                    self._feed(owner, payload[1])
            elif kind == "oracle":
                iid, reason, evidence = payload
                owner = self._job_of_instance(iid)
                if owner is not None and self.jobs[owner].phase in ("booting", "preflight", "training"):
                    self._feed(owner, FailureSeen(reason, evidence))
            elif kind == "hold_expired":
                self._hold_expired(payload)
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
        return self._receipt(end)

    # -- the standby pool and held hosts ----------------------------------------------------
    def _pool_missing(self, *, besides: int = 0) -> int:
        """How many more verified hosts the standby pool wants (0 once every job is over), not
        counting `besides` of the held hosts."""
        if self.cfg.standby_hosts <= 0 or self._real_jobs_over() or self.budget_stopped:
            return 0
        return max(0, self._pool_target() - (len(self.held) - besides))

    def _pool_target(self) -> int:
        """The standby pool's size: `standby_hosts`, grown while the observed loss rate says a
        second loss would likely come before an adopted standby's refill is verified."""
        cfg = self.cfg
        now = self.clock.now()
        exposure = self.exposure_s + sum(now - t for t in self.at_risk_since.values())
        refill = statistics.median(self.verify_s) if self.verify_s else DEFAULT_REFILL_S
        at_most = cfg.standby_hosts_max if cfg.standby_hosts_max is not None else 2 * cfg.standby_hosts
        size = standby_pool_size(
            configured=cfg.standby_hosts, at_most=at_most, losses=self.losses, exposure_s=exposure,
            hosts_at_risk=len(self.at_risk_since), refill_s=refill, miss_p=cfg.standby_miss_p,
        )
        if size != self.pool_size:
            self.pool_size = size
            self._log("standby_pool", size=size, losses=self.losses, exposure_s=round(exposure, 1),
                      hosts_at_risk=len(self.at_risk_since), refill_s=round(refill, 1))
        return size

    def _at_risk(self, iid: str) -> None:
        """A verified host (training or waiting) is now exposed to being lost."""
        self.at_risk_since.setdefault(iid, self.clock.now())

    def _off_risk(self, iid: str, *, lost: bool) -> None:
        since = self.at_risk_since.pop(iid, None)
        if since is not None:
            self.exposure_s += self.clock.now() - since
            self.losses += lost

    def _job_of_instance(self, iid: str) -> str | None:
        for job_id, job in self.jobs.items():
            if job.attempt is not None and job.attempt.instance_id == iid:
                return job_id
        return None

    def _new_standby_job(self, *, hedge_for: str | None = None, why: str = "", rentals: int | None = None) -> str:
        job_id = f"standby-{len(self.standby_ids) + 1}"
        self.standby_ids.add(job_id)
        if hedge_for is not None:
            self.hedge_ids.add(job_id)
            self.hedges_of.setdefault(hedge_for, []).append(job_id)
        self.jobs[job_id] = new_job(job_id, req=self.req, shape=self.shape, standby=True, rentals_max=rentals)
        self._log("standby_wanted", job=job_id, hedge_for=hedge_for, why=why, rentals=rentals)
        return job_id

    def _recovery_served_by(self, job_id: str) -> str | None:
        """The waiting recovery this job's provisioning works for (itself, or the job it hedges for)."""
        if job_id in self.hedge_ids:
            job_id = next((j for j, hs in self.hedges_of.items() if job_id in hs), job_id)
        job = self.jobs.get(job_id)
        if job is None or job.standby or job.lost_at is None or job.phase not in ("queued", "booting", "preflight"):
            return None
        return job_id

    def _watch_pull(self, before: JobState, after: JobState) -> None:
        """Remember the pull rate of an attempt that just left its boot: a finished boot's rate
        from create to running, a killed pull's from its status line."""
        att = before.attempt
        if before.phase != "booting" or att is None:
            return
        now = self.clock.now()
        if after.attempt is not None and after.attempt.instance_id == att.instance_id:
            if after.phase != "booting" and now > att.created_at:
                self.pull_rates.append(self.shape.download_gb / (now - att.created_at))
            return
        rate = pull_rate_gb_per_s(att.watch)
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
        self._feed(rec, RecoveryProgress(chains=chains, view=view), draw=False)

    def _standby_still_wanted(self, job_id: str) -> bool:
        """A standby job that has not yet rented a host: is it still needed (the pool is short,
        or a job it hedges for, or any other, is still waiting for its recovery)?"""
        if self._real_jobs_over() or self.budget_stopped:
            return False
        if self._pool_missing() > 0:
            return True
        return any(self.jobs[j].lost_at is not None for j in self.real_jobs if self.jobs[j].phase not in ("done", "failed"))

    def _top_up_standby(self) -> None:
        # Each missing host is provisioned by parallel chains, as many as the observed dud rate asks
        # (`hedge_width`: a dud on one chain does not leave the pool empty for long); chains no
        # longer needed stop between attempts.
        missing = self._pool_missing()
        if missing <= 0:
            return
        pending = sum(1 for j in self.standby_ids if self.jobs[j].phase not in ("done", "failed"))
        for _ in range(missing * hedge_width(self.cfg, self.records) - pending):
            self._wake(self._new_standby_job(), self.clock.now())

    def _offer_to_recoveries(self) -> None:
        """A verified host waits: a recovering job whose own replacement is still booting hands that
        attempt over to a standby job and adopts the waiting host; a queued one looks at once."""
        now = self.clock.now()
        recovering = sorted(
            (j for j in self.real_jobs if self.jobs[j].lost_at is not None and self.jobs[j].phase in ("queued", "booting", "preflight")),
            key=lambda j: self.jobs[j].lost_at or 0.0,
        )
        for job_id in recovering:
            if not self.held:
                return
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
                self.standby_spans[iid] = [now, None]
                self._log("handed_over", job=job_id, to=standby_id, instance=iid)
                self._wake(standby_id, now)
            self._feed(job_id, Tick(view=self._view(self.jobs[job_id])))

    def _hold_expired(self, iid: str) -> None:
        h = self.held.get(iid)
        now = self.clock.now()
        if h is None or h.hold_until > now + 1e-9:
            return  # adopted, dropped, or renewed since
        if self._pool_missing(besides=1) > 0:
            # Keep it as the standby rather than renting another and pulling the image again.
            h = replace(h, hold_until=now + self.cfg.standby_hold_s, standby=True)
            self.held[iid] = h
            self.standby_spans.setdefault(iid, [now, None])
            self._push(h.hold_until, "hold_expired", "", iid)
            self._log("hold_renewed", instance=iid, machine=h.machine_id, until_s=h.hold_until - self.t0)
            return
        self.held.pop(iid)
        self._stop_instance(iid, reason="hold expired", evidence="no compatible job within the hold")

    def _check_pool(self) -> None:
        """Poll the held hosts: one that vanished while it waited is dropped and recorded."""
        for iid, h in list(self.held.items()):
            inst = self.market.status(iid)
            if inst.state != "running":
                self._drop_held(h, f"held host reported {inst.state}")
        if self.held:
            self._push(self.clock.now() + POOL_CHECK_S, "pool_check", "")

    def _drop_held(self, h: HeldHost, evidence: str) -> None:
        self.held.pop(h.instance_id, None)
        self._off_risk(h.instance_id, lost=True)
        self._stop_instance(h.instance_id, reason="lost", evidence=evidence)
        self._record(Record(h.machine_id, h.provider, "failure", "lost", evidence))

    def _check_budget(self) -> None:
        """The budget monitor: end every job before what bills now could cross the cap."""
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
        if spent + burn_per_s * BUDGET_GUARD_S < self.budget_usd:
            self._push(now + BUDGET_CHECK_S, "budget_check", "")
            return
        self.budget_stopped = True
        cap = f"campaign budget ${self.budget_usd:.2f}"
        evidence = f"${spent:.4f} billed, ${burn_per_s * 3600:.4f}/h still billing"
        self._log("budget_cap", spent_usd=round(spent, 4), budget_usd=self.budget_usd)
        for job_id in list(self.jobs):
            if self.jobs[job_id].phase not in ("done", "failed"):
                self._feed(job_id, BudgetCapReached(cap, evidence))
        for iid in list(self.held):
            self._stop_instance(self.held.pop(iid).instance_id, reason="budget_cap", evidence=evidence)

    def _on_wake(self, job_id: str) -> None:
        job = self.jobs[job_id]
        att = job.attempt
        obs: Observation
        if job.phase == "queued" and job_id in self.standby_ids and not self._standby_still_wanted(job_id):
            # Between attempts and nobody needs it any more: stop rolling the dice.
            self.jobs[job_id] = replace(job, phase="done", failure="no longer needed")
            self._log("standby_cancelled", job=job_id)
            return
        if job.phase == "queued":
            view = self._view(job)
            if view.budget_left_usd is not None and not self.live and not self.held and (
                view.budget_left_usd < self._cheapest_attempt(list(view.offers))
            ):
                # Nothing rented any more and what is left cannot pay for one attempt.
                cap = f"campaign budget ${self.budget_usd:.2f}"
                obs = BudgetCapReached(cap, f"${view.budget_left_usd:.4f} left, less than the cheapest attempt")
            else:
                obs = Tick(view=view)
        elif att is None:
            return
        elif job.phase in ("booting", "preflight"):
            obs = Polled(self.market.status(att.instance_id))
        elif job.phase == "training":
            obs = self._trainer_status(att.instance_id)
        else:
            return
        self._feed(job_id, obs)
        if isinstance(obs, Polled):
            self._watch_pull(job, self.jobs[job_id])
            self._check_recovery_progress(job_id)

    def _feed(self, job_id: str, obs: Observation, *, draw: bool = True) -> None:
        """Decide on the observation and apply the actions. `draw=False`: the decision needs no
        jitter, so draw none (the random stream, and every later backoff, stays as it was)."""
        pending: list[tuple[str, Observation]] = [(job_id, obs)]
        while pending:
            jid, o = pending.pop(0)
            jitter_u = self.rng.random() if draw else 0.5
            draw = True
            job, actions = decide(self.jobs[jid], o, self.clock.now(), cfg=self.cfg, jitter_u=jitter_u)
            self.jobs[jid] = job
            for act in actions:
                follow = self._apply(act)
                if follow is not None:
                    pending.append((jid, follow))

    # -- observations -----------------------------------------------------------------------
    def _view(self, job: JobState) -> MarketView:
        offers = self.market.search_offers(OfferQuery(limit=0))
        budget_left = None
        if self.budget_usd is not None and self.cfg.watch_budget:
            budget_left = self.budget_usd - self._committed_usd()
        return MarketView(
            offers=tuple(offers), records=dict(self.records), held=tuple(self.held.values()), budget_left_usd=budget_left
        )

    def _cheapest_attempt(self, offers: list[Offer]) -> float:
        return min((self._attempt_cost(o) for o in offers), default=math.inf)

    def _attempt_cost(self, o: Offer) -> float:
        s = self.shape
        return attempt_cost_usd(
            dph_total=o.dph_total, storage_per_gb_month=o.storage_per_gb_month, inet_down_per_gb=o.inet_down_per_gb,
            inet_down_mbps=o.inet_down_mbps, download_gb=s.download_gb, train_s=s.train_s, disk_gb=s.disk_gb,
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

    def _trainer_status(self, iid: str) -> TrainerStatus:
        inst = self.market.status(iid)
        tr = self.trainers.get(iid)
        now = self.clock.now()
        if tr is None:
            return TrainerStatus(inst, None)
        if inst.state == "gone":
            last_beat = tr.dies_at if tr.dies_at is not None else now
            beat = math.floor(max(0.0, last_beat - tr.started_at) / HEARTBEAT_S) * HEARTBEAT_S + tr.started_at
            return TrainerStatus(inst, None, heartbeat_at=beat)
        work = tr.work_at(now)
        ckpt = tr.checkpoint_at(now)
        if work >= tr.train_s - 1e-9:
            return TrainerStatus(inst, "finished", work_s=work, checkpoint_work_s=ckpt, heartbeat_at=now)
        if tr.fails_at is not None and now >= tr.fails_at:
            return TrainerStatus(inst, "failed", work_s=work, checkpoint_work_s=ckpt, heartbeat_at=tr.fails_at, error=tr.fail_error)
        return TrainerStatus(inst, "training", work_s=work, checkpoint_work_s=ckpt, heartbeat_at=now)

    # -- actions ----------------------------------------------------------------------------
    def _apply(self, act: Action) -> Observation | None:
        now = self.clock.now()
        if isinstance(act, WakeAt):
            self._wake(act.job_id, max(act.at, now))
        elif isinstance(act, Create):
            return self._create(act)
        elif isinstance(act, Adopt):
            h = self.held.pop(act.held.instance_id, None)
            if h is None:
                self._wake(act.job_id, now)
                return None
            state = self.market.status(h.instance_id).state
            if state != "running":  # it vanished while it waited: drop it, look again
                self.held[h.instance_id] = h
                self._drop_held(h, f"held host reported {state} when adopted")
                self._wake(act.job_id, now)
                return None
            span = self.standby_spans.get(h.instance_id)
            if span is not None and span[1] is None:
                span[1] = now
            self.live[h.instance_id] = _Live(act.job_id, Offer(
                provider=h.provider, offer_id="held", machine_id=h.machine_id, gpu_name=h.gpu_name, num_gpus=h.num_gpus,
                gpu_ram_gb=h.gpu_ram_gb, dph_total=h.dph_total, storage_per_gb_month=None, inet_down_per_gb=None,
                inet_down_mbps=None, reliability=None, cuda_max=None), now, trained=True)
            self._log("host_adopted", job=act.job_id, instance=h.instance_id, machine=h.machine_id)
            return Adopted(h)
        elif isinstance(act, Destroy):
            if act.reason in ("lost", "hang"):
                self.loss_noticed[act.job_id] = now
            live = self.live.pop(act.instance_id, None)
            if live is not None and not live.trained:
                self.destroyed_untrained.add(act.instance_id)
            self._end_trainer(act.instance_id)
            self.market.destroy(act.instance_id)
            self._log("destroyed", job=act.job_id, instance=act.instance_id, machine=act.machine_id, reason=act.reason, evidence=act.evidence)
        elif isinstance(act, Stop):
            if act.reason in ("lost", "hang"):
                self.loss_noticed[act.job_id] = now
                self._off_risk(act.instance_id, lost=True)
            self.live.pop(act.instance_id, None)
            self._stop_instance(act.instance_id, reason=act.reason, evidence=act.evidence, job=act.job_id)
        elif isinstance(act, Record):
            self._record(act)
        elif isinstance(act, RunPreflight):
            raw = self.referee.preflight_report(act.instance_id)
            res = (
                PreflightResult(None, "ssh_unreachable", "no SSH endpoint")
                if raw is None
                else PreflightResult(PreflightReport.from_mapping(raw))
            )
            self._push(now + PREFLIGHT_S, "preflight", act.job_id, (act.instance_id, res), prio=0)
        elif isinstance(act, StartTraining):
            self._start_trainer(act)
        elif isinstance(act, WantStandby):
            for _ in range(act.count):
                self._wake(self._new_standby_job(hedge_for=act.job_id, why=act.why, rentals=act.rentals), now)
        elif isinstance(act, Hold):
            if self.budget_stopped:
                self._stop_instance(act.host.instance_id, reason="budget_cap", evidence="no holds after the cap")
                return None
            host = act.host
            if act.job_id in self.standby_ids and self._pool_missing() == 0:
                # A hedge (or a handed-over attempt) the pool does not want: an ordinary held host.
                host = replace(host, standby=False, hold_until=now + self.cfg.hold_s)
            if not self.held:
                self._push(now + POOL_CHECK_S, "pool_check", "")
            self.held[host.instance_id] = host
            if host.instance_id not in self.at_risk_since:  # a standby job's host, just verified
                self.verify_s.append(now - self._instance_created_at(host.instance_id, now))
            self._at_risk(host.instance_id)
            live = self.live.get(act.host.instance_id)
            if live is not None:  # what the hold may still bill
                live.reserved_usd = self.referee.bill(act.host.instance_id).total_usd + act.host.dph_total * min(
                    act.host.hold_until - now, 3600.0) / 3600.0
            self._push(host.hold_until, "hold_expired", act.job_id, host.instance_id)
            self._log("held", job=act.job_id, instance=host.instance_id, until_s=host.hold_until - self.t0,
                      standby=host.standby)
            self._offer_to_recoveries()
        elif isinstance(act, Recovered):
            self.hedges_of.pop(act.job_id, None)
            att = self.jobs[act.job_id].attempt
            self.recovery_facts.append({
                "detect_s": self.loss_noticed.get(act.job_id, act.lost_at) - act.lost_at,
                "replacement_pull_s": self.referee.pull_seconds(att.instance_id) if att is not None else 0.0,
            })
            self.recoveries.append({
                "job": act.job_id, "machine_id": act.machine_id, "cause": act.cause,
                "lost_at_s": round(act.lost_at - self.t0, 3), "resumed_at_s": round(act.resumed_at - self.t0, 3),
            })
        elif isinstance(act, Finished):
            if act.job_id not in self.standby_ids:
                self.finished.add(act.job_id)
            self._log("job_finished", job=act.job_id)
        elif isinstance(act, GaveUp):
            if act.job_id not in self.standby_ids:
                self.failed[act.job_id] = act.reason
            self._log("job_failed", job=act.job_id, reason=act.reason)
        return None

    def _create(self, act: Create) -> Observation:
        spec = LaunchSpec(image="tuneharness/trainer:sim", disk_gb=self.workload.disk_gb, label=f"th-{act.job_id}", ssh_public_key="ssh-ed25519 sim")
        try:
            iid = self.market.create(act.offer, spec)
        except MarketError as exc:
            self._log("create_failed", job=act.job_id, offer=act.offer.offer_id, error=str(exc))
            return CreateResult(act.offer, None, str(exc))
        reserved = self._attempt_cost(act.offer) * RESERVE_FACTOR
        self.live[iid] = _Live(act.job_id, act.offer, self.clock.now(), reserved_usd=reserved)
        if act.job_id in self.standby_ids:
            self.standby_spans[iid] = [self.clock.now(), None]
        self._log("created", job=act.job_id, instance=iid, machine=act.offer.machine_id, rate_usd_per_hour=act.offer.dph_total, reason=act.why)
        if self.cfg.failures_seen_at_once:
            self._schedule_oracle(act.job_id, iid, act.offer)
        return CreateResult(act.offer, iid)

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

    def _record(self, act: Record) -> None:
        now = self.clock.now()
        rec = self.records.get(act.machine_id) or MachineRecord(machine_id=act.machine_id, provider=act.provider)
        if act.event == "create":
            rec = record_create(rec, now=now)
        elif act.event == "boot":
            rec = record_boot(rec, now=now)
        elif act.event == "preflight_passed":
            rec = record_preflight_passed(rec, now=now)
        elif act.event == "slice_finished":
            rec = record_slice_finished(rec, now=now)
        else:
            rec = record_failure(rec, reason=act.reason or "lost", now=now)
            self._log("host_failed", machine=act.machine_id, reason=act.reason, evidence=act.evidence,
                      quarantined=rec.quarantine_permanent or rec.quarantined_until is not None)
        self.records[act.machine_id] = rec

    def _start_trainer(self, act: StartTraining) -> None:
        now = self.clock.now()
        iid = act.instance_id
        live = self.live.get(iid)
        if live is not None:
            live.trained = True
        truth = self.referee.truth_of(iid)
        host = self.referee.host_of(iid)
        created = live.created_at if live is not None else now
        speed = truth.tflops_factor
        want, got = expected_tflops_bf16(host.offer.gpu_name), expected_tflops_bf16(truth.actual_gpu_name)
        if want and got and not same_gpu(host.offer.gpu_name, truth.actual_gpu_name):
            speed *= got / want
        fails_at: float | None = None
        error: str | None = None
        if not truth.computes:
            fails_at, error = now + TRAINER_CRASH_S, "RuntimeError: CUDA error: CUDA driver version is insufficient"
        elif truth.actual_gpu_ram_gb < 0.95 * host.offer.gpu_ram_gb:
            fails_at, error = now + OOM_S, "torch.OutOfMemoryError: CUDA out of memory"
        first_create = self._instance_created_at(iid, created)
        tr = _SimTrainer(
            instance_id=iid, started_at=now, resume_work_s=act.resume_from_work_s, train_s=self.workload.train_seconds,
            checkpoint_every_s=self.workload.checkpoint_every_s, speed=speed, fails_at=fails_at, fail_error=error,
            hangs_at=None if truth.hangs_at_s is None else max(now, first_create + truth.hangs_at_s),
            dies_at=None if truth.dies_at_s is None else first_create + truth.dies_at_s,
        )
        self.trainers[iid] = tr
        self.all_trainers.append(tr)
        if iid not in self.at_risk_since and self.jobs[act.job_id].attempt is not None:
            self.verify_s.append(now - first_create)
        self._at_risk(iid)
        self._log("training_started", job=act.job_id, instance=iid, resume_from_work_s=act.resume_from_work_s)

    def _instance_created_at(self, iid: str, default: float) -> float:
        bill = self.referee.bill(iid)
        return bill.created_at if bill else default

    def _end_trainer(self, iid: str) -> None:
        tr = self.trainers.pop(iid, None)
        if tr is not None:
            self.trainer_stops[id(tr)] = self.clock.now()

    def _stop_instance(self, iid: str, *, reason: str, evidence: str, job: str = "") -> None:
        self._off_risk(iid, lost=False)
        self.live.pop(iid, None)
        span = self.standby_spans.get(iid)
        if span is not None and span[1] is None:
            span[1] = self.clock.now()
        self._end_trainer(iid)
        self.market.stop(iid)
        self._log("stopped", job=job, instance=iid, reason=reason, evidence=evidence)

    # -- the referee's receipt ---------------------------------------------------------------
    def _receipt(self, end: float) -> dict[str, Any]:
        bills = self.referee.bills(as_of_s=end)
        dead_cost = 0.0
        dead_life: list[float] = []
        good_destroyed = 0
        for bill in bills:
            host = self.referee.host_of(bill.instance_id)
            why = is_dead_host(
                bill.truth, offered_gpu=host.offer.gpu_name, offered_ram_gb=host.offer.gpu_ram_gb,
                pull_s=self.referee.pull_seconds(bill.instance_id),
            )
            if why is not None:
                dead_cost += bill.total_usd
                ended = bill.ended_at if bill.ended_at is not None else end
                dead_life.append(ended - bill.created_at)
            elif bill.instance_id in self.destroyed_untrained:
                good_destroyed += 1
        train_s = 0.0
        idle_s = 0.0
        for tr in self.all_trainers:
            left = self.trainer_stops.get(id(tr), end)
            gone = tr.dies_at if tr.dies_at is not None else math.inf
            assigned_until = min(left, gone, tr.finish_at())
            trained = tr.training_seconds(assigned_until)
            train_s += trained
            idle_s += max(0.0, assigned_until - tr.started_at - trained)
        rec_s = sorted(r["resumed_at_s"] - r["lost_at_s"] for r in self.recoveries)
        total = sum(b.total_usd for b in bills)
        standby_usd = 0.0
        for iid, (start, stop) in self.standby_spans.items():
            assert start is not None
            standby_usd += self.referee.bill(iid, as_of_s=end if stop is None else stop).total_usd
            standby_usd -= self.referee.bill(iid, as_of_s=start).total_usd
        unfinished = [{"job": j, "reason": self.failed[j]} for j in self.real_jobs if j in self.failed]
        return {
            "policy": self.policy,
            "trace": self.trace_label,
            "creates": len(bills),
            "dead_hosts": len(dead_life),
            "dead_host_cost_usd": round(dead_cost, 4),
            "dead_host_mean_lifetime_s": round(statistics.fmean(dead_life), 1) if dead_life else 0.0,
            "good_hosts_destroyed": good_destroyed,
            "jobs_completed": len(self.finished),
            "jobs_failed": len(self.failed),
            "total_cost_usd": round(total, 4),
            "train_gpu_seconds": round(train_s, 1),
            "idle_gpu_seconds_billed": round(idle_s, 1),
            "recoveries": self.recoveries,
            "recovery_median_s": round(statistics.median(rec_s), 1) if rec_s else None,
            "recovery_p90_s": round(_p90(rec_s), 1) if rec_s else None,
            "budget_usd": self.budget_usd,
            "budget_exceeded": self.budget_usd is not None and total > self.budget_usd + 1e-9,
            "sim_seconds": round(end - self.t0, 1),
            "standby_hosts": self.cfg.standby_hosts,
            "standby_cost_usd": round(standby_usd, 4),
            "unfinished_jobs": unfinished,
        }


def _p90(sorted_values: list[float]) -> float:
    """Nearest-rank 90th percentile."""
    k = max(0, math.ceil(0.9 * len(sorted_values)) - 1)
    return sorted_values[k]


def run_campaign(
    trace: Trace, *, policy: str = "guarded", jobs: int | None = None, seed: int = 0, trace_label: str | None = None,
    standby_hosts: int | None = None, progress_hedge_max: int | None = None,
) -> CampaignResult:
    """Replay one campaign in virtual time; the receipt comes from the simulator's referee.

    `standby_hosts` overrides the policy's warm standby pool (default: the policy's, 0);
    `progress_hedge_max` its extra rentals per waiting recovery whose chains pull slowly (default:
    the policy's, 0; naive never hedges).
    """
    c = _Campaign(
        trace, policy, jobs=jobs, seed=seed, trace_label=trace_label or trace.name, standby_hosts=standby_hosts,
        progress_hedge_max=progress_hedge_max,
    )
    receipt = c.run()
    return CampaignResult(receipt=receipt, ledger=c.ledger, unfinished=dict(c.failed), recovery_facts=c.recovery_facts)


def run_campaign_file(
    path: str, *, policy: str = "guarded", jobs: int | None = None, seed: int = 0, standby_hosts: int | None = None
) -> CampaignResult:
    """`run_campaign` on a trace file (or a shipped trace's name)."""
    trace = load_trace(path)
    return run_campaign(trace, policy=policy, jobs=jobs, seed=seed, trace_label=str(path), standby_hosts=standby_hosts)
