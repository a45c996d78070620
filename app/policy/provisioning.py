"""One job's way from "queued" to "trained": the provisioning state machine.

`decide(job, obs, now, cfg=..., view=...) -> (job, actions)`. The driver (Celery in real time,
the campaign simulator in virtual time) feeds observations and applies the actions; this module
does no I/O, reads no clock and draws no random numbers.

    queued --Create--> booting --BootReady--> preflight --passed--> training --finished--> done
       ^                  |                       |                     |
       +-- BootKill: Destroy, quarantine ---------+-- failed: Destroy,  +-- lost/hang: Stop,
                                                       quarantine            record, re-queue

Automation destroys only an instance that never held the job's work (a failed boot or
preflight); once training started on it, the most automation does is stop it.

Three configurations share this code: `guarded` (the product), `naive` (the renter before any of
this: cheapest hourly offer, no status-line watch, waits 30 min for `running`, no preflight, no
quarantine, a dead training noticed after 105 min) and `oracle` (guarded choices, with failures
reported by the driver at the earliest instant anyone could observe them, via `FailureSeen`).

A job made with `new_job(..., standby=True)` provisions a warm standby host instead of training:
once verified, the host is held (`Hold`) for the next job that needs one, so a recovery skips
the image pull (`ProvisioningConfig.standby_hosts`, kept by the driver). A `BudgetCapReached`
observation ends any job where it stands: its host stopped (destroyed only if it never held the
job's work), nothing new rented, the cap named.

A recovery that finds no verified host waiting hedges: with its own create it asks the driver for
`recovery_hedge - 1` standby jobs (`WantStandby`); whichever host is verified first takes the job
(`hand_over` moves the job's own attempt, still booting, to a standby job), the others wait as
standby. On a marketplace where most rentals are duds, one chain of attempts often meets a dud
first; parallel chains bring the median recovery back to one image pull.

While such a recovery waits, the driver shows it the chains that work for it (`RecoveryProgress`):
a chain whose pull, at the rate its status line has shown, will end later than a fresh rental's
would (the median pull rate observed on this marketplace, plus `progress_hedge_margin_s`) is slow;
for each slow chain one more rental is started (`WantStandby(..., rentals=1)`: a standby job that
rents once and does not retry after a dud), at most `progress_hedge_max` per recovery. A slow
chain is never destroyed: it is healthy as far as anyone can see, and its host, once verified,
waits like any other hedge.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from app.market import Instance, Offer
from app.policy.bootwatch import (
    BootKill,
    BootReady,
    BootWatch,
    BootWatchConfig,
    observe_boot,
    projected_pull_done_at,
    pull_rate_gb_per_s,
    start_watch,
)
from app.policy.gpus import hardware_key
from app.policy.preflight import PreflightReport, judge_preflight, unreachable
from app.policy.ranking import (
    JobShape,
    RankedOffer,
    ReliabilityFloor,
    Requirements,
    machine_key,
    market_delivery_rate,
    rank_offers,
)
from app.policy.reputation import MachineRecord, is_quarantined
from app.policy.retry import (
    HeldHost,
    backoff_s,
    fresh_pull_s,
    hedge_chains,
    may_create,
    pick_held_host,
)
from app.policy.speeds import SpeedSample, expected_speed, speed_model

__all__ = [
    "Action",
    "Adopt",
    "Attempt",
    "BudgetCapReached",
    "BudgetRefused",
    "Create",
    "Destroy",
    "FailureSeen",
    "Finished",
    "GaveUp",
    "Hold",
    "JobState",
    "MarketView",
    "Observation",
    "Polled",
    "PreflightResult",
    "ProvisioningConfig",
    "Record",
    "Recovered",
    "RecoveryProgress",
    "RunPreflight",
    "StartTraining",
    "Stop",
    "Tick",
    "TrainerStatus",
    "WakeAt",
    "WantStandby",
    "choose_host",
    "decide",
    "guarded_config",
    "hand_over",
    "hedge_width",
    "naive_config",
    "new_job",
    "oracle_config",
    "ranked_offers",
    "slow_chains",
]

Phase = Literal["queued", "booting", "preflight", "training", "done", "failed"]


@dataclass(frozen=True, slots=True)
class ProvisioningConfig:
    name: str = "guarded"
    boot: BootWatchConfig = field(default_factory=BootWatchConfig)
    preflight: bool = True
    quarantine: bool = True
    rank_by: Literal["delivered_cost", "hourly"] = "delivered_cost"
    max_creates_per_job: int = 25
    preflight_timeout_s: float = 180.0
    monitor_s: float = 30.0  # training poll interval
    stall_s: float = 600.0  # no training progress for this long while alive: a hang
    idle_stall_s: float = 60.0  # no progress AND GPU utilisation <= idle_util_pct: a hang sooner
    idle_util_pct: float = 5.0
    notice_delay_s: float = 0.0  # how long a dead/hung training goes unnoticed (naive: 105 min)
    hold_s: float = 600.0
    backoff_base_s: float = 5.0
    backoff_cap_s: float = 300.0
    queue_retry_s: float = 30.0  # no offer fits now: look again this much later
    jitter_u: float = 0.5  # set per decision by `decide(..., jitter_u=)`; 0.5 = no jitter
    max_offer_wait_s: float = 6 * 3600.0  # no offer fits for this long: give the job up
    create_confirm_poll_s: float = 15.0  # a create whose answer was lost: look for it by label this often
    create_confirm_s: float = 300.0  # ... and take it as never done when nothing is listed after this long
    # The platform's reliability score: a filter relaxed only when nothing above it is left
    # ("fallback"), or only the prior of the delivery probability ("prior"; see ranking).
    reliability_floor: ReliabilityFloor = "prior"
    # Warm standby: verified hosts the driver keeps waiting while jobs run, so a recovery adopts
    # one instead of pulling the image again. The driver provisions them as standby jobs.
    standby_hosts: int = 0
    standby_hold_s: float = 6 * 3600.0  # a standby host's hold; the driver renews or releases it
    recovery_hedge: int = 3  # parallel provisioning chains for a recovery with no verified host waiting (at least)
    # ... widened, up to recovery_hedge_max, until P(some chain's first rental delivers) reaches
    # hedge_first_try_p at the delivery rate observed on the marketplace (retry.hedge_chains).
    recovery_hedge_max: int = 6
    hedge_first_try_p: float = 0.9
    # The standby pool grows past standby_hosts (up to standby_hosts_max; None: twice
    # standby_hosts) while the loss rate observed on verified hosts makes it likely (above
    # standby_miss_p) that another loss comes before an adopted standby's refill is verified
    # (retry.standby_pool_size). standby_hosts=0 keeps no pool at all.
    standby_hosts_max: int | None = None
    standby_miss_p: float = 0.2
    # Progress-aware hedging: while a recovery waits, each of its chains whose pull (at the rate
    # its status line shows) ends later than a fresh rental's would, at the median pull rate
    # observed on this marketplace plus progress_hedge_margin_s, gets one more rental (a standby
    # job that does not retry), at most progress_hedge_max per recovery (0: off). Slow chains are
    # never destroyed.
    progress_hedge_max: int = 0  # off by default: measured in docs/simulation.md (it costs more than it saves)
    progress_hedge_margin_s: float = 60.0
    # What a lost or hung host that held work gets: stopped (the product), or destroyed (the naive
    # renter throws it away, as it always did).
    destroy_lost_hosts: bool = False
    # The budget is watched (a reservation before each create, the budget monitor's stop); the naive
    # renter does not check it.
    watch_budget: bool = True
    # The driver reports each failure at the earliest instant anyone could observe it (FailureSeen):
    # the oracle, the physical limit of any renter.
    failures_seen_at_once: bool = False
    # Money: a create reserves reserve_factor x its expected attempt cost before it is made; the
    # budget monitor stops every job under a cap once what was billed plus budget_guard_s of what
    # still bills would reach it (app.policy.fleet).
    reserve_factor: float = 1.3
    budget_guard_s: float = 90.0
    # A create whose answer was lost bills unseen, and ending it takes a listing that may fail: it is
    # looked for once what it billed plus this long of its burn would reach what was reserved for it
    # (five budget-monitor passes: four failed look-ups in a row still end it within its reservation).
    unconfirmed_guard_s: float = 300.0


def guarded_config() -> ProvisioningConfig:
    return ProvisioningConfig()


def oracle_config() -> ProvisioningConfig:
    """Guarded choices; the driver reports each failure at its physical instant (FailureSeen)."""
    return replace(ProvisioningConfig(), name="oracle", failures_seen_at_once=True)


def naive_config() -> ProvisioningConfig:
    """The renter before any of this (see the module docstring)."""
    boot = BootWatchConfig(
        fatal_patterns=(),
        watch_freeze=False,
        deadline_floor_s=1800.0,
        deadline_factor=0.0,
        no_progress_deadline_s=1800.0,
        unknown_state_grace_s=1800.0,
        poll_s=60.0,
    )
    return ProvisioningConfig(
        name="naive",
        boot=boot,
        preflight=False,
        quarantine=False,
        rank_by="hourly",
        reliability_floor="fallback",
        stall_s=0.0,
        notice_delay_s=105 * 60.0,
        hold_s=0.0,
        recovery_hedge=1,
        destroy_lost_hosts=True,
        watch_budget=False,
    )


# -- state ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Attempt:
    """One rental for the job."""

    instance_id: str
    machine_id: str
    provider: str
    offer: Offer
    created_at: float
    watch: BootWatch
    held_work: bool = False  # training started on it: automation may no longer destroy it
    preflight_started_at: float | None = None
    training_started_at: float | None = None
    last_progress_at: float | None = None
    last_work_s: float = 0.0
    trouble_since: float | None = None  # first sighting of a dead/hung trainer (naive waits)
    trouble: tuple[str, str] | None = None  # (reason, evidence)


@dataclass(frozen=True, slots=True)
class JobState:
    job_id: str
    req: Requirements
    shape: JobShape
    phase: Phase = "queued"
    creates: int = 0
    failures_in_row: int = 0
    attempt: Attempt | None = None
    excluded: frozenset[str] = frozenset()
    not_before: float = 0.0
    checkpoint_work_s: float = 0.0  # training work safely checkpointed (survives a lost host)
    lost_at: float | None = None  # when the last host was lost (for the recovery record)
    lost_cause: str | None = None
    lost_machine: str | None = None
    failure: str | None = None
    waiting_since: float | None = None  # when the job last found no offer that fits
    standby: bool = False  # provisions a verified host to hold for others, trains nothing
    progress_hedges: int = 0  # standby jobs started for this recovery because its chains were slow
    rentals_max: int | None = None  # a standby job that may rent only this many hosts (None: the config's cap)
    creates_before_reopen: int = 0  # creates spent before the operator resumed it: the cap counts after them


def new_job(
    job_id: str, *, req: Requirements, shape: JobShape, standby: bool = False, rentals_max: int | None = None
) -> JobState:
    return JobState(job_id=job_id, req=req, shape=shape, standby=standby, rentals_max=rentals_max)


# -- observations -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class MarketView:
    """What the driver looked up for a queued job: offers, our records, verified held hosts."""

    offers: Sequence[Offer] = ()
    records: Mapping[str, MachineRecord] = field(default_factory=dict)
    held: Sequence[HeldHost] = ()
    budget_left_usd: float | None = None  # None: no cap
    # Pull rates (GB/s) observed on this marketplace: finished boots and pulls in progress.
    pull_rates_gb_per_s: Sequence[float] = ()


@dataclass(frozen=True, slots=True)
class Tick:
    """Time to act (queued jobs pick an offer)."""

    view: MarketView = MarketView()


@dataclass(frozen=True, slots=True)
class CreateResult:
    offer: Offer
    instance_id: str | None  # None: the create failed
    error: str | None = None
    # The create was sent and its answer lost: the vendor may have rented it. The driver keeps the
    # intent and looks for it by label at the next step; nothing new is rented meanwhile.
    unconfirmed: bool = False


@dataclass(frozen=True, slots=True)
class BudgetRefused:
    """The budget refused the create's reservation: nothing was rented. The job waits for money to
    free up (or for the operator to raise the cap) and gives up after `max_offer_wait_s`."""

    offer: Offer
    cap: str  # which cap refused, e.g. "job-7" or "day"
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Adopted:
    held: HeldHost


@dataclass(frozen=True, slots=True)
class Polled:
    """The provider's view of the job's instance."""

    instance: Instance


@dataclass(frozen=True, slots=True)
class PreflightResult:
    """The preflight's report, with what the driver looked up for judging it: the passing
    preflights of the reported GPU model on our machines (`app.policy.speeds`), the job's own
    figure (`needs.expected_tflops`), and our record of the hardware the report identifies
    (`hardware_key`), so a host listed again under a new id cannot shed its record."""

    report: PreflightReport | None
    unreachable: Literal["ssh_unreachable", "timeout"] | None = None
    detail: str = ""
    speeds: Sequence[SpeedSample] = ()
    expected_tflops: float | None = None
    hardware: MachineRecord | None = None


@dataclass(frozen=True, slots=True)
class TrainerStatus:
    """What status.json (read over SSH) and the provider say about the training; None fields:
    SSH failed."""

    instance: Instance
    phase: Literal["training", "finished", "failed"] | None
    work_s: float = 0.0  # training work done (seconds at full speed)
    checkpoint_work_s: float = 0.0
    heartbeat_at: float | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class FailureSeen:
    """The oracle's driver: this failure is physically observable now."""

    reason: str
    evidence: str


