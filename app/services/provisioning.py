"""The provisioning handler: the real-time driver of `app.policy.provisioning.decide`.

Celery's `provision`, `watch_boot` and `preflight` tasks are thin shells around `step` and
`preflight`: load the job's policy state, build the observation through the ports (the market,
SSH), call the pure `decide`, apply each action (creates through the crash-safe rental protocol
with its budget reservation, destroys that automation is allowed, reputation and quarantine,
ledger events with the evidence), save the state, and say when to look again. The campaign
simulator (`workers/campaign.py`) drives the same `decide` in virtual time.

Scope: from queued to "training handed over"; the supervisor (`app.services.supervisor`) takes the
job from there and feeds what it sees back through `observe` (lost host, hang, finished).
Held hosts (hold-and-batch) are not kept across jobs on this path yet: a `Hold` stops the host.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, select
from sqlmodel import Field, SQLModel

from app.db import read_connection, write_transaction
from app.errors import BudgetExceeded
from app.ledger import Event, Ledger
from app.market import LaunchSpec, Market, MarketError, OfferGone, OfferQuery
from app.policy.codec import dump_job, load_job
from app.policy.provisioning import (
    Action,
    Adopt,
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
    WakeAt,
    decide,
    guarded_config,
    new_job,
)
from app.policy.ranking import JobShape, Requirements, attempt_cost_usd
from app.ports import Clock
from app.rentals import Rentals
from app.reputation import ReputationStore

__all__ = ["ProvisioningService", "ProvisioningStateRow", "Step"]

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


@dataclass(frozen=True, slots=True)
class Step:
    """What the Celery shell does next: look again at `wake_at`, run a preflight, or nothing."""

    job_id: str
    phase: str
    wake_at: float | None = None
    preflight_instance: str | None = None
    handed_over: str | None = None  # instance id the job now trains on
    failure: str | None = None


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

    # -- state ------------------------------------------------------------------------------
    def state(self, job_id: str) -> tuple[JobState, int] | None:
        with read_connection(self.engine) as conn:
            row = conn.execute(select(_T).where(_T.c.job_id == job_id)).first()
        return None if row is None else (load_job(json.loads(row.state_json)), int(row.version))

    def _save(self, job: JobState, version: int, wake_at: float | None) -> bool:
        """Write the new state if nobody else moved it since `version` (a redelivered task)."""
        with write_transaction(self.engine, lock=f"tuneharness.provisioning.{job.job_id}") as conn:
            row = conn.execute(select(_T.c.version).where(_T.c.job_id == job.job_id)).first()
            values = {"state_json": json.dumps(dump_job(job)), "wake_at": wake_at, "updated_at": self.clock.now()}
            if row is None:
                conn.execute(_T.insert().values(job_id=job.job_id, version=1, **values))
                return True
            if int(row.version) != version:
                return False
            conn.execute(_T.update().where(_T.c.job_id == job.job_id).values(version=version + 1, **values))
            return True

    def start(self, job_id: str, *, req: Requirements, shape: JobShape) -> Step:
        """Begin provisioning a job (idempotent: a second start just steps it)."""
        if self.state(job_id) is None:
            self._save(new_job(job_id, req=req, shape=shape), 0, self.clock.now())
            self.ledger.append(Event(kind="provisioning_started", job=job_id, reason="job accepted",
                                     payload={"providers": list(self.providers)},
                                     idempotency_key=f"{job_id}:provisioning_started"))
        return self.step(job_id)

    # -- the steps the tasks call -----------------------------------------------------------
    def step(self, job_id: str) -> Step:
        """A wake-up: observe what the job's phase needs to see, decide, apply."""
        loaded = self.state(job_id)
        if loaded is None:
            return Step(job_id, "unknown")
        job, version = loaded
        obs: Observation | None = None
        if job.phase == "queued":
            obs = Tick(view=self._view(job))
        elif job.phase in ("booting", "preflight") and job.attempt is not None:
            obs = Polled(self.market_for(job.attempt.provider).status(job.attempt.instance_id))
        if obs is None:
            return Step(job_id, job.phase)
        return self._run(job, version, obs)

    def preflight(self, job_id: str, instance_id: str) -> Step:
        """Run the preflight on the job's new host (over SSH) and judge it."""
        loaded = self.state(job_id)
        if loaded is None:
            return Step(job_id, "unknown")
        job, version = loaded
        if job.phase != "preflight" or job.attempt is None or job.attempt.instance_id != instance_id:
            return Step(job_id, job.phase)  # stale: the job moved on
        result = self.run_preflight(self.market_for(job.attempt.provider), job_id, instance_id)
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
        job, version = loaded
        job, actions = stop_job(job, reason=reason, evidence=evidence)
        for act in actions:
            self._apply(job, act)
        self._save(job, version, None)
        return Step(job.job_id, job.phase, failure=job.failure)

    # -- the loop -----------------------------------------------------------------------------
    def _run(self, job: JobState, version: int, first: Observation) -> Step:
        pending: list[Observation] = [first]
        wake_at: float | None = None
        preflight_instance: str | None = None
        handed_over: str | None = None
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
                    follow = self._apply(job, act)
                    if follow is not None:
                        pending.append(follow)
        if not self._save(job, version, wake_at):
            self.ledger.append(Event(kind="provisioning_conflict", job=job.job_id,
                                     reason="state moved by another task; this step's state discarded"))
        return Step(job.job_id, job.phase, wake_at=wake_at, preflight_instance=preflight_instance,
                    handed_over=handed_over, failure=job.failure)

    def _view(self, job: JobState) -> MarketView:
        offers = []
        for name in job.req.providers or self.providers:
            try:
                offers += self.market_for(name).search_offers(OfferQuery(
                    gpu_names=job.req.gpu_names, min_gpu_ram_gb=job.req.min_gpu_ram_gb or None,
                    num_gpus=job.req.num_gpus, max_dph=job.req.max_dph, disk_gb=job.shape.disk_gb))
            except MarketError as exc:
                self.ledger.append(Event(kind="offer_search_failed", job=job.job_id, provider=name, reason=str(exc)))
        return MarketView(offers=tuple(offers), records=self.reputation.records())

    def _apply(self, job: JobState, act: Action) -> Observation | None:
        now = self.clock.now()
        if isinstance(act, Create):
            return self._create(job, act)
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
            if act.event == "failure":
                self.ledger.append(Event(
                    kind="host_failed", job=job.job_id, provider=act.provider, machine=act.machine_id,
                    reason=act.reason or "", payload={"evidence": act.evidence, "quarantined_until": rec.quarantined_until,
                                                      "quarantine_permanent": rec.quarantine_permanent}))
            elif act.event == "preflight_passed":
                self.ledger.append(Event(kind="preflight_passed", job=job.job_id, provider=act.provider,
                                         machine=act.machine_id, reason=act.evidence))
            return None
        if isinstance(act, GaveUp):
            self.ledger.append(Event(kind="provisioning_failed", job=job.job_id, reason=act.reason,
                                     idempotency_key=f"{job.job_id}:provisioning_failed"))
            return None
        if isinstance(act, Hold):
            # Hold-and-batch is not kept on the real-time path: the finished job's host is stopped.
            self.ledger.append(Event(kind="provisioning_hold", job=job.job_id, payload=_plain(act)))
            rental = self._rental_of(act.host.instance_id)
            if rental is not None:
                self.rentals.stop(rental.id, market=self.market_for(rental.provider), reason="job finished",
                                  kind="instance_stopped", now=now,
                                  evidence={"evidence": "adapter pulled; held hosts are not kept on the real-time path"})
            return None
        if isinstance(act, Adopt | Recovered | Finished):
            self.ledger.append(Event(kind=f"provisioning_{type(act).__name__.lower()}", job=job.job_id,
                                     payload=_plain(act)))
            return None
        return None

    def _rental_of(self, instance_id: str) -> Any:
        for rental in self.rentals.all(states=("active", "stopped", "intent")):
            if rental.instance_id == instance_id:
                return rental
        return None

    def _create(self, job: JobState, act: Create) -> Observation:
        now = self.clock.now()
        # Idempotent per attempt (a redelivered task reuses its intent), but a create abandoned
        # because the offer was taken (another job got there first) used up its number: without
        # skipping it, every later try would find that abandoned rental and the job would spin.
        attempt = job.creates + 1 + len(self.rentals.all(states=("abandoned",), job=job.job_id))
        offer = act.offer
        shape = job.shape
        reserve = self.reserve_factor * attempt_cost_usd(
            dph_total=offer.dph_total, storage_per_gb_month=offer.storage_per_gb_month,
            inet_down_per_gb=offer.inet_down_per_gb, inet_down_mbps=offer.inet_down_mbps,
            download_gb=shape.download_gb, train_s=shape.train_s, disk_gb=shape.disk_gb, overhead_s=shape.overhead_s)
        spec = self.launch_spec_for(job.job_id)
        rental_id = f"{job.job_id}:{attempt}"
        caps = self.rentals.budget.caps()
        budget_name = job.job_id if job.job_id in caps else "default"
        if budget_name not in caps:
            why = (f"budget: no cap for job {job.job_id} and no 'default' cap. Fix: give the job file a budget_usd, "
                   "or tuneharness budget set default --cap-usd N")
            self.ledger.append(Event(kind="create_refused", job=job.job_id, reason=why,
                                     idempotency_key=f"refused:{rental_id}:{int(now)}"))
            return CreateResult(offer, None, why)
        try:
            self.rentals.plan(job=job.job_id, attempt=attempt, offer=offer, disk_gb=spec.disk_gb, ttl_s=self.ttl_s,
                              now=now, reserve_usd=reserve, budget_name=budget_name, spec=spec)
        except BudgetExceeded as exc:
            self.ledger.append(Event(kind="create_refused", job=job.job_id, reason=str(exc),
                                     idempotency_key=f"refused:{rental_id}:{int(now)}"))
            return CreateResult(offer, None, f"budget: {exc}")
        try:
            rental = self.rentals.execute(rental_id, market=self.market_for(offer.provider), spec=spec, now=now)
        except OfferGone as exc:
            self.rentals.abandon(rental_id, reason=f"offer gone: {exc}", now=now)
            return CreateResult(offer, None, str(exc))
        except MarketError as exc:
            self.rentals.abandon(rental_id, reason=f"provider refused: {exc}", now=now)
            return CreateResult(offer, None, str(exc))
        self.ledger.append(Event(kind="offer_chosen", job=job.job_id, instance=rental.instance_id,
                                 provider=offer.provider, machine=offer.machine_id,
                                 rate_usd_per_hour=offer.dph_total, reason=act.why,
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
                                 payload={"resume_from_work_s": act.resume_from_work_s},
                                 idempotency_key=f"{job.job_id}:handed_over:{act.instance_id}"))


def _plain(act: Any) -> dict[str, Any]:
    from dataclasses import asdict

    return {k: v for k, v in asdict(act).items() if isinstance(v, str | int | float | bool | type(None))}

