"""The provisioning handler: the real-time driver of the provisioning policy.

Celery's `provision`, `watch_boot` and `preflight` tasks are thin shells around `step` and
`preflight`: load the job's policy state, build the observation through the ports (the market,
SSH), and hand both to the one interpreter (`app.interpreter.drive`), whose actions this driver
applies through `StepEffects` (creates through the crash-safe rental protocol with their budget
reservation, destroys that automation is allowed, reputation and quarantine, ledger events with
the evidence); then save the state and say when to look again. The campaign simulator
(`providers/sim/campaign`) drives the same policy, through the same interpreter, in virtual time.

Scope: from queued to "training handed over"; the supervisor (`app.services.supervisor`) takes the
job from there and feeds what it sees back through `observe` (lost host, hang, finished). The
fleet above one job (standby pools, hedged refills, holds, budget stops) is decided by
`app.policy.fleet` and applied by `Standby` and `Holds`.

Every step holds the job's step lease (`app.services.leases`) from re-reading its state to saving
it, so two tasks stepping one job at once never both rent or adopt.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import replace

from sqlalchemy import Engine

from app.alerts import Alert, Notifier
from app.blocking import ProvidersUnusable, clean
from app.errors import UserError
from app.gpu_speeds import GpuSpeedStore
from app.interpreter import apply, drive
from app.jobs import JobStore
from app.ledger import Event, Ledger
from app.market import AuthFailed, LaunchSpec, Market, MarketError, Offer, OfferQuery
from app.policy.fleet import budget_exhausted, kill_after_s, pull_rate_seen, reservation_usd
from app.policy.gpus import hardware_key
from app.policy.provisioning import (
    BudgetCapReached,
    FailureSeen,
    JobState,
    MarketView,
    Observation,
    Polled,
    PreflightResult,
    ProvisioningConfig,
    RecoveryProgress,
    Tick,
    TrainerStatus,
    guarded_config,
    new_job,
)
from app.policy.ranking import JobShape, Requirements
from app.policy.speeds import speed_model
from app.ports import Clock
from app.rentals import Rental, Rentals
from app.reputation import ReputationStore
from app.services.leases import StepLeases
from app.services.pool import Held, Pool
from app.services.provisioning.effects import StepEffects, next_attempt
from app.services.provisioning.holds import Holds
from app.services.provisioning.standby import Standby
from app.services.provisioning.state import StateStore
from app.services.provisioning.types import HoldSweep, Step, StepBusy, StepContext, StepYields

__all__ = ["PreflightRunner", "ProvisioningService", "offer_query"]

PreflightRunner = Callable[[Market, str, str], PreflightResult]  # (market, job id, instance id)

_BUSY_RETRY_S = 5.0


def offer_query(req: Requirements, shape: JobShape) -> OfferQuery:
    """What a job asks each marketplace for (the policy filters and ranks what comes back)."""
    return OfferQuery(
        gpu_names=req.gpu_names,
        min_gpu_ram_gb=req.min_gpu_ram_gb or None,
        num_gpus=req.num_gpus,
        max_dph=req.max_dph,
        disk_gb=shape.disk_gb,
        datacenter_only=req.datacenter_only,
    )


def _same_situation(loaded: JobState, now: JobState) -> bool:
    """Whether an observation made against `loaded` still applies to the job as it is `now`."""

    def where(j: JobState) -> tuple[object, ...]:
        return (j.phase, j.attempt.instance_id if j.attempt else None, j.lost_at, j.standby)

    return where(loaded) == where(now)


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
        ttl_s: float | None = None,
        rng: random.Random | None = None,
        notifier: Notifier | None = None,
    ) -> None:
        self.engine = engine
        self.notifier = notifier  # warnings that need no decision (a provider skipped)
        self.market_for = market_for
        self.clock = clock
        self.run_preflight = run_preflight
        self.launch_spec_for = launch_spec_for
        self.providers = providers
        self.cfg = cfg or guarded_config()
        self.ttl_s = ttl_s  # every rental's kill-time after its create; None: derived per job and offer
        self.rng = rng or random.Random()
        self.ledger = Ledger(engine)
        self.rentals = Rentals(engine, ledger=self.ledger)
        self.reputation = ReputationStore(engine)
        self.speeds = GpuSpeedStore(engine)
        self.pool = Pool(engine)
        self.leases = StepLeases(engine)
        self.states = StateStore(engine)
        self.holds = Holds(self)
        self.standby = Standby(self)

    # -- state ------------------------------------------------------------------------------
    def state(self, job_id: str) -> tuple[JobState, int] | None:
        return self.states.load(job_id)

    def overdue(self, *, grace_wall_s: float) -> list[str]:
        """Jobs whose wake-up is more than `grace_wall_s` wall seconds past: the task that should have
        stepped them was lost (a worker killed between tasks, a broker that lost its queue). A live
        chain always wakes at or before its wake-up, so these have none; `redrive` gives them one."""
        now = self.clock.now()
        return sorted(
            job_id
            for job_id, wake_at in self.states.wake_times().items()
            if self.clock.wall_seconds(now - wake_at) > grace_wall_s
        )

    def save(self, writes: Sequence[tuple[JobState, int, float | None]]) -> bool:
        """Write jobs' states in one transaction, all or none (see StateStore.save)."""
        return self.states.save(writes, now=self.clock.now())

    def owner_of(self, job_id: str) -> str:
        """The job a standby job rents for (itself for any other job)."""
        sj = self.pool.standby_job(job_id)
        return job_id if sj is None else sj.owner

    def ttl_for(self, shape: JobShape, offer: Offer, *, standby: bool = False) -> float:
        """A rental's kill-time after its create: the job's (`needs.kill_after_hours`, else derived
        from its pull, training and overhead; `app.policy.fleet.kill_after_s`), plus the standby hold
        for a host that waits before it trains; a fixed `ttl_s` when the service was given one."""
        if self.ttl_s is not None:
            return self.ttl_s
        return kill_after_s(offer, shape, waits_s=self.cfg.standby_hold_s if standby else 0.0)

    def providers_for(self, req: Requirements) -> tuple[str, ...]:
        """The marketplaces a job's offers are searched on: its own list, else the configured ones."""
        return req.providers or self.providers

    def rental_of(self, instance_id: str) -> Rental | None:
        for rental in self.rentals.all(states=("active", "stopped", "intent")):
            if rental.instance_id == instance_id:
                return rental
        return None

    def start(self, job_id: str, *, req: Requirements, shape: JobShape, standby_hosts: int = 0) -> Step:
        """Begin provisioning a job (idempotent: a second start just steps it).

        `standby_hosts`: verified hosts kept waiting for this job's recoveries while it trains.
        """
        if standby_hosts > 0:
            self.pool.set_pool(job_id, standby_hosts)
        if self.state(job_id) is None:
            self.save([(new_job(job_id, req=req, shape=shape), 0, self.clock.now())])
            self.ledger.append(
                Event(
                    kind="provisioning_started",
                    job=job_id,
                    reason="job accepted",
                    payload={"providers": list(self.providers), "standby_hosts": standby_hosts},
                    idempotency_key=f"{job_id}:provisioning_started",
                )
            )
        return self.step(job_id)

    # -- the steps the tasks call -----------------------------------------------------------
    def step(self, job_id: str) -> Step:
        """A wake-up: observe what the job's phase needs to see, decide, apply."""
        loaded = self.state(job_id)
        if loaded is None:
            return Step(job_id, "unknown")
        job, version = loaded
        if job.standby and job.phase == "queued" and not self.standby.wanted(job) and not self._created_unsaved(job):
            # Between attempts and nobody needs it any more: stop rolling the dice.
            done = replace(job, phase="done", failure="no longer needed")
            if self.save([(done, version, None)]):
                self.ledger.append(
                    Event(
                        kind="standby_cancelled",
                        job=self.owner_of(job_id),
                        reason="standby host no longer needed",
                        payload={"standby_job": job_id},
                        idempotency_key=f"{job_id}:standby_cancelled",
                    )
                )
            return Step(job_id, "done", standby=True)
        obs: Observation | None = None
        if job.phase == "queued":
            view = self._view(job)
            obs = Tick(view=view)
            owner = self.owner_of(job_id)
            if budget_exhausted(
                budget_left_usd=view.budget_left_usd,
                anything_live=bool(view.held) or self._spending(owner),
                cheapest_attempt_usd=min(
                    (reservation_usd(o, job.shape, self.cfg) for o in view.offers), default=math.inf
                ),
            ):
                obs = BudgetCapReached(
                    f"budget of {owner}",
                    f"${view.budget_left_usd:.4f} left, less than the "
                    "cheapest attempt reserves; nothing of it still runs",
                )
        elif job.phase in ("booting", "preflight") and job.attempt is not None:
            obs = Polled(self.market_for(job.attempt.provider).status(job.attempt.instance_id))
        if obs is None:
            return Step(job_id, job.phase, standby=job.standby)
        result = self._run(job, version, obs)
        if isinstance(obs, Polled):
            after = self.state(job_id)
            rate = None if after is None else pull_rate_seen(job, after[0], now=self.clock.now())
            if rate is not None and job.attempt is not None:
                self.pool.note_pull_rate(job.attempt.provider, job.attempt.instance_id, rate, now=self.clock.now())
            progress = self._recovery_progress(job_id)
            if progress is not None:
                result = replace(result, also=(*result.also, progress))
        return result

    def _created_unsaved(self, job: JobState) -> bool:
        """Does the rental of the job's next attempt exist already (a create recorded, or sent, by a
        step that died before it saved the job)? Then the job carries on with it (its create is
        idempotent per attempt) rather than end and leave it to the reaper."""
        owner, attempt = next_attempt(self, job)
        rental = self.rentals.get(f"{owner}:{attempt}")
        if rental is None:
            return False
        return rental.state in ("active", "stopped") or (
            rental.state == "intent" and self.rentals.create_sent_at(rental.id) is not None
        )

    def _recovery_progress(self, job_id: str) -> Step | None:
        """Show the waiting recovery this job's boot works for (its own, or the one it hedges for)
        the chains working for it: progress-aware hedging (off unless progress_hedge_max > 0)."""
        if self.cfg.progress_hedge_max <= 0 or self.cfg.recovery_hedge <= 1:
            return None
        sj = self.pool.standby_job(job_id)
        rec = job_id if sj is None else (sj.owner if sj.purpose == "hedge" else None)
        loaded = None if rec is None else self.state(rec)
        if rec is None or loaded is None or loaded[0].lost_at is None:
            return None
        chains = tuple(
            st[0]
            for h in self.pool.standby_jobs(rec)
            if h.purpose == "hedge"
            if (st := self.state(h.job_id)) is not None
        )
        view = MarketView(records=self.reputation.records(), pull_rates_gb_per_s=tuple(self.pool.pull_rates()))
        return self.observe(rec, RecoveryProgress(chains=chains, view=view))

    def preflight(self, job_id: str, instance_id: str, *, result: PreflightResult | None = None) -> Step:
        """Run the preflight on the job's new host (over SSH, with the key of the job it rents for) and
        judge it; `result`: a verdict reached without running it (the vendor could not be asked)."""
        loaded = self.state(job_id)
        if loaded is None:
            return Step(job_id, "unknown")
        job, version = loaded
        if job.phase != "preflight" or job.attempt is None or job.attempt.instance_id != instance_id:
            return Step(job_id, job.phase, standby=job.standby)  # stale: the job moved on
        owner = self.owner_of(job_id)
        if result is None:
            result = self.run_preflight(self.market_for(job.attempt.provider), owner, instance_id)
        return self._run(job, version, self._with_knowledge(result, owner=owner, provider=job.attempt.provider))

    def _with_knowledge(self, result: PreflightResult, *, owner: str, provider: str) -> PreflightResult:
        """The preflight's result with what judging it needs: the passing preflights of the reported
        GPU model on our machines, the job's own `needs.expected_tflops`, and our record of the
        hardware the report identifies (app.policy.speeds, app.policy.gpus.hardware_key)."""
        report = result.report
        if report is None:
            return result
        rec = JobStore(self.engine).get(owner)
        override = (rec.spec.get("needs") or {}).get("expected_tflops") if rec is not None else None
        hw = hardware_key(gpu_uuid=report.gpu_uuid, host_machine_id=report.host_machine_id)
        view = None if hw is None else self.reputation.get(provider, hw)
        return replace(
            result,
            speeds=tuple(self.speeds.samples(speed_model(report.gpu_name or ""))),
            expected_tflops=float(override) if isinstance(override, int | float) else None,
            hardware=None if view is None else view.record,
        )

    def fail_seen(self, job_id: str, reason: str, evidence: str) -> Step:
        """An outside observer (e.g. the supervisor) reports a failure of the job's host."""
        return self.observe(job_id, FailureSeen(reason, evidence))

    def observe(self, job_id: str, obs: Observation) -> Step:
        """An outside observation of the job (the supervisor's TrainerStatus, the budget monitor's
        BudgetCapReached): decide and apply."""
        loaded = self.state(job_id)
        if loaded is None:
            return Step(job_id, "unknown")
        job, version = loaded
        return self._run(job, version, obs)

    def end_at_cap(self, job_id: str, *, cap: str, evidence: str) -> list[Step]:
        """The budget monitor: a cap over this job is reached. The job and its standby jobs end where
        they stand (their hosts stopped, or destroyed if they never held work; nothing new rented)."""
        steps = []
        for jid in [job_id, *(sj.job_id for sj in self.pool.standby_jobs(job_id))]:
            loaded = self.state(jid)
            if loaded is not None and loaded[0].phase not in ("done", "failed"):
                steps.append(self.observe(jid, BudgetCapReached(cap, evidence)))
        return steps

    def give_up_training(self, job_id: str, *, reason: str, evidence: str) -> Step:
        """The supervisor stops a training job for good (triage: a new host won't fix it)."""
        from app.policy.supervision import stop_job

        with self.leases.held(job_id) as held:
            if not held:
                raise StepBusy(f"job {job_id}: another provisioning step still holds it; try again")
            loaded = self.state(job_id)  # as it is now, under the lease
            if loaded is None:
                return Step(job_id, "unknown")
            job, version = loaded
            job, actions = stop_job(job, reason=reason, evidence=evidence)
            fx = StepEffects(self, StepContext())
            for act in actions:
                apply(fx, job, act)
            self.save([(job, version, None)])
        self.standby.release_pool(job_id, reason=f"job stopped: {reason}")
        return Step(job.job_id, job.phase, failure=job.failure)

    # -- the loop -----------------------------------------------------------------------------
    def _run(self, job: JobState, version: int, first: Observation) -> Step:
        """Drive the job through `first` (and what applying it observes), holding the job's step
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
            before = job
            ctx = StepContext()
            try:
                job = drive(job, first, StepEffects(self, ctx), self.cfg)
            except StepYields:
                return Step(before.job_id, before.phase, standby=before.standby)
            if ctx.restep and ctx.wake_at is None and job.phase == "queued":
                ctx.wake_at = self.clock.now()
            if not self.save([(job, version, ctx.wake_at)]):
                self.ledger.append(
                    Event(
                        kind="provisioning_conflict",
                        job=self.owner_of(job.job_id),
                        reason="state moved by another task; this step's state discarded",
                        payload={"provisioning_job": job.job_id},
                    )
                )
                return Step(job.job_id, job.phase, standby=job.standby)
        if ctx.handed_over is not None and not job.standby:
            ctx.spawned += self.standby.top_up(job.job_id)
        if ctx.ended and not job.standby:
            self.standby.release_pool(job.job_id, reason=f"job {job.phase}")
        for owner in dict.fromkeys(ctx.holds):
            ctx.also += self.standby.offer_to_recovery(owner)
        return Step(
            job.job_id,
            job.phase,
            wake_at=ctx.wake_at,
            preflight_instance=ctx.preflight_instance,
            handed_over=ctx.handed_over,
            failure=job.failure,
            standby=job.standby,
            spawned=tuple(ctx.spawned),
            also=tuple(ctx.also),
        )

    def _busy(self, job: JobState, first: Observation) -> Step:
        """Another step held the job's lease past the wait (a stuck provider call, or a holder that
        died and whose lease has not expired yet): apply nothing, come back. A supervisor's
        observation is not dropped silently: it raises, which the supervisor's poll records before
        polling again."""
        self.ledger.append(
            Event(
                kind="step_busy",
                job=self.owner_of(job.job_id),
                reason=f"another step of this job held its lease for over {self.leases.wait_s:.0f} s",
                payload={"provisioning_job": job.job_id, "observation": type(first).__name__},
            )
        )
        if isinstance(first, TrainerStatus | BudgetCapReached):
            raise StepBusy(f"job {job.job_id}: another provisioning step still holds it; try again")
        if isinstance(first, PreflightResult) and job.attempt is not None:
            return Step(job.job_id, job.phase, preflight_instance=job.attempt.instance_id, standby=job.standby)
        return Step(job.job_id, job.phase, wake_at=self.clock.now() + _BUSY_RETRY_S, standby=job.standby)

    def _view(self, job: JobState) -> MarketView:
        offers = []
        names = self.providers_for(job.req)
        unusable: dict[str, str] = {}
        for name in names:
            try:
                offers += self.market_for(name).search_offers(offer_query(job.req, job.shape))
            except (UserError, AuthFailed) as exc:  # no key, a refused key: skipped while others remain
                unusable[name] = clean(str(exc).removeprefix(f"{name}: "))
            except MarketError as exc:
                self.ledger.append(Event(kind="offer_search_failed", job=job.job_id, provider=name, reason=str(exc)))
        if unusable and len(unusable) == len(names):
            raise ProvidersUnusable(unusable)
        for name, why in unusable.items():
            self._skipped(self.owner_of(job.job_id), name, why)
        held = () if job.standby else tuple(h.policy_view() for h in self._adoptable(job))
        return MarketView(
            offers=tuple(offers),
            records=self.reputation.records(),
            held=held,
            budget_left_usd=self._budget_left(self.owner_of(job.job_id)),
        )

    def _skipped(self, owner: str, provider: str, why: str) -> None:
        """A provider the job allows cannot be used: a ledger warning and an alert, once per job and provider."""
        self.ledger.append(
            Event(
                kind="provider_skipped",
                job=owner,
                provider=provider,
                reason=why,
                idempotency_key=f"{owner}:provider_skipped:{provider}",
            )
        )
        if self.notifier is not None:
            self.notifier.notify(
                Alert(
                    "provider_skipped",
                    f"{provider} skipped, the job's other providers remain: {why}",
                    job=owner,
                    key=f"provider_skipped:{owner}:{provider}",
                )
            )

    def _budget_left(self, owner: str) -> float | None:
        """What the job's own cap (or the default cap) still has; None when neither is set. The
        period caps (day, week, month) are left out: their room comes back with the next period,
        so a create they refuse waits (BudgetRefused) rather than ending the job."""
        status = {s.name: s for s in self.rentals.budget.status() if s.unit == "usd" and s.period == "total"}
        name = owner if owner in status else "default"
        return status[name].left_usd if name in status else None

    def _spending(self, owner: str) -> bool:
        """Whether any rental of `owner` still runs or is about to (its reservation may free room)."""
        return bool(self.rentals.all(states=("intent", "active"), job=owner))

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
        return {
            str(e.payload.get("held"))
            for e in self.ledger.rows(job=owner, kind="adopt_refused")
            if e.payload.get("provisioning_job") == job_id
        }

    # -- the fleet's sweeps and pools -------------------------------------------------------------
    def sweep_holds(self) -> HoldSweep:
        """Beat's pass over every held host and standby pool (one task per sweep, not per host)."""
        return self.holds.sweep()

    def release(self, h: Held, *, reason: str) -> str | None:
        """End a hold: stop the host if it held work, destroy it if it never did."""
        return self.holds.release_held(h, reason=reason)

    def release_pool(self, owner_id: str, *, reason: str) -> list[str]:
        """The job ended: release its standby hosts and stop its standby jobs' attempts."""
        return self.standby.release_pool(owner_id, reason=reason)