@dataclass(frozen=True, slots=True)
class RecoveryProgress:
    """The driver's look at the provisioning chains working for a waiting recovery: the standby
    jobs it started for it (the job's own attempt is in its state)."""

    chains: Sequence[JobState] = ()
    view: MarketView = MarketView()


@dataclass(frozen=True, slots=True)
class BudgetCapReached:
    """Spend reached a cap: end the job where it stands (checkpointed work stays safe)."""

    cap: str  # which cap, e.g. "campaign budget $25.00"
    evidence: str = ""


Observation = (
    Tick
    | CreateResult
    | BudgetRefused
    | Adopted
    | Polled
    | PreflightResult
    | TrainerStatus
    | FailureSeen
    | BudgetCapReached
    | RecoveryProgress
)


# -- actions ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Create:
    job_id: str
    offer: Offer
    why: str


@dataclass(frozen=True, slots=True)
class Adopt:
    job_id: str
    held: HeldHost


@dataclass(frozen=True, slots=True)
class Destroy:
    job_id: str
    instance_id: str
    machine_id: str
    reason: str
    evidence: str


@dataclass(frozen=True, slots=True)
class Stop:
    job_id: str
    instance_id: str
    machine_id: str
    reason: str
    evidence: str


@dataclass(frozen=True, slots=True)
class Record:
    """Update the machine's reputation: `event` is create, boot, preflight_passed,
    slice_finished or failure (with `reason`)."""

    machine_id: str
    provider: str
    event: Literal["create", "boot", "preflight_passed", "slice_finished", "failure"]
    reason: str | None = None
    evidence: str = ""
    # A passing preflight's measurement, for the driver to keep (app.policy.speeds learns from it).
    gpu_model: str | None = None
    tflops_bf16: float | None = None


