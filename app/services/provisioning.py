"""The provisioning handler: the real-time driver of `app.policy.provisioning.decide`.

Celery's `provision`, `watch_boot` and `preflight` tasks are thin shells around `step` and
`preflight`: load the job's policy state, build the observation through the ports (the market,
SSH), call the pure `decide`, apply each action (creates through the crash-safe rental protocol
with its budget reservation, destroys that automation is allowed, reputation and quarantine,
ledger events with the evidence), save the state, and say when to look again. The campaign
simulator (`providers/sim/campaign`) drives the same `decide` in virtual time.

Scope: from queued to "training handed over"; the supervisor (`app.services.supervisor`) takes the
job from there and feeds what it sees back through `observe` (lost host, hang, finished).

Held hosts, warm standby and hedged recovery (tables in `app.services.pool`):

- `Hold`: the verified host keeps running, recorded in `held_hosts` until its `hold_until`
  (capped at the rental's kill-time); `_view` offers held hosts to queued jobs, and `Adopt`
  claims one atomically (`Pool.claim`), so the job skips create, pull and preflight. A lost
  race, or a held host that vanished, just steps the job again. A host held by another job is
  transferred to the adopter (`_take_over`): the adopter's reservation is committed first (a
  refusal puts the host back on hold and the job provisions normally), then `Rentals.transfer`
  settles the previous job's share and makes the rental the adopter's from that instant.
- `standby_hosts` (a job's pool, `needs.standby_hosts`): while the job trains, standby jobs
  (`new_job(..., standby=True)`, ids `<job>.standby-<n>`) go through the same provision /
  watch_boot / preflight tasks and their verified hosts are held for the job's recoveries.
  Their rentals are the job's own (attempts from 1000 * n): reserved against its budget,
  labelled and billed to it, opened with its SSH key.
- `WantStandby` (a recovery that found no verified host waiting): that many hedge standby jobs
  start beside the job's own create; when one is verified first, the job's own attempt is
  handed to a standby job (`hand_over`) and the job adopts the verified host; the others wait
  held for its next recovery, or until their hold ends.
- `sweep_holds` (beat, one task per sweep): releases expired holds (a host that held work is
  stopped; a standby host that never held work is destroyed, like any other rental that never
  held work), drops held hosts whose rental or instance is gone, renews a pool's standby hosts
  while their job runs, tops pools up and releases the pools of jobs that ended.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import Engine, select, text
from sqlmodel import Field, SQLModel

from app.db import advisory_key, is_postgres, read_connection, write_transaction
from app.errors import BudgetExceeded, TuneharnessError
from app.ledger import Event, Ledger
from app.market import LaunchSpec, Market, MarketError, OfferGone, OfferQuery
from app.policy.codec import dump_job, load_job
from app.policy.provisioning import (
    Action,
    Adopt,
    Adopted,
    BudgetRefused,
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
    new_job,
)
from app.policy.ranking import JobShape, Requirements, attempt_cost_usd
from app.ports import Clock
from app.rentals import Rental, Rentals
from app.reputation import ReputationStore
from app.services.leases import StepLeases
from app.services.pool import STANDBY_ATTEMPT_BASE, Held, Pool

__all__ = ["HoldSweep", "ProvisioningService", "ProvisioningStateRow", "Step", "StepBusy"]

PreflightRunner = Callable[[Market, str, str], PreflightResult]  # (market, job id, instance id)


class ProvisioningStateRow(SQLModel, table=True):
    """The policy state of one job between tasks (JSON of `JobState`), versioned."""

    __tablename__ = "provisioning_state"

    job_id: str = Field(primary_key=True)
    state_json: str
    version: int = 0
    wake_at: float | None = None
    updated_at: float


_T = ProvisioningStateRow.__table__  # type: ignore[attr-defined]


class _Moved(Exception):
    """A job's state moved since the version a save expected: the whole save is rolled back."""


@dataclass(frozen=True, slots=True)
class Step:
    """What the Celery shell does next: look again at `wake_at`, run a preflight, or nothing."""

    job_id: str
    phase: str
    wake_at: float | None = None
    preflight_instance: str | None = None
    handed_over: str | None = None  # instance id the job now trains on
    failure: str | None = None
    standby: bool = False  # a standby job: not in the job table, nothing to hand over
    spawned: tuple[str, ...] = ()  # standby jobs started by this step: step each one now
    also: tuple[Step, ...] = ()  # other jobs this step moved (a recovery adopting a standby host)


class StepBusy(TuneharnessError):
    """Another step of the job held its step lease for longer than the wait: nothing was applied."""


_BUSY_RETRY_S = 5.0


def _same_situation(loaded: JobState, now: JobState) -> bool:
    """Whether an observation made against `loaded` still applies to the job as it is `now`."""
    def where(j: JobState) -> tuple[Any, ...]:
        return (j.phase, j.attempt.instance_id if j.attempt else None, j.lost_at, j.standby)

    return where(loaded) == where(now)


class _StepYields(Exception):
    """Another step of the same job already did what this one is about to (it adopted a host for
    the same recovery): this step ends without side effects or a save, and that one decides."""


@dataclass
class _Ctx:
    """What one `_run` collected besides its own job's state."""

    spawned: list[str] = field(default_factory=list)
    also: list[Step] = field(default_factory=list)
    restep: bool = False  # an adoption fell through: look again at once
    ended: bool = False  # the job finished or gave up: release its standby pool
    holds: list[str] = field(default_factory=list)  # standby hosts held: offer them to the owner's recovery


