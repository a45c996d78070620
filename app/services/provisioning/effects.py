"""The real-time effects of one provisioning step: what each of the policy's actions does against
the vendors, the rentals, the budget, the pool and the ledger (`app.interpreter.Effects`).

One `StepEffects` per step: it collects what the Celery shell must schedule (the wake-up, a
preflight, the hand-over to the supervisor, standby jobs started) in a `StepContext`.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from app.errors import BudgetExceeded
from app.ledger import Event
from app.market import CreateUnconfirmed, MarketError, Offer, OfferGone
from app.policy.fleet import reservation_usd
from app.policy.provisioning import (
    Adopt,
    Adopted,
    BudgetRefused,
    Create,
    CreateResult,
    Destroy,
    Finished,
    GaveUp,
    Hold,
    JobState,
    Observation,
    Record,
    Recovered,
    RunPreflight,
    StartTraining,
    Stop,
    WakeAt,
    WantStandby,
)
from app.rentals import Rental
from app.services.pool import STANDBY_ATTEMPT_BASE, Held
from app.services.provisioning.types import StepContext, StepYields

if TYPE_CHECKING:
    from app.services.provisioning.service import ProvisioningService

__all__ = ["StepEffects"]

LOSSES = ("lost", "hang")  # a stop or destroy for these reasons ends a verified host's exposure as a loss


def next_attempt(svc: ProvisioningService, job: JobState) -> tuple[str, int]:
    """The rental the job's next create makes: (the job it is rented under, the attempt number).

    Idempotent per attempt (a redelivered task reuses its intent), but a create abandoned because
    the offer was taken (another job got there first) used up its number: without skipping it,
    every later try would find that abandoned rental and the job would spin. A standby job's
    rentals are its owner's, numbered from 1000 * n."""
    sj = svc.pool.standby_job(job.job_id)
    owner = job.job_id if sj is None else sj.owner
    base = 0 if sj is None else sj.n * STANDBY_ATTEMPT_BASE
    abandoned = [
        r for r in svc.rentals.all(states=("abandoned",), job=owner) if base < r.attempt < base + STANDBY_ATTEMPT_BASE
    ]
    return owner, base + job.creates + 1 + len(abandoned)