@dataclass(frozen=True, slots=True)
class RunPreflight:
    job_id: str
    instance_id: str


@dataclass(frozen=True, slots=True)
class StartTraining:
    job_id: str
    instance_id: str
    resume_from_work_s: float


@dataclass(frozen=True, slots=True)
class Hold:
    """Keep the verified host for the next compatible job until `until`, then stop it."""

    job_id: str
    host: HeldHost


@dataclass(frozen=True, slots=True)
class Recovered:
    job_id: str
    machine_id: str
    cause: str
    lost_at: float
    resumed_at: float


@dataclass(frozen=True, slots=True)
class Finished:
    job_id: str


@dataclass(frozen=True, slots=True)
class GaveUp:
    job_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class WakeAt:
    job_id: str
    at: float


@dataclass(frozen=True, slots=True)
class WantStandby:
    """Start `count` standby jobs (new_job(..., standby=True, rentals_max=rentals)) for this job's
    recovery; `rentals`: how many hosts each may rent (None: a chain that retries after duds)."""

    job_id: str
    count: int
    why: str
    rentals: int | None = None


Action = (
    Create
    | Adopt
    | Destroy
    | Stop
    | Record
    | RunPreflight
    | StartTraining
    | Hold
    | Recovered
    | Finished
    | GaveUp
    | WakeAt
    | WantStandby
)