@dataclass
class HoldSweep:
    """One pass of `sweep_holds`."""

    examined: int = 0
    released: list[str] = field(default_factory=list)
    renewed: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)  # standby jobs started: the shell schedules them


class ProvisioningService:
    def __init__(
        self,
        engine: Engine,
        *,
        market_for: Callable[[str], Market],
        clock: Clock,
        run_preflight: PreflightRunner,
        launch_spec_for: Callable[[str], LaunchSpec],
        providers: tuple[str, ...] = ("sim",),
        cfg: ProvisioningConfig | None = None,
        ttl_s: float = 6 * 3600.0,
        reserve_factor: float = 1.3,
        rng: random.Random | None = None,
    ) -> None:
        self.engine = engine
        self.market_for = market_for
        self.clock = clock
        self.run_preflight = run_preflight
        self.launch_spec_for = launch_spec_for
        self.providers = providers
        self.cfg = cfg or guarded_config()
        self.ttl_s = ttl_s
        self.reserve_factor = reserve_factor
        self.rng = rng or random.Random()
        self.ledger = Ledger(engine)
        self.rentals = Rentals(engine, ledger=self.ledger)
        self.reputation = ReputationStore(engine)
        self.pool = Pool(engine)
        self.leases = StepLeases(engine)

    # -- state ------------------------------------------------------------------------------
    def state(self, job_id: str) -> tuple[JobState, int] | None:
        with read_connection(self.engine) as conn:
            row = conn.execute(select(_T).where(_T.c.job_id == job_id)).first()
        if row is None:
            return None
        return load_job(json.loads(row.state_json)), int(row.version)

    def _save(self, job: JobState, version: int, wake_at: float | None) -> bool:
        """Write the new state if nobody else moved it since `version` (a redelivered task)."""
        return self._save_all([(job, version, wake_at)])

    def _save_all(self, writes: list[tuple[JobState, int, float | None]]) -> bool:
        """Write several jobs' states in one transaction: all of them, or none if any moved since
        its `version` (0: the job must be new). A crash in the middle writes nothing."""
        first = writes[0][0].job_id
        try:
            with write_transaction(self.engine, lock=f"tuneharness.provisioning.{first}") as conn:
                if is_postgres(self.engine):
                    for job, _, _ in writes[1:]:  # the first job's lock is write_transaction's
                        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"),
                                     {"k": advisory_key(f"tuneharness.provisioning.{job.job_id}")})
                for job, version, wake_at in writes:
                    row = conn.execute(select(_T.c.version).where(_T.c.job_id == job.job_id)).first()
                    values = {"state_json": json.dumps(dump_job(job)), "wake_at": wake_at,
                              "updated_at": self.clock.now()}
                    if row is None:
                        if version != 0:
                            raise _Moved
                        conn.execute(_T.insert().values(job_id=job.job_id, version=1, **values))
                    elif int(row.version) != version:
                        raise _Moved
                    else:
                        conn.execute(_T.update().where(_T.c.job_id == job.job_id).values(version=version + 1, **values))
        except _Moved:
            return False
        return True

    def owner_of(self, job_id: str) -> str:
        """The job a standby job rents for (itself for any other job)."""
        sj = self.pool.standby_job(job_id)
        return job_id if sj is None else sj.owner

    def start(self, job_id: str, *, req: Requirements, shape: JobShape, standby_hosts: int = 0) -> Step:
        """Begin provisioning a job (idempotent: a second start just steps it).

        `standby_hosts`: verified hosts kept waiting for this job's recoveries while it trains.
        """
        if standby_hosts > 0:
            self.pool.set_pool(job_id, standby_hosts)
        if self.state(job_id) is None:
            self._save(new_job(job_id, req=req, shape=shape), 0, self.clock.now())
            self.ledger.append(Event(kind="provisioning_started", job=job_id, reason="job accepted",
                                     payload={"providers": list(self.providers), "standby_hosts": standby_hosts},
                                     idempotency_key=f"{job_id}:provisioning_started"))
        return self.step(job_id)

    # -- the steps the tasks call -----------------------------------------------------------
    def step(self, job_id: str) -> Step:
        """A wake-up: observe what the job's phase needs to see, decide, apply."""
        loaded = self.state(job_id)
        if loaded is None:
            return Step(job_id, "unknown")
        job, version = loaded
        if job.standby and job.phase == "queued" and not self._standby_wanted(job):
            # Between attempts and nobody needs it any more: stop rolling the dice.
            done = replace(job, phase="done", failure="no longer needed")
            if self._save(done, version, None):
                self.ledger.append(Event(kind="standby_cancelled", job=self.owner_of(job_id),
                                         reason="standby host no longer needed", payload={"standby_job": job_id},
                                         idempotency_key=f"{job_id}:standby_cancelled"))
            return Step(job_id, "done", standby=True)
        obs: Observation | None = None
        if job.phase == "queued":
            obs = Tick(view=self._view(job))
        elif job.phase in ("booting", "preflight") and job.attempt is not None:
            obs = Polled(self.market_for(job.attempt.provider).status(job.attempt.instance_id))
        if obs is None:
            return Step(job_id, job.phase, standby=job.standby)
        return self._run(job, version, obs)

    def preflight(self, job_id: str, instance_id: str) -> Step:
        """Run the preflight on the job's new host (over SSH, with the key of the job it rents for) and judge it."""
        loaded = self.state(job_id)
        if loaded is None:
            return Step(job_id, "unknown")
        job, version = loaded
        if job.phase != "preflight" or job.attempt is None or job.attempt.instance_id != instance_id:
            return Step(job_id, job.phase, standby=job.standby)  # stale: the job moved on
        result = self.run_preflight(self.market_for(job.attempt.provider), self.owner_of(job_id), instance_id)
        return self._run(job, version, result)

    def fail_seen(self, job_id: str, reason: str, evidence: str) -> Step:
        """An outside observer (e.g. the supervisor) reports a failure of the job's host."""
        loaded = self.state(job_id)
        if loaded is None:
            return Step(job_id, "unknown")
        job, version = loaded
        return self._run(job, version, FailureSeen(reason, evidence))

    def observe(self, job_id: str, obs: Observation) -> Step:
        """The supervisor's observation of a training job (TrainerStatus): decide and apply."""
        loaded = self.state(job_id)
        if loaded is None:
            return Step(job_id, "unknown")
        job, version = loaded
        return self._run(job, version, obs)

    def give_up_training(self, job_id: str, *, reason: str, evidence: str) -> Step:
        """The supervisor stops a training job for good (triage: a new host won't fix it)."""
        from app.policy.supervision import stop_job

        loaded = self.state(job_id)
        if loaded is None:
            return Step(job_id, "unknown")
        with self.leases.held(job_id) as held:
            if not held:
                raise StepBusy(f"job {job_id}: another provisioning step still holds it; try again")
            loaded = self.state(job_id)  # as it is now, under the lease
            if loaded is None:
                return Step(job_id, "unknown")
            job, version = loaded
            job, actions = stop_job(job, reason=reason, evidence=evidence)
            ctx = _Ctx()
            for act in actions:
                self._apply(job, act, ctx)
            self._save(job, version, None)
        self.release_pool(job_id, reason=f"job stopped: {reason}")
        return Step(job.job_id, job.phase, failure=job.failure)

    # -- the loop -----------------------------------------------------------------------------
    def _run(self, job: JobState, version: int, first: Observation) -> Step:
        """Decide on `first` (and what applying it observes) and apply it, holding the job's step
        lease from the re-read of its state to the save; then what the save unlocks (standby
        top-up, pool release, offers to recoveries), which steps other jobs under their own leases."""
        with self.leases.held(job.job_id) as held:
            if not held:
                return self._busy(job, first)
            current = self.state(job.job_id)
            if current is None:
                return Step(job.job_id, "unknown")
            if current[1] != version:
                # Another step saved since this one loaded. Its observation still holds if the job
                # is where it was (same phase, attempt and loss): decide on the state as it is now.
                # Otherwise that step has moved the job on and scheduled what comes next.
                if not _same_situation(job, current[0]):
                    return Step(job.job_id, current[0].phase, standby=current[0].standby)
                job, version = current
            applied = self._apply_and_save(job, version, first)
        if isinstance(applied, Step):
            return applied
        job, wake_at, preflight_instance, handed_over, ctx = applied
        if handed_over is not None and not job.standby:
            ctx.spawned += self._top_up(job.job_id)
        if ctx.ended and not job.standby:
            self.release_pool(job.job_id, reason=f"job {job.phase}")
        for owner in dict.fromkeys(ctx.holds):
            ctx.also += self._offer_to_recovery(owner)
        return Step(job.job_id, job.phase, wake_at=wake_at, preflight_instance=preflight_instance,
                    handed_over=handed_over, failure=job.failure, standby=job.standby,
                    spawned=tuple(ctx.spawned), also=tuple(ctx.also))

    def _apply_and_save(
        self, job: JobState, version: int, first: Observation
    ) -> Step | tuple[JobState, float | None, str | None, str | None, _Ctx]:
        pending: list[Observation] = [first]
        wake_at: float | None = None
        preflight_instance: str | None = None
        handed_over: str | None = None
        ctx = _Ctx()
        before = job
        try:
            while pending:
                obs = pending.pop(0)
                job, actions = decide(job, obs, self.clock.now(), cfg=self.cfg, jitter_u=self.rng.random())
                for act in actions:
                    if isinstance(act, WakeAt):
                        wake_at = act.at
                    elif isinstance(act, RunPreflight):
                        preflight_instance = act.instance_id
                    elif isinstance(act, StartTraining):
                        handed_over = act.instance_id
                        self._start_training(job, act)
                    else:
                        follow = self._apply(job, act, ctx)
                        if follow is not None:
                            pending.append(follow)
        except _StepYields:
            return Step(before.job_id, before.phase, standby=before.standby)
        if ctx.restep and wake_at is None and job.phase == "queued":
            wake_at = self.clock.now()
        if not self._save(job, version, wake_at):
            self.ledger.append(Event(kind="provisioning_conflict", job=self.owner_of(job.job_id),
                                     reason="state moved by another task; this step's state discarded",
                                     payload={"provisioning_job": job.job_id}))
            return Step(job.job_id, job.phase, standby=job.standby)
        return job, wake_at, preflight_instance, handed_over, ctx

    def _busy(self, job: JobState, first: Observation) -> Step:
        """Another step held the job's lease past the wait (a stuck provider call, or a holder that
        died and whose lease has not expired yet): apply nothing, come back. A supervisor's
        observation is not dropped silently: it raises, which the supervisor's poll records before
        polling again."""
        self.ledger.append(Event(kind="step_busy", job=self.owner_of(job.job_id),
                                 reason=f"another step of this job held its lease for over {self.leases.wait_s:.0f} s",
                                 payload={"provisioning_job": job.job_id, "observation": type(first).__name__}))
        if isinstance(first, TrainerStatus):
            raise StepBusy(f"job {job.job_id}: another provisioning step still holds it; try again")
        if isinstance(first, PreflightResult) and job.attempt is not None:
            return Step(job.job_id, job.phase, preflight_instance=job.attempt.instance_id, standby=job.standby)
        return Step(job.job_id, job.phase, wake_at=self.clock.now() + _BUSY_RETRY_S, standby=job.standby)

    def _view(self, job: JobState) -> MarketView:
        offers = []
        for name in job.req.providers or self.providers:
            try:
                offers += self.market_for(name).search_offers(OfferQuery(
                    gpu_names=job.req.gpu_names, min_gpu_ram_gb=job.req.min_gpu_ram_gb or None,
                    num_gpus=job.req.num_gpus, max_dph=job.req.max_dph, disk_gb=job.shape.disk_gb))
            except MarketError as exc:
                self.ledger.append(Event(kind="offer_search_failed", job=job.job_id, provider=name, reason=str(exc)))
        held = () if job.standby else tuple(h.policy_view() for h in self._adoptable(job))
        return MarketView(offers=tuple(offers), records=self.reputation.records(), held=held)

    def _adoptable(self, job: JobState) -> list[Held]:
        """Held hosts this job could take: within their hold, a standby host only for its own job's
        recovery, the same image and enough disk, and enough of the rental's kill-time left to train."""
        now = self.clock.now()
        owner = self.owner_of(job.job_id)
        want = self.launch_spec_for(owner)
        out = []
        refused = self._refused(job.job_id)
        for h in self.pool.held():
            if h.hold_until <= now or (h.standby and h.owner != owner) or h.id in refused:
                continue
            rental = self.rentals.get(h.rental_id)
            if rental is None or rental.state != "active":
                continue
            if rental.kill_at - now < job.shape.train_s + job.shape.overhead_s:
                continue
            try:
                have = self.rentals.spec_of(h.rental_id)
            except (KeyError, ValueError):
                continue
            if have.image != want.image or have.disk_gb < want.disk_gb:
                continue
            out.append(h)
        return out

    def _refused(self, job_id: str) -> set[str]:
        """Held hosts whose adoption this job's budget refused: not offered to it again."""
        owner = self.owner_of(job_id)
        return {str(e.payload.get("held")) for e in self.ledger.rows(job=owner, kind="adopt_refused")
                if e.payload.get("provisioning_job") == job_id}

    def _apply(self, job: JobState, act: Action, ctx: _Ctx | None = None) -> Observation | None:
        ctx = ctx if ctx is not None else _Ctx()
        now = self.clock.now()
        owner = self.owner_of(job.job_id)
        if isinstance(act, Create):
            return self._create(job, act)
        if isinstance(act, Adopt):
            return self._adopt(job, act, ctx)
        if isinstance(act, Hold):
            self._hold(job, act, ctx)
            return None
        if isinstance(act, WantStandby):
            ctx.spawned += self._want_standby(job, act)
            return None
        if isinstance(act, Destroy):
            rental = self._rental_of(act.instance_id)
            if rental is not None:
                self.rentals.destroy(rental.id, market=self.market_for(rental.provider), by="automation",
                                     reason=act.reason, now=now, evidence={"evidence": act.evidence})
            return None
        if isinstance(act, Stop):
            rental = self._rental_of(act.instance_id)
            if rental is not None:
                self.rentals.stop(rental.id, market=self.market_for(rental.provider), reason=act.reason,
                                  kind="instance_stopped", now=now, evidence={"evidence": act.evidence})
            return None
        if isinstance(act, Record):
            rec = self.reputation.record(act.provider, act.machine_id, act.event, now=now, reason=act.reason,
                                         evidence=act.evidence)
            extra = {} if owner == job.job_id else {"standby_job": job.job_id}
            if act.event == "failure":
                self.ledger.append(Event(
                    kind="host_failed", job=owner, provider=act.provider, machine=act.machine_id,
                    reason=act.reason or "", payload={"evidence": act.evidence, "quarantined_until": rec.quarantined_until,
                                                      "quarantine_permanent": rec.quarantine_permanent, **extra}))
            elif act.event == "preflight_passed":
                self.ledger.append(Event(kind="preflight_passed", job=owner, provider=act.provider,
                                         machine=act.machine_id, reason=act.evidence, payload=extra))
            return None
        if isinstance(act, GaveUp):
            ctx.ended = True
            if job.standby:
                self.ledger.append(Event(kind="standby_failed", job=owner, reason=act.reason,
                                         payload={"standby_job": job.job_id},
                                         idempotency_key=f"{job.job_id}:standby_failed"))
                return None
            self.ledger.append(Event(kind="provisioning_failed", job=job.job_id, reason=act.reason,
                                     idempotency_key=f"{job.job_id}:provisioning_failed"))
            return None
        if isinstance(act, Finished):
            ctx.ended = True
        if isinstance(act, Recovered | Finished):
            self.ledger.append(Event(kind=f"provisioning_{type(act).__name__.lower()}", job=job.job_id,
                                     payload=_plain(act)))
            return None
        return None

    def _rental_of(self, instance_id: str) -> Rental | None:
        for rental in self.rentals.all(states=("active", "stopped", "intent")):
            if rental.instance_id == instance_id:
                return rental
        return None

    # -- held hosts -----------------------------------------------------------------------------
    def _hold(self, job: JobState, act: Hold, ctx: _Ctx) -> None:
        """Keep the verified host running for the next compatible job (a standby host: for its job's recoveries)."""
        now = self.clock.now()
        rental = self._rental_of(act.host.instance_id)
        if rental is None or rental.state != "active":
            self.ledger.append(Event(kind="hold_skipped", job=self.owner_of(job.job_id), instance=act.host.instance_id,
                                     reason="no active rental for the host: nothing to hold",
                                     payload={"provisioning_job": job.job_id}))
            return
        until = min(act.host.hold_until, rental.kill_at)
        if act.host.standby:
            # The pool's size (plus one for a recovery waiting right now) at the standby hold; a
            # hedge beyond that gets only the ordinary hold (the sweep renews it if the pool
            # comes to want it).
            owner = rental.job
            waiting = [h for h in self.pool.held(owner=owner) if h.standby]
            wanted = self.pool.pool_size(owner) + (1 if self._recovering(owner) else 0)
            if len(waiting) >= wanted:
                until = min(until, now + self.cfg.hold_s)
        held = self.pool.hold(host=act.host, rental_id=rental.id, owner=rental.job, released_by=job.job_id,
                              held_work=rental.held_work, hold_until=until)
        if held is None:
            return
        self.ledger.append(Event(
            kind="host_held", job=rental.job, instance=rental.instance_id, provider=rental.provider,
            machine=rental.machine_id, rate_usd_per_hour=rental.rate_usd_per_hour,
            reason="standby host verified, kept for the job's recoveries" if held.standby
            else "verified host kept for the next compatible job",
            payload={"hold_until": until, "standby": held.standby, "released_by": job.job_id, "rental": rental.id,
                     "held_work": rental.held_work},
            idempotency_key=f"held:{held.id}"))
        if held.standby:
            ctx.holds.append(held.owner)

    def _adopt(self, job: JobState, act: Adopt, ctx: _Ctx) -> Observation | None:
        """Claim the held host for the job; None (and a fresh look) if someone else got it or it is gone."""
        now = self.clock.now()
        claimed = self.pool.claim(act.held.instance_id, job_id=job.job_id, now=now, once_since=job.lost_at)
        if claimed is None:
            other = self.pool.adopted_since(job.job_id, job.lost_at) if job.lost_at is not None else None
            if other is not None:
                self.ledger.append(Event(kind="adopt_skipped", job=self.owner_of(job.job_id), instance=act.held.instance_id,
                                         reason=f"another step of this recovery already adopted {other.instance_id}",
                                         payload={"provisioning_job": job.job_id, "adopted": other.instance_id}))
                raise _StepYields(other.instance_id)
            ctx.restep = True
            self.ledger.append(Event(kind="adopt_lost", job=self.owner_of(job.job_id), instance=act.held.instance_id,
                                     reason="another job adopted the held host first; looking again",
                                     payload={"provisioning_job": job.job_id}))
            return None
        rental = self.rentals.get(claimed.rental_id)
        market = self.market_for(claimed.provider)
        state = "unknown"
        try:
            state = market.status(claimed.instance_id).state
        except MarketError as exc:
            state = f"unknown ({exc})"
        if rental is None or rental.state != "active" or state != "running":
            ctx.restep = True
            self._drop(claimed, rental, f"held host was {state} when adopted", now=now, from_states=("adopted",))
            return None
        owner = self.owner_of(job.job_id)
        if rental.job != owner and not self._take_over(job, claimed, rental, ctx, now=now):
            return None
        self.ledger.append(Event(
            kind="host_adopted", job=job.job_id, instance=claimed.instance_id, provider=claimed.provider,
            machine=claimed.machine_id, rate_usd_per_hour=claimed.dph_total,
            reason="recovery adopts a verified standby host" if claimed.standby
            else "adopts a verified held host: no create, pull or preflight",
            payload={"rental": claimed.rental_id, "rental_job": claimed.owner, "released_by": claimed.released_by,
                     "standby": claimed.standby, "verified_at": claimed.verified_at, "held_s": now - claimed.verified_at},
            idempotency_key=f"adopted:{claimed.id}"))
        return Adopted(act.held)

    def _take_over(self, job: JobState, claimed: Held, rental: Rental, ctx: _Ctx, *, now: float) -> bool:
        """The adopter pays from the adoption on: its reservation for its training on this host is
        committed first (or the adoption is refused, the host goes back on hold, and the job
        provisions normally); then the rental is transferred to it (`Rentals.transfer`: the
        previous job's reservations settled with what it billed until now, in one transaction)."""
        owner = self.owner_of(job.job_id)
        caps = self.rentals.budget.caps()
        budget_name = owner if owner in caps else "default"
        offer = self.rentals.offer_of(rental.id)
        shape = job.shape
        reserve = self.reserve_factor * attempt_cost_usd(
            dph_total=rental.rate_usd_per_hour or offer.dph_total, storage_per_gb_month=rental.storage_per_gb_month,
            inet_down_per_gb=offer.inet_down_per_gb, inet_down_mbps=offer.inet_down_mbps, download_gb=0.0,
            train_s=shape.train_s, disk_gb=rental.disk_gb, overhead_s=shape.overhead_s)
        why = ""
        made = []
        if budget_name not in caps:
            why = f"budget: no cap for job {owner} and no 'default' cap"
        else:
            try:
                made = self.rentals.reserve_for(
                    job=owner, budget_name=budget_name, reserve_usd=reserve, dph_total=offer.dph_total,
                    num_gpus=offer.num_gpus, max_s=max(0.0, rental.kill_at - now),
                    idempotency_key=f"reserve:adopt:{claimed.id}:{owner}", now=now)
            except BudgetExceeded as exc:
                why = f"budget: {exc}"
        if not made:
            self.pool.unclaim(claimed.id, job_id=job.job_id)
            ctx.restep = True
            self.ledger.append(Event(kind="adopt_refused", job=owner, instance=claimed.instance_id,
                                     provider=claimed.provider, machine=claimed.machine_id,
                                     rate_usd_per_hour=claimed.dph_total, reason=why,
                                     payload={"held": claimed.id, "rental": rental.id, "rental_job": rental.job,
                                              "provisioning_job": job.job_id, "reserve_usd": reserve},
                                     idempotency_key=f"adopt_refused:{claimed.id}:{job.job_id}"))
            return False
        if not self.rentals.transfer(rental.id, from_job=rental.job, to_job=owner, reservations=made, now=now,
                                     reason=f"held host adopted by {owner}",
                                     evidence={"held": claimed.id, "provisioning_job": job.job_id}):
            for r in made:
                self.rentals.budget.release(r.id, reason="adoption fell through: the rental moved")
            ctx.restep = True
            current = self.rentals.get(rental.id)
            self._drop(claimed, current, "rental moved while being adopted", now=now, from_states=("adopted",))
            return False
        return True

    def _drop(self, h: Held, rental: Rental | None, why: str, *, now: float,
              from_states: tuple[str, ...] = ("held",)) -> None:
        """A held host that is gone (or whose rental ended): off the list, its rental settled or stopped."""
        if not self.pool.end(h.id, reason=why, now=now, from_states=from_states):
            return
        if rental is not None and rental.state in ("active", "stopped"):
            try:
                gone = self.market_for(h.provider).status(h.instance_id).state in ("gone", "exited")
            except MarketError:
                gone = False
            if gone:
                if self.rentals.transition(rental.id, to="lost", from_states=("active", "stopped"),
                                           kind="instance_lost", reason=why, now=now):
                    self.rentals.settle(rental.id, now=now, reason="held host lost: billing ended")
                self.reputation.record(h.provider, h.machine_id, "failure", now=now, reason="lost", evidence=why)
            elif rental.state == "active":
                self._stop_or_destroy(rental, reason="held host unusable", evidence=why, now=now)
        self.ledger.append(Event(kind="host_dropped", job=h.owner, instance=h.instance_id, provider=h.provider,
                                 machine=h.machine_id, reason=why, payload={"held": h.id},
                                 idempotency_key=f"dropped:{h.id}"))

    def _stop_or_destroy(self, rental: Rental, *, reason: str, evidence: str, now: float) -> str:
        """Automation's release of a host: stop one that held work (invariant 3), destroy one that never did."""
        market = self.market_for(rental.provider)
        if rental.held_work:
            self.rentals.stop(rental.id, market=market, reason=reason, kind="instance_stopped", now=now,
                              evidence={"evidence": evidence})
            return "stopped"
        self.rentals.destroy(rental.id, market=market, by="automation", reason=reason, now=now,
                             evidence={"evidence": evidence})
        return "destroyed"

    def release(self, h: Held, *, reason: str) -> str | None:
        """End a hold: stop the host if it held work, destroy it if it never did. None if someone else moved it."""
        now = self.clock.now()
        if not self.pool.end(h.id, reason=reason, now=now):
            return None
        rental = self.rentals.get(h.rental_id)
        action = "none"
        if rental is not None and rental.state == "active":
            action = self._stop_or_destroy(rental, reason=reason, evidence=f"held since {h.verified_at:.0f}", now=now)
        self.ledger.append(Event(kind="host_released", job=h.owner, instance=h.instance_id, provider=h.provider,
                                 machine=h.machine_id, rate_usd_per_hour=h.dph_total, reason=reason,
                                 payload={"held": h.id, "action": action, "standby": h.standby,
                                          "held_s": now - h.verified_at, "hold_until": h.hold_until},
                                 idempotency_key=f"released:{h.id}"))
        return action

    # -- standby jobs -------------------------------------------------------------------------------
    def _recovering(self, owner: str) -> bool:
        loaded = self.state(owner)
        return loaded is not None and loaded[0].lost_at is not None and loaded[0].phase not in ("done", "failed")

    def _running(self, owner: str) -> bool:
        loaded = self.state(owner)
        return loaded is not None and loaded[0].phase not in ("done", "failed")

    def _standby_wanted(self, job: JobState) -> bool:
        """A standby job between attempts: does its job still run and still want a host?"""
        owner = self.owner_of(job.job_id)
        if owner == job.job_id or not self._running(owner):
            return False
        if self._recovering(owner):
            return True
        waiting = [h for h in self.pool.held(owner=owner) if h.standby]
        return len(waiting) < self.pool.pool_size(owner)

    def _spawn(self, owner: JobState, *, purpose: str, key: str) -> str | None:
        """A new standby job for `owner` (None if `key` made one already)."""
        sj, made = self.pool.new_standby(owner.job_id, purpose=purpose, key=key, now=self.clock.now())
        if not made:
            return None
        job = replace(new_job(sj.job_id, req=owner.req, shape=owner.shape, standby=True), excluded=owner.excluded)
        self._save(job, 0, self.clock.now())
        return sj.job_id

    def _want_standby(self, job: JobState, act: WantStandby) -> list[str]:
        """A recovery hedges: start `count` standby jobs beside the job's own create."""
        if job.standby:
            return []
        made = [sid for i in range(act.count)
                if (sid := self._spawn(job, purpose="hedge", key=f"{job.job_id}:hedge:{job.creates + 1}:{i}"))]
        if made:
            self.ledger.append(Event(kind="standby_wanted", job=job.job_id, reason=act.why,
                                     payload={"count": act.count, "standby_jobs": made, "purpose": "hedge"},
                                     idempotency_key=f"{job.job_id}:hedge:{job.creates + 1}"))
        return made

    def _top_up(self, owner_id: str) -> list[str]:
        """Start standby jobs until the job's pool (held standby hosts + standby jobs still provisioning) is full."""
        size = self.pool.pool_size(owner_id)
        loaded = self.state(owner_id)
        if size <= 0 or loaded is None or loaded[0].phase in ("done", "failed"):
            return []
        owner = loaded[0]
        waiting = len([h for h in self.pool.held(owner=owner_id) if h.standby])
        pending = 0
        for sj in self.pool.standby_jobs(owner_id):
            st = self.state(sj.job_id)
            if st is not None and st[0].phase not in ("done", "failed"):
                pending += 1
        made = []
        taken = len(self.pool.standby_jobs(owner_id))
        for i in range(size - waiting - pending):
            sid = self._spawn(owner, purpose="pool", key=f"{owner_id}:pool:{taken + i + 1}")
            if sid is not None:
                made.append(sid)
        if made:
            self.ledger.append(Event(kind="standby_wanted", job=owner_id, reason=f"standby pool of {size}",
                                     payload={"count": len(made), "standby_jobs": made, "purpose": "pool"}))
        return made

    def _offer_to_recovery(self, owner_id: str) -> list[Step]:
        """A standby host was just verified: a job recovering right now takes it. If its own
        replacement is still booting, that attempt goes to a new standby job (`hand_over`), under
        the owner's step lease (so the owner's own preflight cannot pass that attempt meanwhile)."""
        out: list[Step] = []
        with self.leases.held(owner_id) as held:
            if not held:
                return []  # the owner is mid-step for long: its next tick adopts the held host itself
            loaded = self.state(owner_id)
            if loaded is None:
                return []
            job, version = loaded
            if job.lost_at is None or job.phase not in ("queued", "booting", "preflight"):
                return []
            if job.phase != "queued":
                sj, _ = self.pool.new_standby(owner_id, purpose="hand_over",
                                              key=f"{owner_id}:hand_over:{job.attempt.instance_id if job.attempt else ''}",
                                              now=self.clock.now())
                moved = hand_over(job, standby_id=sj.job_id)
                if moved is None:
                    return []
                back, standby = moved
                # Both states in one transaction: the attempt is always in exactly one of them, even
                # if the process dies here (a redelivered task finds the job as it was and, its
                # standby job's key being the attempt's, hands over to the same standby job).
                if not self._save_all([(back, version, self.clock.now()), (standby, 0, self.clock.now())]):
                    return []  # the job moved meanwhile (or the hand-over was done): its own step decides
                att = standby.attempt
                self.ledger.append(Event(kind="attempt_handed_over", job=owner_id,
                                         instance=att.instance_id if att else None,
                                         reason="a standby host was verified first; the recovery's own attempt goes on as standby",
                                         payload={"standby_job": sj.job_id, "phase": standby.phase},
                                         idempotency_key=f"{sj.job_id}:attempt_handed_over"))
                out.append(Step(sj.job_id, standby.phase, wake_at=self.clock.now(), standby=True,
                                preflight_instance=att.instance_id if att and standby.phase == "preflight" else None))
        out.append(self.step(owner_id))
        return out

    def release_pool(self, owner_id: str, *, reason: str) -> list[str]:
        """The job ended: release its standby hosts and stop its standby jobs' attempts."""
        now = self.clock.now()
        out = []
        for h in self.pool.held(owner=owner_id):
            if h.standby and self.release(h, reason=f"standby no longer needed: {reason}"):
                out.append(h.instance_id)
        for sj in self.pool.standby_jobs(owner_id):
            loaded = self.state(sj.job_id)
            if loaded is None or loaded[0].phase in ("done", "failed"):
                continue
            st, version = loaded
            att = st.attempt
            if not self._save(replace(st, phase="done", attempt=None, failure="no longer needed"), version, None):
                continue
            if att is not None:
                rental = self._rental_of(att.instance_id)
                if rental is not None and rental.state == "active":
                    self._stop_or_destroy(rental, reason="standby no longer needed", evidence=reason, now=now)
                    out.append(att.instance_id)
        return out

    def sweep_holds(self) -> HoldSweep:
        """Beat's pass over every held host and standby pool (one task per sweep, not per host)."""
        report = HoldSweep()
        now = self.clock.now()
        for h in self.pool.held():
            report.examined += 1
            rental = self.rentals.get(h.rental_id)
            if rental is None or rental.state != "active":
                self._drop(h, rental, f"rental {rental.state if rental else 'missing'}", now=now)
                report.dropped.append(h.instance_id)
                continue
            try:
                state = self.market_for(h.provider).status(h.instance_id).state
            except MarketError as exc:
                report.errors.append(f"{h.instance_id}: {exc}")
                state = "running" if now < h.hold_until else "unknown"
            if state in ("gone", "exited", "stopped"):
                self._drop(h, rental, f"held host reported {state}", now=now)
                report.dropped.append(h.instance_id)
                continue
            if h.standby and h.hold_until > now + self.cfg.hold_s and not self._recovering(h.owner):
                # Held long because a recovery wanted it, which then took another host verified at
                # the same moment: beyond the pool it asked for, it gets the ordinary hold from now.
                long = [x for x in self.pool.held(owner=h.owner) if x.standby and x.hold_until > now + self.cfg.hold_s]
                if len(long) > self.pool.pool_size(h.owner) and self.pool.renew(h.id, hold_until=now + self.cfg.hold_s):
                    self.ledger.append(Event(kind="host_hold_shortened", job=h.owner, instance=h.instance_id,
                                             provider=h.provider, machine=h.machine_id,
                                             reason="standby host beyond the pool once the recovery took another",
                                             payload={"hold_until": now + self.cfg.hold_s, "was": h.hold_until},
                                             idempotency_key=f"shortened:{h.id}"))
                    continue
            if now < h.hold_until:
                continue
            if h.standby and self._running(h.owner) and rental.kill_at - now > self.cfg.hold_s:
                waiting = [x for x in self.pool.held(owner=h.owner) if x.standby and x.hold_until > now]
                if len(waiting) < self.pool.pool_size(h.owner):
                    until = min(now + self.cfg.standby_hold_s, rental.kill_at)
                    if self.pool.renew(h.id, hold_until=until):
                        report.renewed.append(h.instance_id)
                        self.ledger.append(Event(kind="host_hold_renewed", job=h.owner, instance=h.instance_id,
                                                 provider=h.provider, machine=h.machine_id,
                                                 reason="standby pool still wants it", payload={"hold_until": until},
                                                 idempotency_key=f"renewed:{h.id}:{int(until)}"))
                        continue
            try:
                if self.release(h, reason="hold expired"):
                    report.released.append(h.instance_id)
            except MarketError as exc:
                report.errors.append(f"{h.instance_id}: {exc}")
        for owner_id in self.pool.pools():
            if not self._running(owner_id):
                report.released += self.release_pool(owner_id, reason="job over")
                continue
            loaded = self.state(owner_id)
            if loaded is not None and loaded[0].phase == "training":
                for sid in self._top_up(owner_id):
                    report.steps.append(Step(sid, "queued", wake_at=now, standby=True))
        return report

    # -- creates --------------------------------------------------------------------------------
    def _create(self, job: JobState, act: Create) -> Observation:
        now = self.clock.now()
        sj = self.pool.standby_job(job.job_id)
        owner = job.job_id if sj is None else sj.owner
        base = 0 if sj is None else sj.n * STANDBY_ATTEMPT_BASE
        # Idempotent per attempt (a redelivered task reuses its intent), but a create abandoned
        # because the offer was taken (another job got there first) used up its number: without
        # skipping it, every later try would find that abandoned rental and the job would spin.
        # A standby job's rentals are its owner's, numbered from 1000 * n.
        abandoned = [r for r in self.rentals.all(states=("abandoned",), job=owner)
                     if base < r.attempt < base + STANDBY_ATTEMPT_BASE]
        attempt = base + job.creates + 1 + len(abandoned)
        offer = act.offer
        shape = job.shape
        reserve = self.reserve_factor * attempt_cost_usd(
            dph_total=offer.dph_total, storage_per_gb_month=offer.storage_per_gb_month,
            inet_down_per_gb=offer.inet_down_per_gb, inet_down_mbps=offer.inet_down_mbps,
            download_gb=shape.download_gb, train_s=shape.train_s, disk_gb=shape.disk_gb, overhead_s=shape.overhead_s)
        spec = self.launch_spec_for(owner)
        rental_id = f"{owner}:{attempt}"
        extra = {} if sj is None else {"standby_job": job.job_id, "purpose": sj.purpose}
        caps = self.rentals.budget.caps()
        budget_name = owner if owner in caps else "default"
        if budget_name not in caps:
            why = (f"budget: no cap for job {owner} and no 'default' cap. Fix: give the job file a budget_usd, "
                   "or tuneharness budget set default --cap-usd N")
            self.ledger.append(Event(kind="create_refused", job=owner, reason=why, payload=extra,
                                     idempotency_key=f"refused:{rental_id}:{int(now)}"))
            return BudgetRefused(offer, cap=owner, detail=why)
        try:
            self.rentals.plan(job=owner, attempt=attempt, offer=offer, disk_gb=spec.disk_gb, ttl_s=self.ttl_s,
                              now=now, reserve_usd=reserve, budget_name=budget_name, spec=spec)
        except BudgetExceeded as exc:
            self.ledger.append(Event(kind="create_refused", job=owner, reason=str(exc), payload=extra,
                                     idempotency_key=f"refused:{rental_id}:{int(now)}"))
            return BudgetRefused(offer, cap=exc.budget, detail=str(exc))
        try:
            rental = self.rentals.execute(rental_id, market=self.market_for(offer.provider), spec=spec, now=now)
        except OfferGone as exc:
            self.rentals.abandon(rental_id, reason=f"offer gone: {exc}", now=now)
            return CreateResult(offer, None, str(exc))
        except MarketError as exc:
            self.rentals.abandon(rental_id, reason=f"provider refused: {exc}", now=now)
            return CreateResult(offer, None, str(exc))
        self.ledger.append(Event(kind="offer_chosen", job=owner, instance=rental.instance_id,
                                 provider=offer.provider, machine=offer.machine_id,
                                 rate_usd_per_hour=offer.dph_total, reason=act.why, payload=extra,
                                 idempotency_key=f"chosen:{rental_id}"))
        return CreateResult(offer, rental.instance_id)

    def _start_training(self, job: JobState, act: StartTraining) -> None:
        rental = self._rental_of(act.instance_id)
        if rental is not None:
            self.rentals.mark_held_work(rental.id)
        self.ledger.append(Event(kind="training_handed_over", job=job.job_id, instance=act.instance_id,
                                 provider=job.attempt.provider if job.attempt else None,
                                 machine=job.attempt.machine_id if job.attempt else None,
                                 reason="host verified; the supervisor takes over",
                                 payload={"resume_from_work_s": act.resume_from_work_s,
                                          "rental": rental.id if rental else None},
                                 idempotency_key=f"{job.job_id}:handed_over:{act.instance_id}"))


def _plain(act: Any) -> dict[str, Any]:
    from dataclasses import asdict

    return {k: v for k, v in asdict(act).items() if isinstance(v, str | int | float | bool | type(None))}

