"""Held verified hosts in real time: holding one, and beat's sweep over them.

What to do with each held host is `app.policy.fleet`'s: `hold_terms` when it is held,
`judge_held` at every sweep; this module applies it (`app.interpreter.HoldEffects`): a release
stops a host that held work and destroys one that never did, a renewal moves its end, a drop takes
a host whose instance or rental went away off the list (a lost one recorded against its machine).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.interpreter import tend
from app.ledger import Event
from app.market import MarketError
from app.policy.fleet import Drop, HeldLook, HoldAction, Release, Renew, hold_terms, judge_held
from app.policy.provisioning import Hold, JobState
from app.rentals import Rental
from app.services.pool import Held
from app.services.provisioning.types import HoldSweep, StepContext

if TYPE_CHECKING:
    from app.services.provisioning.service import ProvisioningService

__all__ = ["Holds"]


class Holds:
    """Hold, renew, release and drop held hosts for one provisioning service."""

    def __init__(self, svc: ProvisioningService) -> None:
        self.svc = svc
        self._report: HoldSweep | None = None

    # -- holding ------------------------------------------------------------------------------
    def hold(self, job: JobState, act: Hold, ctx: StepContext) -> None:
        """Keep the verified host running for the next compatible job (a standby host: for its pool)."""
        svc = self.svc
        now = svc.clock.now()
        rental = svc.rental_of(act.host.instance_id)
        if rental is None or rental.state != "active":
            svc.ledger.append(
                Event(
                    kind="hold_skipped",
                    job=svc.owner_of(job.job_id),
                    instance=act.host.instance_id,
                    reason="no active rental for the host: nothing to hold",
                    payload={"provisioning_job": job.job_id},
                )
            )
            return
        host = hold_terms(
            act.host, now=now, cfg=svc.cfg, missing=svc.standby.missing(rental.job), kill_at=rental.kill_at
        )
        held = svc.pool.hold(
            host=host,
            rental_id=rental.id,
            owner=rental.job,
            released_by=job.job_id,
            held_work=rental.held_work,
            hold_until=host.hold_until,
        )
        if held is None:
            return
        svc.pool.at_risk(
            rental.provider,
            rental.instance_id or act.host.instance_id,
            owner=rental.job,
            created_at=rental.created_at,
            now=now,
        )
        svc.ledger.append(
            Event(
                kind="host_held",
                job=rental.job,
                instance=rental.instance_id,
                provider=rental.provider,
                machine=rental.machine_id,
                rate_usd_per_hour=rental.rate_usd_per_hour,
                reason="standby host verified, kept for the job's recoveries"
                if held.standby
                else "verified host kept for the next compatible job",
                payload={
                    "hold_until": host.hold_until,
                    "standby": held.standby,
                    "released_by": job.job_id,
                    "rental": rental.id,
                    "held_work": rental.held_work,
                },
                idempotency_key=f"held:{held.id}",
            )
        )
        ctx.holds.append(held.owner)

    # -- the sweep ------------------------------------------------------------------------------
    def sweep(self) -> HoldSweep:
        """Beat's pass over every held host (one task per sweep, not per host), then the pools."""
        svc = self.svc
        report = HoldSweep()
        now = svc.clock.now()
        decisions: list[HoldAction | None] = []
        for h in svc.pool.held():
            report.examined += 1
            rental = svc.rentals.get(h.rental_id)
            state: str | None = None
            if rental is not None and rental.state == "active":
                try:
                    state = svc.market_for(h.provider).status(h.instance_id).state
                except MarketError as exc:
                    report.errors.append(f"{h.instance_id}: {exc}")
            look = HeldLook(
                h.policy_view(),
                held_work=h.held_work,
                state=state,
                kill_at=None if rental is None else rental.kill_at,
                rental_active=rental is not None and rental.state == "active",
            )
            decisions.append(
                judge_held(
                    look,
                    now=now,
                    cfg=svc.cfg,
                    missing_besides=svc.standby.missing(h.owner, besides=h.id),
                    beyond_pool=h.standby and self._beyond_pool(h, now=now),
                    recovering=svc.standby.recovering(h.owner),
                )
            )
        self._report = report
        try:
            tend(self, decisions)
        finally:
            self._report = None
        for owner_id in svc.pool.pools():
            if not svc.standby.running(owner_id):
                report.released += svc.standby.release_pool(owner_id, reason="job over")
                continue
            loaded = svc.state(owner_id)
            if loaded is not None and loaded[0].phase == "training":
                for sid in svc.standby.top_up(owner_id):
                    report.steps.append(svc.standby.scheduled(sid))
        return report

    def _beyond_pool(self, h: Held, *, now: float) -> bool:
        """More standby hosts held long (past an ordinary hold) than the owner's pool asks for."""
        svc = self.svc
        long = [x for x in svc.pool.held(owner=h.owner) if x.standby and x.hold_until > now + svc.cfg.hold_s]
        return len(long) > svc.standby.target(h.owner)

    def _row(self, instance_id: str) -> Held | None:
        return next((h for h in self.svc.pool.held() if h.instance_id == instance_id), None)

    # -- HoldEffects ---------------------------------------------------------------------------
    def release(self, act: Release) -> None:
        h = self._row(act.host.instance_id)
        if h is None:
            return
        try:
            if self.release_held(h, reason=act.reason) and self._report is not None:
                self._report.released.append(h.instance_id)
        except MarketError as exc:
            if self._report is not None:
                self._report.errors.append(f"{h.instance_id}: {exc}")

    def renew(self, act: Renew) -> None:
        svc = self.svc
        h = self._row(act.host.instance_id)
        if h is None or not svc.pool.renew(h.id, hold_until=act.until, standby=act.standby):
            return
        shortened = act.until < h.hold_until
        svc.ledger.append(
            Event(
                kind="host_hold_shortened" if shortened else "host_hold_renewed",
                job=h.owner,
                instance=h.instance_id,
                provider=h.provider,
                machine=h.machine_id,
                reason=act.reason,
                payload={"hold_until": act.until, "was": h.hold_until, "standby": act.standby},
                idempotency_key=f"shortened:{h.id}" if shortened else f"renewed:{h.id}:{int(act.until)}",
            )
        )
        if self._report is not None and not shortened:
            self._report.renewed.append(h.instance_id)

    def drop(self, act: Drop) -> None:
        h = self._row(act.host.instance_id)
        if h is None:
            return
        self.drop_held(h, self.svc.rentals.get(h.rental_id), act.evidence, now=self.svc.clock.now())
        if self._report is not None:
            self._report.dropped.append(h.instance_id)

    # -- the pieces -----------------------------------------------------------------------------
    def drop_held(
        self, h: Held, rental: Rental | None, why: str, *, now: float, from_states: tuple[str, ...] = ("held",)
    ) -> None:
        """A held host that is gone (or whose rental ended): off the list, its rental settled or stopped."""
        svc = self.svc
        if not svc.pool.end(h.id, reason=why, now=now, from_states=from_states):
            return
        gone = False
        if rental is not None and rental.state in ("active", "stopped"):
            try:
                gone = svc.market_for(h.provider).status(h.instance_id).state in ("gone", "exited")
            except MarketError:
                gone = False
            if gone:
                if svc.rentals.transition(
                    rental.id, to="lost", from_states=("active", "stopped"), kind="instance_lost", reason=why, now=now
                ):
                    svc.rentals.settle(rental.id, now=now, reason="held host lost: billing ended")
                svc.reputation.record(h.provider, h.machine_id, "failure", now=now, reason="lost", evidence=why)
            elif rental.state == "active":
                self.stop_or_destroy(rental, reason="held host unusable", evidence=why, now=now)
        svc.pool.off_risk(h.provider, h.instance_id, lost=gone, now=now)
        svc.ledger.append(
            Event(
                kind="host_dropped",
                job=h.owner,
                instance=h.instance_id,
                provider=h.provider,
                machine=h.machine_id,
                reason=why,
                payload={"held": h.id},
                idempotency_key=f"dropped:{h.id}",
            )
        )

    def stop_or_destroy(self, rental: Rental, *, reason: str, evidence: str, now: float) -> str:
        """Automation's release of a host: stop one that held work (invariant 3), destroy one that never did."""
        svc = self.svc
        market = svc.market_for(rental.provider)
        if rental.instance_id is not None:
            svc.pool.off_risk(rental.provider, rental.instance_id, lost=False, now=now)
        if rental.held_work:
            svc.rentals.stop(
                rental.id,
                market=market,
                reason=reason,
                kind="instance_stopped",
                now=now,
                evidence={"evidence": evidence},
            )
            return "stopped"
        svc.rentals.destroy(
            rental.id, market=market, by="automation", reason=reason, now=now, evidence={"evidence": evidence}
        )
        return "destroyed"

    def release_held(self, h: Held, *, reason: str) -> str | None:
        """End a hold: stop the host if it held work, destroy it if it never did. None if someone else moved it."""
        svc = self.svc
        now = svc.clock.now()
        if not svc.pool.end(h.id, reason=reason, now=now):
            return None
        rental = svc.rentals.get(h.rental_id)
        action = "none"
        if rental is not None and rental.state == "active":
            action = self.stop_or_destroy(rental, reason=reason, evidence=f"held since {h.verified_at:.0f}", now=now)
        svc.ledger.append(
            Event(
                kind="host_released",
                job=h.owner,
                instance=h.instance_id,
                provider=h.provider,
                machine=h.machine_id,
                rate_usd_per_hour=h.dph_total,
                reason=reason,
                payload={
                    "held": h.id,
                    "action": action,
                    "standby": h.standby,
                    "held_s": now - h.verified_at,
                    "hold_until": h.hold_until,
                },
                idempotency_key=f"released:{h.id}",
            )
        )
        return action