# -- decisions --------------------------------------------------------------------------------
def ranked_offers(job: JobState, view: MarketView, *, now: float, cfg: ProvisioningConfig) -> list[RankedOffer]:
    """The offers this job may rent, in the order the configured ranking tries them (what
    `tuneharness submit --dry-run` shows): quarantine and the job's filters applied, and none
    whose attempt costs more than the budget has left."""
    records = view.records if cfg.quarantine else {}
    ranked = rank_offers(
        view.offers,
        job.req,
        job.shape,
        records=records,
        now=now,
        excluded=job.excluded,
        reliability_floor=cfg.reliability_floor,
    )
    if cfg.rank_by == "hourly":
        ranked.sort(key=lambda r: (r.offer.dph_total, r.offer.offer_id))
    if view.budget_left_usd is not None:
        ranked = [r for r in ranked if r.attempt_cost_usd <= view.budget_left_usd]
    return ranked


def choose_host(
    job: JobState, view: MarketView, *, now: float, cfg: ProvisioningConfig
) -> HeldHost | RankedOffer | None:
    """A held verified host first (not for a standby job: it exists to add one); else the best
    offer by the configured ranking."""
    if (cfg.hold_s > 0 or cfg.standby_hosts > 0) and not job.standby:
        held = [h for h in view.held if h.machine_id not in job.excluded]
        pick = pick_held_host(held, job.req, now=now, recovering=job.lost_at is not None)
        if pick is not None:
            return pick
    ranked = ranked_offers(job, view, now=now, cfg=cfg)
    if not ranked and not job.standby:
        # Nothing left to rent: a standby host is better used than a job left waiting.
        held = [h for h in view.held if h.machine_id not in job.excluded]
        return pick_held_host(held, job.req, now=now, recovering=True)
    return ranked[0] if ranked else None


def decide(
    job: JobState, obs: Observation, now: float, *, cfg: ProvisioningConfig, jitter_u: float = 0.5
) -> tuple[JobState, list[Action]]:
    """Fold one observation into the job; return the new state and what to do.

    `jitter_u` (uniform in [0, 1), drawn by the driver: the policy draws no random numbers)
    spreads the retry backoff.
    """
    if job.phase in ("done", "failed"):
        return job, []
    if isinstance(obs, BudgetCapReached):
        return _on_budget_cap(job, obs)
    if isinstance(obs, Tick):
        return _on_tick(job, obs, now, cfg)
    if isinstance(obs, CreateResult):
        return _on_created(job, obs, now, cfg)
    if isinstance(obs, BudgetRefused):
        return _on_budget_refused(job, obs, now, cfg)
    if isinstance(obs, Adopted):
        return _on_adopted(job, obs, now, cfg)
    if isinstance(obs, RecoveryProgress):
        return _on_recovery_progress(job, obs, now, cfg)
    att = job.attempt
    if att is None:
        return job, []
    cfg = replace(cfg, jitter_u=jitter_u)
    if isinstance(obs, FailureSeen):
        return _on_failure_seen(job, att, obs, now, cfg)
    if job.phase == "booting" and isinstance(obs, Polled):
        return _on_boot_poll(job, att, obs.instance, now, cfg)
    if job.phase == "preflight" and isinstance(obs, PreflightResult):
        return _on_preflight(job, att, obs, now, cfg)
    if job.phase == "preflight" and isinstance(obs, Polled):
        return _on_preflight_poll(job, att, obs.instance, now, cfg)
    if job.phase == "training" and isinstance(obs, TrainerStatus):
        return _on_trainer(job, att, obs, now, cfg)
    return job, []


def _on_budget_cap(job: JobState, obs: BudgetCapReached) -> tuple[JobState, list[Action]]:
    """Nothing new is rented; the job's host is stopped (destroyed only if it never held work)."""
    reason = f"budget cap reached: {obs.cap}"
    acts: list[Action] = []
    att = job.attempt
    if att is not None:
        evidence = obs.evidence or reason
        if att.held_work:
            acts.append(Stop(job.job_id, att.instance_id, att.machine_id, "budget_cap", evidence))
        else:
            acts.append(Destroy(job.job_id, att.instance_id, att.machine_id, "budget_cap", evidence))
    failed = replace(job, phase="failed", attempt=None, failure=reason)
    acts.append(GaveUp(job.job_id, reason))
    return failed, acts