class StepEffects:
    """`app.interpreter.Effects` for one step of one job, in real time."""

    def __init__(self, svc: ProvisioningService, ctx: StepContext) -> None:
        self.svc = svc
        self.ctx = ctx

    def now(self) -> float:
        return self.svc.clock.now()

    def jitter(self) -> float:
        return self.svc.rng.random()

    def decided(self, job: JobState) -> None:
        """The state is saved once the whole step is applied (StepContext, ProvisioningService._run)."""

    def wake(self, job: JobState, act: WakeAt) -> None:
        self.ctx.wake_at = act.at

    def run_preflight(self, job: JobState, act: RunPreflight) -> None:
        self.ctx.preflight_instance = act.instance_id

    # -- creates ------------------------------------------------------------------------------
    def create(self, job: JobState, act: Create) -> Observation:
        svc = self.svc
        now = svc.clock.now()
        sj = svc.pool.standby_job(job.job_id)
        owner, attempt = next_attempt(svc, job)
        # A create whose answer was lost keeps its intent: this step looks for that instance (the
        # intent's offer, whatever the policy ranks first now), it does not rent another.
        pending = svc.rentals.get(f"{owner}:{attempt}")
        offer = act.offer if pending is None or pending.state != "intent" else svc.rentals.offer_of(pending.id)
        reserve = reservation_usd(offer, job.shape, svc.cfg)
        spec = svc.launch_spec_for(owner)
        rental_id = f"{owner}:{attempt}"
        extra = {} if sj is None else {"standby_job": job.job_id, "purpose": sj.purpose}
        caps = svc.rentals.budget.caps()
        budget_name = owner if owner in caps else "default"
        if budget_name not in caps:
            why = (
                f"budget: no cap for job {owner} and no 'default' cap. Fix: give the job file a budget_usd, "
                "or tuneharness budget set default --cap-usd N"
            )
            svc.ledger.append(
                Event(
                    kind="create_refused",
                    job=owner,
                    reason=why,
                    payload=extra,
                    idempotency_key=f"refused:{rental_id}:{int(now)}",
                )
            )
            return BudgetRefused(offer, cap=owner, detail=why)
        try:
            svc.rentals.plan(
                job=owner,
                attempt=attempt,
                offer=offer,
                disk_gb=spec.disk_gb,
                ttl_s=svc.ttl_for(job.shape, offer, standby=sj is not None),
                now=now,
                reserve_usd=reserve,
                budget_name=budget_name,
                spec=spec,
            )
        except BudgetExceeded as exc:
            svc.ledger.append(
                Event(
                    kind="create_refused",
                    job=owner,
                    reason=str(exc),
                    payload=extra,
                    idempotency_key=f"refused:{rental_id}:{int(now)}",
                )
            )
            return BudgetRefused(offer, cap=exc.budget, detail=str(exc))
        try:
            rental = svc.rentals.execute(rental_id, market=svc.market_for(offer.provider), spec=spec, now=now)
        except CreateUnconfirmed as exc:
            return self._unconfirmed(owner, rental_id, offer, exc, now=now)
        except OfferGone as exc:
            svc.rentals.abandon(rental_id, reason=f"offer gone: {exc}", now=now)
            return CreateResult(offer, None, str(exc))
        except MarketError as exc:
            if svc.rentals.create_sent_at(rental_id) is not None:
                # The create went out before and its answer was lost; this error came from the look-up
                # by label, which proves nothing about the instance the vendor may have rented.
                return self._unconfirmed(owner, rental_id, offer, exc, now=now, looked_up=False)
            svc.rentals.abandon(rental_id, reason=f"provider refused: {exc}", now=now)
            return CreateResult(offer, None, str(exc))
        svc.ledger.append(
            Event(
                kind="offer_chosen",
                job=owner,
                instance=rental.instance_id,
                provider=offer.provider,
                machine=offer.machine_id,
                rate_usd_per_hour=offer.dph_total,
                reason=act.why,
                payload=extra,
                idempotency_key=f"chosen:{rental_id}",
            )
        )
        return CreateResult(offer, rental.instance_id)

    def _unconfirmed(
        self, owner: str, rental_id: str, offer: Offer, exc: MarketError, *, now: float, looked_up: bool = True
    ) -> CreateResult:
        """The vendor may have rented it: keep the intent and its reservation, look again by label at
        the next step. Past `create_confirm_s` with nothing listed, the create is taken as never done
        (abandoned, its reservation released; an instance listed later under that label is the
        reconciler's). A look-up that failed (`looked_up` False) saw nothing: the intent is kept (the
        stale-intent sweep releases it only on a listing that answered)."""
        svc = self.svc
        sent_at = svc.rentals.create_sent_at(rental_id)
        waited = 0.0 if sent_at is None else now - sent_at
        if looked_up and waited >= svc.cfg.create_confirm_s:
            svc.rentals.abandon(rental_id, reason=f"create unconfirmed, not listed after {waited:.0f}s: {exc}", now=now)
            return CreateResult(offer, None, str(exc))
        svc.ledger.append(
            Event(
                kind="create_unconfirmed",
                job=owner,
                provider=offer.provider,
                machine=offer.machine_id,
                rate_usd_per_hour=offer.dph_total,
                reason=str(exc),
                payload={"rental": rental_id, "waited_s": waited},
                idempotency_key=f"unconfirmed:{rental_id}",
            )
        )
        return CreateResult(offer, None, str(exc), unconfirmed=True)

    # -- adoption -----------------------------------------------------------------------------
    def adopt(self, job: JobState, act: Adopt) -> Observation | None:
        """Claim the held host for the job; None (and a fresh look) if someone else got it or it is gone."""
        svc = self.svc
        now = svc.clock.now()
        claimed = svc.pool.claim(act.held.instance_id, job_id=job.job_id, now=now, once_since=job.lost_at)
        if claimed is None:
            other = svc.pool.adopted_since(job.job_id, job.lost_at) if job.lost_at is not None else None
            if other is not None:
                svc.ledger.append(
                    Event(
                        kind="adopt_skipped",
                        job=svc.owner_of(job.job_id),
                        instance=act.held.instance_id,
                        reason=f"another step of this recovery already adopted {other.instance_id}",
                        payload={"provisioning_job": job.job_id, "adopted": other.instance_id},
                    )
                )
                raise StepYields(other.instance_id)
            self.ctx.restep = True
            svc.ledger.append(
                Event(
                    kind="adopt_lost",
                    job=svc.owner_of(job.job_id),
                    instance=act.held.instance_id,
                    reason="another job adopted the held host first; looking again",
                    payload={"provisioning_job": job.job_id},
                )
            )
            return None
        rental = svc.rentals.get(claimed.rental_id)
        market = svc.market_for(claimed.provider)
        state = "unknown"
        try:
            state = market.status(claimed.instance_id).state
        except MarketError as exc:
            state = f"unknown ({exc})"
        if rental is None or rental.state != "active" or state != "running":
            self.ctx.restep = True
            svc.holds.drop_held(
                claimed, rental, f"held host was {state} when adopted", now=now, from_states=("adopted",)
            )
            return None
        owner = svc.owner_of(job.job_id)
        if rental.job != owner and not self._take_over(job, claimed, rental, now=now):
            return None
        svc.ledger.append(
            Event(
                kind="host_adopted",
                job=job.job_id,
                instance=claimed.instance_id,
                provider=claimed.provider,
                machine=claimed.machine_id,
                rate_usd_per_hour=claimed.dph_total,
                reason="recovery adopts a verified standby host"
                if claimed.standby
                else "adopts a verified held host: no create, pull or preflight",
                payload={
                    "rental": claimed.rental_id,
                    "rental_job": claimed.owner,
                    "released_by": claimed.released_by,
                    "standby": claimed.standby,
                    "verified_at": claimed.verified_at,
                    "held_s": now - claimed.verified_at,
                },
                idempotency_key=f"adopted:{claimed.id}",
            )
        )
        return Adopted(act.held)

    def _take_over(self, job: JobState, claimed: Held, rental: Rental, *, now: float) -> bool:
        """The adopter pays from the adoption on: its reservation for its training on this host is
        committed first (or the adoption is refused, the host goes back on hold, and the job
        provisions normally); then the rental is transferred to it (`Rentals.transfer`: the
        previous job's reservations settled with what it billed until now, in one transaction)."""
        svc = self.svc
        owner = svc.owner_of(job.job_id)
        caps = svc.rentals.budget.caps()
        budget_name = owner if owner in caps else "default"
        offer = svc.rentals.offer_of(rental.id)
        reserve = reservation_usd(
            offer,
            job.shape,
            svc.cfg,
            pull=False,
            dph_total=rental.rate_usd_per_hour or offer.dph_total,
            storage_per_gb_month=rental.storage_per_gb_month,
            disk_gb=rental.disk_gb,
        )
        why = ""
        made = []
        if budget_name not in caps:
            why = f"budget: no cap for job {owner} and no 'default' cap"
        else:
            try:
                made = svc.rentals.reserve_for(
                    job=owner,
                    budget_name=budget_name,
                    reserve_usd=reserve,
                    dph_total=offer.dph_total,
                    num_gpus=offer.num_gpus,
                    max_s=max(0.0, rental.kill_at - now),
                    idempotency_key=f"reserve:adopt:{claimed.id}:{owner}",
                    now=now,
                )
            except BudgetExceeded as exc:
                why = f"budget: {exc}"
        if not made:
            svc.pool.unclaim(claimed.id, job_id=job.job_id)
            self.ctx.restep = True
            svc.ledger.append(
                Event(
                    kind="adopt_refused",
                    job=owner,
                    instance=claimed.instance_id,
                    provider=claimed.provider,
                    machine=claimed.machine_id,
                    rate_usd_per_hour=claimed.dph_total,
                    reason=why,
                    payload={
                        "held": claimed.id,
                        "rental": rental.id,
                        "rental_job": rental.job,
                        "provisioning_job": job.job_id,
                        "reserve_usd": reserve,
                    },
                    idempotency_key=f"adopt_refused:{claimed.id}:{job.job_id}",
                )
            )
            return False
        if not svc.rentals.transfer(
            rental.id,
            from_job=rental.job,
            to_job=owner,
            reservations=made,
            now=now,
            reason=f"held host adopted by {owner}",
            evidence={"held": claimed.id, "provisioning_job": job.job_id},
        ):
            for r in made:
                svc.rentals.budget.release(r.id, reason="adoption fell through: the rental moved")
            self.ctx.restep = True
            current = svc.rentals.get(rental.id)
            svc.holds.drop_held(claimed, current, "rental moved while being adopted", now=now, from_states=("adopted",))
            return False
        return True

    # -- stops, destroys, records ------------------------------------------------------------------
    def destroy(self, job: JobState, act: Destroy) -> None:
        svc = self.svc
        rental = svc.rental_of(act.instance_id)
        if rental is not None:
            # `verdict`: the policy's own failure verdict (a release's destroy has none; receipts
            # count a healthy host destroyed on a verdict as a good host destroyed)
            svc.rentals.destroy(
                rental.id,
                market=svc.market_for(rental.provider),
                by="automation",
                reason=act.reason,
                now=svc.clock.now(),
                evidence={"evidence": act.evidence, "verdict": act.reason},
            )
            svc.pool.off_risk(rental.provider, act.instance_id, lost=act.reason in LOSSES, now=svc.clock.now())

    def stop(self, job: JobState, act: Stop) -> None:
        svc = self.svc
        rental = svc.rental_of(act.instance_id)
        if rental is not None:
            svc.rentals.stop(
                rental.id,
                market=svc.market_for(rental.provider),
                reason=act.reason,
                kind="instance_stopped",
                now=svc.clock.now(),
                evidence={"evidence": act.evidence},
            )
            svc.pool.off_risk(rental.provider, act.instance_id, lost=act.reason in LOSSES, now=svc.clock.now())

    def record(self, job: JobState, act: Record) -> None:
        svc = self.svc
        owner = svc.owner_of(job.job_id)
        rec = svc.reputation.record(
            act.provider, act.machine_id, act.event, now=svc.clock.now(), reason=act.reason, evidence=act.evidence
        )
        extra = {} if owner == job.job_id else {"standby_job": job.job_id}
        if act.event == "failure":
            svc.ledger.append(
                Event(
                    kind="host_failed",
                    job=owner,
                    provider=act.provider,
                    machine=act.machine_id,
                    reason=act.reason or "",
                    payload={
                        "evidence": act.evidence,
                        "quarantined_until": rec.quarantined_until,
                        "quarantine_permanent": rec.quarantine_permanent,
                        **extra,
                    },
                )
            )
        elif act.event == "preflight_passed":
            if act.gpu_model is not None and act.tflops_bf16 is not None:
                svc.speeds.add(
                    act.gpu_model,
                    provider=act.provider,
                    machine_id=act.machine_id,
                    tflops_bf16=act.tflops_bf16,
                    now=svc.clock.now(),
                )
            svc.ledger.append(
                Event(
                    kind="preflight_passed",
                    job=owner,
                    provider=act.provider,
                    machine=act.machine_id,
                    reason=act.evidence,
                    payload=extra,
                )
            )

    # -- training, holds, standby --------------------------------------------------------------------
    def start_training(self, job: JobState, act: StartTraining) -> None:
        svc = self.svc
        self.ctx.handed_over = act.instance_id
        rental = svc.rental_of(act.instance_id)
        if rental is not None:
            svc.rentals.mark_held_work(rental.id)
            svc.pool.at_risk(
                rental.provider,
                act.instance_id,
                owner=svc.owner_of(job.job_id),
                created_at=rental.created_at,
                now=svc.clock.now(),
            )
        svc.ledger.append(
            Event(
                kind="training_handed_over",
                job=job.job_id,
                instance=act.instance_id,
                provider=job.attempt.provider if job.attempt else None,
                machine=job.attempt.machine_id if job.attempt else None,
                reason="host verified; the supervisor takes over",
                payload={"resume_from_work_s": act.resume_from_work_s, "rental": rental.id if rental else None},
                idempotency_key=f"{job.job_id}:handed_over:{act.instance_id}",
            )
        )

    def hold(self, job: JobState, act: Hold) -> None:
        self.svc.holds.hold(job, act, self.ctx)

    def want_standby(self, job: JobState, act: WantStandby) -> None:
        self.ctx.spawned += self.svc.standby.want(job, act)

    # -- ends --------------------------------------------------------------------------------
    def recovered(self, job: JobState, act: Recovered) -> None:
        self.svc.ledger.append(Event(kind="provisioning_recovered", job=job.job_id, payload=_plain(act)))

    def finished(self, job: JobState, act: Finished) -> None:
        self.ctx.ended = True
        self.svc.ledger.append(Event(kind="provisioning_finished", job=job.job_id, payload=_plain(act)))

    def gave_up(self, job: JobState, act: GaveUp) -> None:
        svc = self.svc
        self.ctx.ended = True
        if job.standby:
            svc.ledger.append(
                Event(
                    kind="standby_failed",
                    job=svc.owner_of(job.job_id),
                    reason=act.reason,
                    payload={"standby_job": job.job_id},
                    idempotency_key=f"{job.job_id}:standby_failed",
                )
            )
            return
        svc.ledger.append(
            Event(
                kind="provisioning_failed",
                job=job.job_id,
                reason=act.reason,
                idempotency_key=f"{job.job_id}:provisioning_failed",
            )
        )


def _plain(act: Any) -> dict[str, Any]:
    return {k: v for k, v in asdict(act).items() if isinstance(v, str | int | float | bool | type(None))}