def _on_tick(job: JobState, obs: Tick, now: float, cfg: ProvisioningConfig) -> tuple[JobState, list[Action]]:
    if job.phase != "queued":
        return job, []
    pick = choose_host(job, obs.view, now=now, cfg=cfg)
    if isinstance(pick, HeldHost):  # a verified host waits: no create, so no backoff either
        return job, [Adopt(job.job_id, pick)]
    if job.standby and job.rentals_max is not None and job.creates >= job.rentals_max:
        # A single extra rental for a slow recovery: it failed, and the chains go on without it.
        return replace(job, phase="done", failure=f"its {job.creates} rental(s) used"), []
    if now < job.not_before:
        return job, [WakeAt(job.job_id, job.not_before)]
    if not may_create(creates_so_far=job.creates - job.creates_before_reopen, max_creates=cfg.max_creates_per_job):
        failed = replace(job, phase="failed", failure=f"create cap reached ({job.creates} creates)")
        return failed, [GaveUp(job.job_id, failed.failure or "")]
    if pick is None:
        # Nothing fits now (all taken, excluded, or beyond what the budget has left): look again
        # later, and give up after max_offer_wait_s of finding nothing.
        since = job.waiting_since if job.waiting_since is not None else now
        if now - since >= cfg.max_offer_wait_s:
            failed = replace(job, phase="failed", failure=f"no eligible offer for {now - since:.0f}s")
            return failed, [GaveUp(job.job_id, failed.failure or "")]
        return replace(job, waiting_since=since), [WakeAt(job.job_id, now + cfg.queue_retry_s)]
    job = replace(job, waiting_since=None)
    why = (
        f"${pick.cost_per_delivered_job_usd:.4f} per delivered job "
        f"(${pick.attempt_cost_usd:.4f} per attempt / p={pick.delivery_probability:.3f})"
    )
    acts: list[Action] = [Create(job.job_id, pick.offer, why)]
    if job.lost_at is not None and job.failures_in_row == 0 and cfg.recovery_hedge > 1 and not job.standby:
        # The first create of a recovery with no verified host waiting: hedge, as widely as the
        # marketplace's observed dud rate asks.
        chains = hedge_width(cfg, obs.view.records)
        acts.append(
            WantStandby(job.job_id, chains - 1, f"recovery with no verified host waiting: {chains} parallel chains")
        )
    return job, acts


def hedge_width(cfg: ProvisioningConfig, records: Mapping[str, MachineRecord]) -> int:
    """Parallel provisioning chains for a host someone waits for (a recovery, a standby refill):
    `recovery_hedge` at least, widened up to `recovery_hedge_max` until P(some chain's first rental
    delivers) >= `hedge_first_try_p` at the delivery rate observed on this marketplace."""
    if cfg.recovery_hedge <= 1:
        return max(1, cfg.recovery_hedge)
    return hedge_chains(
        delivery_rate=market_delivery_rate(records),
        first_try_p=cfg.hedge_first_try_p,
        at_least=cfg.recovery_hedge,
        at_most=cfg.recovery_hedge_max,
    )


def slow_chains(
    chains: Sequence[JobState], *, download_gb: float, rates_gb_per_s: Sequence[float], now: float, margin_s: float
) -> int:
    """How many of the chains still pulling will, at the rate their status lines show, finish
    later than a fresh rental started now would (at the median observed pull rate) plus
    `margin_s`. A chain whose rate is not yet visible, between attempts or in preflight is not
    slow. 0 while no pull rate has been observed at all."""
    own = [r for c in chains if c.attempt is not None and (r := pull_rate_gb_per_s(c.attempt.watch)) is not None]
    fresh_s = fresh_pull_s(download_gb=download_gb, rates_gb_per_s=[*rates_gb_per_s, *own])
    if fresh_s is None:
        return 0
    bound = now + fresh_s + margin_s
    slow = 0
    for c in chains:
        if c.phase != "booting" or c.attempt is None:
            continue
        done_at = projected_pull_done_at(c.attempt.watch)
        slow += done_at is not None and done_at > bound
    return slow


def _on_recovery_progress(
    job: JobState, obs: RecoveryProgress, now: float, cfg: ProvisioningConfig
) -> tuple[JobState, list[Action]]:
    """A waiting recovery whose chains are slow starts one more chain per slow chain (bounded)."""
    if job.standby or job.lost_at is None or job.phase not in ("queued", "booting", "preflight"):
        return job, []
    if cfg.progress_hedge_max <= 0 or cfg.recovery_hedge <= 1:
        return job, []
    chains = [job, *(c for c in obs.chains if c.phase not in ("done", "failed"))]
    slow = slow_chains(
        chains,
        download_gb=job.shape.download_gb,
        rates_gb_per_s=obs.view.pull_rates_gb_per_s,
        now=now,
        margin_s=cfg.progress_hedge_margin_s,
    )
    extra = min(slow, cfg.progress_hedge_max) - job.progress_hedges
    if extra <= 0:
        return job, []
    job = replace(job, progress_hedges=job.progress_hedges + extra)
    why = f"{slow} of {len(chains)} chains pull slower than a fresh rental would: {extra} more"
    return job, [WantStandby(job.job_id, extra, why, rentals=1)]


def hand_over(job: JobState, *, standby_id: str) -> tuple[JobState, JobState] | None:
    """A recovering job whose own replacement is still booting or preflighting gives that attempt
    to a new standby job and goes back to the queue, to adopt a verified host that is waiting.

    None when there is nothing to hand over (not recovering, or no attempt that never held work).
    """
    att = job.attempt
    if job.lost_at is None or att is None or att.held_work or job.phase not in ("booting", "preflight"):
        return None
    standby = JobState(
        job_id=standby_id,
        req=job.req,
        shape=job.shape,
        phase=job.phase,
        creates=1,
        attempt=att,
        excluded=job.excluded,
        standby=True,
    )
    back = replace(job, phase="queued", attempt=None, not_before=0.0)
    return back, standby


def _on_created(job: JobState, obs: CreateResult, now: float, cfg: ProvisioningConfig) -> tuple[JobState, list[Action]]:
    if job.phase != "queued":
        return job, []
    if obs.instance_id is None:
        if obs.error and obs.error.startswith("budget"):
            # The form a budget refusal had before BudgetRefused existed; no driver sends it any more.
            return _on_budget_refused(job, BudgetRefused(obs.offer, cap="budget", detail=obs.error), now, cfg)
        if obs.unconfirmed:
            return job, [WakeAt(job.job_id, now + cfg.create_confirm_poll_s)]
        # Offer taken or provider busy: no money spent, try the next offer at once.
        return job, [WakeAt(job.job_id, now)]
    offer = obs.offer
    att = Attempt(
        instance_id=obs.instance_id,
        machine_id=machine_key(offer),
        provider=offer.provider,
        offer=offer,
        created_at=now,
        watch=start_watch(created_at=now),
    )
    job = replace(job, phase="booting", attempt=att, creates=job.creates + 1)
    return job, [Record(att.machine_id, att.provider, "create"), WakeAt(job.job_id, now + cfg.boot.poll_s)]


def _on_budget_refused(
    job: JobState, obs: BudgetRefused, now: float, cfg: ProvisioningConfig
) -> tuple[JobState, list[Action]]:
    """Nothing was rented: wait for money to free up, and give up after max_offer_wait_s."""
    if job.phase != "queued":
        return job, []
    since = job.waiting_since if job.waiting_since is not None else now
    why = f"{obs.cap}: {obs.detail}" if obs.detail else obs.cap
    if now - since >= cfg.max_offer_wait_s:
        failed = replace(job, phase="failed", failure=f"budget refused every create for {now - since:.0f}s: {why}")
        return failed, [GaveUp(job.job_id, failed.failure or "")]
    return replace(job, waiting_since=since), [WakeAt(job.job_id, now + cfg.queue_retry_s)]


def _on_adopted(job: JobState, obs: Adopted, now: float, cfg: ProvisioningConfig) -> tuple[JobState, list[Action]]:
    if job.phase != "queued":
        return job, []
    h = obs.held
    offer = h.as_offer()
    att = Attempt(
        instance_id=h.instance_id,
        machine_id=h.machine_id,
        provider=h.provider,
        offer=offer,
        created_at=h.held_since,
        watch=start_watch(created_at=h.held_since),
    )
    job = replace(job, attempt=att)
    return _start_training(job, att, now, cfg)


def _fail_attempt(
    job: JobState, att: Attempt, *, reason: str, evidence: str, now: float, cfg: ProvisioningConfig, destroy: bool
) -> tuple[JobState, list[Action]]:
    """The attempt failed: destroy (if it never held work) or stop it, record, re-queue."""
    acts: list[Action] = []
    if destroy and not att.held_work:
        acts.append(Destroy(job.job_id, att.instance_id, att.machine_id, reason, evidence))
    else:
        acts.append(Stop(job.job_id, att.instance_id, att.machine_id, reason, evidence))
    acts.append(Record(att.machine_id, att.provider, "failure", reason, evidence))
    failures = job.failures_in_row + 1
    wait = backoff_s(failures=failures, base_s=cfg.backoff_base_s, cap_s=cfg.backoff_cap_s, jitter_u=cfg.jitter_u)
    job = replace(
        job,
        phase="queued",
        attempt=None,
        failures_in_row=failures,
        excluded=job.excluded | {att.machine_id},
        not_before=now + wait,
    )
    acts.append(WakeAt(job.job_id, now + wait))
    return job, acts


def _on_boot_poll(
    job: JobState, att: Attempt, inst: Instance, now: float, cfg: ProvisioningConfig
) -> tuple[JobState, list[Action]]:
    watch, verdict = observe_boot(att.watch, state=inst.state, status_line=inst.status_line, now=now, cfg=cfg.boot)
    att = replace(att, watch=watch)
    job = replace(job, attempt=att)
    if isinstance(verdict, BootKill):
        return _fail_attempt(job, att, reason=verdict.reason, evidence=verdict.evidence, now=now, cfg=cfg, destroy=True)
    if isinstance(verdict, BootReady):
        acts: list[Action] = [
            Record(att.machine_id, att.provider, "boot", None, f"running after {verdict.boot_s:.0f}s")
        ]
        if not cfg.preflight:
            job2, more = _verified(job, att, now, cfg)
            return job2, acts + more
        att = replace(att, preflight_started_at=now)
        job = replace(job, phase="preflight", attempt=att)
        return job, [
            *acts,
            RunPreflight(job.job_id, att.instance_id),
            WakeAt(job.job_id, now + cfg.preflight_timeout_s),
        ]
    return job, [WakeAt(job.job_id, now + cfg.boot.poll_s)]


def _on_preflight_poll(
    job: JobState, att: Attempt, inst: Instance, now: float, cfg: ProvisioningConfig
) -> tuple[JobState, list[Action]]:
    """A wake-up during the preflight: the preflight timed out unless a result came first."""
    started = att.preflight_started_at if att.preflight_started_at is not None else now
    if inst.state == "gone":
        return _fail_attempt(
            job,
            att,
            reason="ssh_unreachable",
            evidence="instance gone during preflight",
            now=now,
            cfg=cfg,
            destroy=True,
        )
    if now - started >= cfg.preflight_timeout_s:
        return _fail_attempt(
            job,
            att,
            reason="timeout",
            evidence=f"no preflight report after {now - started:.0f}s",
            now=now,
            cfg=cfg,
            destroy=True,
        )
    return job, [WakeAt(job.job_id, started + cfg.preflight_timeout_s)]


def _on_preflight(
    job: JobState, att: Attempt, obs: PreflightResult, now: float, cfg: ProvisioningConfig
) -> tuple[JobState, list[Action]]:
    report = obs.report
    if report is None:
        verdict = unreachable(obs.unreachable or "ssh_unreachable", obs.detail or "no report")
    else:
        hw = hardware_key(gpu_uuid=report.gpu_uuid, host_machine_id=report.host_machine_id)
        if hw is not None and not att.offer.machine_id:
            # The vendor names no machine: its record is kept under the hardware the preflight read
            # (the offer it was rented through stays excluded for this job, as a failure would leave it).
            job = replace(job, excluded=job.excluded | {att.machine_id})
            att = replace(att, machine_id=hw)
            job = replace(job, attempt=att)
        bad = obs.hardware
        if cfg.quarantine and hw is not None and bad is not None and is_quarantined(bad, now=now):
            reason = bad.quarantine_reason or (bad.failures[-1][0] if bad.failures else "no_compute")
            evidence = f"hardware {hw} is quarantined ({reason}) from an earlier rental"
            return _fail_attempt(job, att, reason=reason, evidence=evidence, now=now, cfg=cfg, destroy=True)
        speed = expected_speed(report.gpu_name or att.offer.gpu_name, obs.speeds, override=obs.expected_tflops)
        verdict = judge_preflight(
            report, offered_gpu_name=att.offer.gpu_name, offered_gpu_ram_gb=att.offer.gpu_ram_gb, speed=speed
        )
    if not verdict.passed:
        return _fail_attempt(
            job, att, reason=verdict.failure or "no_compute", evidence=verdict.evidence, now=now, cfg=cfg, destroy=True
        )
    evidence = verdict.evidence + ("; " + "; ".join(verdict.warnings) if verdict.warnings else "")
    passed = Record(att.machine_id, att.provider, "preflight_passed", None, evidence)
    if (
        report is not None and report.gpu_name and report.tflops_bf16 is not None
    ):  # pragma: no branch - judge_preflight passes only a report with a GPU name and a TFLOP/s figure
        passed = replace(passed, gpu_model=speed_model(report.gpu_name), tflops_bf16=report.tflops_bf16)
    job2, acts = _verified(job, att, now, cfg)
    return job2, [passed, *acts]


def _verified(job: JobState, att: Attempt, now: float, cfg: ProvisioningConfig) -> tuple[JobState, list[Action]]:
    """The host proved it computes: train on it, or (a standby job) hold it for whoever needs it."""
    if not job.standby:
        return _start_training(job, att, now, cfg)
    host = _held(att, now, hold_s=cfg.standby_hold_s, standby=True)
    return replace(job, phase="done", attempt=None, failures_in_row=0), [Hold(job.job_id, host)]


def _held(att: Attempt, now: float, *, hold_s: float, standby: bool = False) -> HeldHost:
    """The attempt's verified host, kept running from `now` for `hold_s`."""
    return HeldHost(
        instance_id=att.instance_id,
        machine_id=att.machine_id,
        provider=att.provider,
        gpu_name=att.offer.gpu_name,
        gpu_ram_gb=att.offer.gpu_ram_gb,
        num_gpus=att.offer.num_gpus,
        dph_total=att.offer.dph_total,
        held_since=now,
        hold_until=now + hold_s,
        standby=standby,
    )


def _start_training(job: JobState, att: Attempt, now: float, cfg: ProvisioningConfig) -> tuple[JobState, list[Action]]:
    att = replace(att, held_work=True, training_started_at=now, last_progress_at=now, last_work_s=job.checkpoint_work_s)
    acts: list[Action] = [StartTraining(job.job_id, att.instance_id, job.checkpoint_work_s)]
    if job.lost_at is not None:
        acts.append(Recovered(job.job_id, job.lost_machine or "", job.lost_cause or "lost", job.lost_at, now))
    job = replace(
        job,
        phase="training",
        attempt=att,
        failures_in_row=0,
        lost_at=None,
        lost_cause=None,
        lost_machine=None,
        progress_hedges=0,
    )
    acts.append(WakeAt(job.job_id, now + cfg.monitor_s))
    return job, acts


def _on_trainer(
    job: JobState, att: Attempt, obs: TrainerStatus, now: float, cfg: ProvisioningConfig
) -> tuple[JobState, list[Action]]:
    inst = obs.instance
    if obs.phase == "finished":
        acts: list[Action] = [
            Record(att.machine_id, att.provider, "slice_finished", None, f"{obs.work_s:.0f}s of work")
        ]
        if cfg.hold_s > 0:
            acts.append(Hold(job.job_id, _held(att, now, hold_s=cfg.hold_s)))
        else:
            acts.append(Stop(job.job_id, att.instance_id, att.machine_id, "job finished", "adapter pulled"))
        acts.append(Finished(job.job_id))
        return replace(job, phase="done", attempt=None, checkpoint_work_s=obs.work_s), acts

    # Work that is checkpointed survives the host.
    job = replace(job, checkpoint_work_s=max(job.checkpoint_work_s, obs.checkpoint_work_s))
    trouble: tuple[str, str] | None = None
    if inst.state in ("gone", "exited"):
        trouble = ("lost", f"provider reports the instance {inst.state}")
    elif obs.phase == "failed":
        trouble = ("train_failed", obs.error or "trainer exited with a failure")
    elif obs.phase is None and inst.state in ("unknown", "stopped"):
        trouble = ("lost", f"SSH failed and the provider reports {inst.state}")
    else:
        if obs.work_s > att.last_work_s + 1e-9:
            att = replace(att, last_work_s=obs.work_s, last_progress_at=now)
        last = att.last_progress_at if att.last_progress_at is not None else now
        idle = inst.gpu_util is not None and inst.gpu_util <= cfg.idle_util_pct
        if cfg.stall_s > 0 and (now - last >= cfg.stall_s or (idle and now - last >= cfg.idle_stall_s)):
            trouble = ("hang", f"no training progress for {now - last:.0f}s (GPU util {inst.gpu_util})")
        elif cfg.stall_s == 0 and inst.gpu_util is not None and inst.gpu_util <= 0 and now - last >= cfg.monitor_s:
            trouble = ("hang", "GPU utilisation 0 and no progress")
    if trouble is None:
        job = replace(job, attempt=replace(att, trouble=None, trouble_since=None))
        return job, [WakeAt(job.job_id, now + cfg.monitor_s)]
    # The last good heartbeat before the trouble: for a hang, the last time the step advanced.
    if trouble[0] == "hang":
        last_good = att.last_progress_at if att.last_progress_at is not None else now
    else:
        last_good = obs.heartbeat_at if obs.heartbeat_at is not None else now
    since = att.trouble_since if att.trouble_since is not None else min(last_good, now)
    att = replace(att, trouble=trouble, trouble_since=since)
    job = replace(job, attempt=att)
    if now - since < cfg.notice_delay_s:
        return job, [WakeAt(job.job_id, since + cfg.notice_delay_s)]
    return _lose_host(job, att, reason=trouble[0], evidence=trouble[1], lost_at=since, now=now, cfg=cfg)


def _lose_host(
    job: JobState, att: Attempt, *, reason: str, evidence: str, lost_at: float, now: float, cfg: ProvisioningConfig
) -> tuple[JobState, list[Action]]:
    """A host that held the job's work failed: stop it (never destroy), record, re-queue, resume later."""
    acts: list[Action] = []
    if cfg.destroy_lost_hosts:
        acts.append(Destroy(job.job_id, att.instance_id, att.machine_id, reason, evidence))
    else:
        acts.append(Stop(job.job_id, att.instance_id, att.machine_id, reason, evidence))
    acts.append(Record(att.machine_id, att.provider, "failure", reason, evidence))
    cause = "hang" if reason == "hang" else "lost"
    job = replace(
        job,
        phase="queued",
        attempt=None,
        excluded=job.excluded | {att.machine_id},
        lost_at=lost_at,
        lost_cause=cause,
        lost_machine=att.machine_id,
        not_before=now,
        progress_hedges=0,
    )
    acts.append(WakeAt(job.job_id, now))
    return job, acts


def _on_failure_seen(
    job: JobState, att: Attempt, obs: FailureSeen, now: float, cfg: ProvisioningConfig
) -> tuple[JobState, list[Action]]:
    if job.phase in ("booting", "preflight"):
        return _fail_attempt(job, att, reason=obs.reason, evidence=obs.evidence, now=now, cfg=cfg, destroy=True)
    if job.phase == "training":
        return _lose_host(job, att, reason=obs.reason, evidence=obs.evidence, lost_at=now, now=now, cfg=cfg)
    return job, []  # pragma: no cover - only booting, preflight and training jobs hold an attempt
