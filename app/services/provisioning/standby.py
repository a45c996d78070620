"""Standby pools and hedged recoveries in real time: standby jobs that rent verified hosts for a
job's recoveries (`<job>.standby-<n>`, their rentals the job's own: reserved against its budget,
labelled and billed to it, opened with its SSH key).

How many hosts a pool keeps and how many chains refill it is `app.policy.fleet`'s (the pool
grows with the loss rate observed on verified hosts; each missing host gets as many parallel
chains as the marketplace's dud rate asks); this module keeps the tables and starts the jobs.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from app.ledger import Event
from app.policy.fleet import exposure, pool_missing, pool_target, refill_chains, standby_wanted
from app.policy.provisioning import JobState, WantStandby, hand_over, new_job
from app.services.provisioning.effects import next_attempt
from app.services.provisioning.types import Step

if TYPE_CHECKING:
    from app.services.provisioning.service import ProvisioningService

__all__ = ["Standby"]


class Standby:
    """The standby pools and standby jobs of one provisioning service."""

    def __init__(self, svc: ProvisioningService) -> None:
        self.svc = svc

    # -- what a pool wants ------------------------------------------------------------------------
    def recovering(self, owner: str) -> bool:
        loaded = self.svc.state(owner)
        return loaded is not None and loaded[0].lost_at is not None and loaded[0].phase not in ("done", "failed")

    def running(self, owner: str) -> bool:
        loaded = self.svc.state(owner)
        return loaded is not None and loaded[0].phase not in ("done", "failed")

    def target(self, owner: str) -> int:
        """The pool's size now: the job's `needs.standby_hosts`, grown with the observed loss rate."""
        configured = self.svc.pool.pool_size(owner)
        if configured <= 0:
            return 0
        seen = exposure(self.svc.pool.spans(), now=self.svc.clock.now(), owner=owner)
        return pool_target(self.svc.cfg, configured=configured, seen=seen)

    def missing(self, owner: str, *, besides: str | None = None) -> int:
        """Verified hosts the owner's pool still wants (not counting the held row `besides`)."""
        target = self.target(owner)
        if target <= 0:
            return 0
        now = self.svc.clock.now()
        waiting = sum(
            1 for h in self.svc.pool.held(owner=owner) if h.standby and h.hold_until > now and h.id != besides
        )
        return pool_missing(target=target, waiting=waiting, active=self.running(owner))

    def wanted(self, job: JobState) -> bool:
        """A standby job between attempts: does its owner still run and still want a host?"""
        owner = self.svc.owner_of(job.job_id)
        if owner == job.job_id:
            return False
        return standby_wanted(
            missing=self.missing(owner), recovering=self.recovering(owner), active=self.running(owner)
        )

    # -- starting standby jobs -------------------------------------------------------------------
    def _spawn(self, owner: JobState, *, purpose: str, key: str) -> str | None:
        """A new standby job for `owner` (None if `key` made one already)."""
        svc = self.svc
        sj, made = svc.pool.new_standby(owner.job_id, purpose=purpose, key=key, now=svc.clock.now())
        if not made:
            return None
        job = replace(new_job(sj.job_id, req=owner.req, shape=owner.shape, standby=True), excluded=owner.excluded)
        svc.save([(job, 0, svc.clock.now())])
        return sj.job_id

    def want(self, job: JobState, act: WantStandby) -> list[str]:
        """A recovery hedges: start `count` standby jobs beside the job's own create."""
        if job.standby:
            return []
        made = [
            sid
            for i in range(act.count)
            if (sid := self._spawn(job, purpose="hedge", key=f"{job.job_id}:hedge:{job.creates + 1}:{i}"))
        ]
        if made:
            self.svc.ledger.append(
                Event(
                    kind="standby_wanted",
                    job=job.job_id,
                    reason=act.why,
                    payload={"count": act.count, "standby_jobs": made, "purpose": "hedge"},
                    idempotency_key=f"{job.job_id}:hedge:{job.creates + 1}",
                )
            )
        return made

    def top_up(self, owner_id: str) -> list[str]:
        """Start standby jobs until the owner's pool is full: each missing host gets as many
        parallel chains as the dud rate asks, less the chains still provisioning."""
        svc = self.svc
        loaded = svc.state(owner_id)
        if loaded is None or loaded[0].phase in ("done", "failed"):
            return []
        owner = loaded[0]
        pending = 0
        for sj in svc.pool.standby_jobs(owner_id):
            st = svc.state(sj.job_id)
            if st is not None and st[0].phase not in ("done", "failed"):
                pending += 1
        chains = refill_chains(
            svc.cfg, missing=self.missing(owner_id), pending=pending, records=svc.reputation.records()
        )
        taken = len(svc.pool.standby_jobs(owner_id))
        made = [
            sid
            for i in range(chains)
            if (sid := self._spawn(owner, purpose="pool", key=f"{owner_id}:pool:{taken + i + 1}"))
        ]
        if made:
            svc.ledger.append(
                Event(
                    kind="standby_wanted",
                    job=owner_id,
                    reason=f"standby pool of {self.target(owner_id)}",
                    payload={"count": len(made), "standby_jobs": made, "purpose": "pool"},
                )
            )
        return made

    def scheduled(self, standby_id: str) -> Step:
        """A standby job just started: the shell steps it at once."""
        return Step(standby_id, "queued", wake_at=self.svc.clock.now(), standby=True)

    # -- a verified host for a waiting recovery ---------------------------------------------------
    def offer_to_recovery(self, owner_id: str) -> list[Step]:
        """A host was just held: the owner, recovering right now, takes it. If its own replacement is
        still booting, that attempt goes to a new standby job (`hand_over`), under the owner's step
        lease (so the owner's own preflight cannot pass that attempt meanwhile)."""
        svc = self.svc
        out: list[Step] = []
        with svc.leases.held(owner_id) as held:
            if not held:
                return []  # the owner is mid-step for long: its next tick adopts the held host itself
            loaded = svc.state(owner_id)
            if loaded is None:
                return []
            job, version = loaded
            if job.standby or job.lost_at is None or job.phase not in ("queued", "booting", "preflight"):
                return []
            if job.phase != "queued":
                sj, _ = svc.pool.new_standby(
                    owner_id,
                    purpose="hand_over",
                    key=f"{owner_id}:hand_over:{job.attempt.instance_id if job.attempt else ''}",
                    now=svc.clock.now(),
                )
                moved = hand_over(job, standby_id=sj.job_id)
                if moved is None:
                    return []
                back, standby = moved
                # Both states in one transaction: the attempt is always in exactly one of them, even
                # if the process dies here (a redelivered task finds the job as it was and, its
                # standby job's key being the attempt's, hands over to the same standby job).
                if not svc.save([(back, version, svc.clock.now()), (standby, 0, svc.clock.now())]):
                    return []  # the job moved meanwhile (or the hand-over was done): its own step decides
                att = standby.attempt
                svc.ledger.append(
                    Event(
                        kind="attempt_handed_over",
                        job=owner_id,
                        instance=att.instance_id if att else None,
                        reason="a host was verified first; the recovery's own attempt goes on as standby",
                        payload={"standby_job": sj.job_id, "phase": standby.phase},
                        idempotency_key=f"{sj.job_id}:attempt_handed_over",
                    )
                )
                out.append(
                    Step(
                        sj.job_id,
                        standby.phase,
                        wake_at=svc.clock.now(),
                        standby=True,
                        preflight_instance=att.instance_id if att and standby.phase == "preflight" else None,
                    )
                )
        out.append(svc.step(owner_id))
        return out

    def release_pool(self, owner_id: str, *, reason: str) -> list[str]:
        """The job ended: release its standby hosts and stop its standby jobs' attempts."""
        svc = self.svc
        now = svc.clock.now()
        out = []
        for h in svc.pool.held(owner=owner_id):
            if h.standby and svc.holds.release_held(h, reason=f"standby no longer needed: {reason}"):
                out.append(h.instance_id)
        for sj in svc.pool.standby_jobs(owner_id):
            loaded = svc.state(sj.job_id)
            if loaded is None or loaded[0].phase in ("done", "failed"):
                continue
            st, version = loaded
            att = st.attempt
            # A queued one may have a host its state does not hold yet (a step that recorded the
            # create died before it saved): that rental is its next attempt's.
            owner, attempt = next_attempt(svc, st)
            pending = None if att is not None else svc.rentals.get(f"{owner}:{attempt}")
            if not svc.save([(replace(st, phase="done", attempt=None, failure="no longer needed"), version, None)]):
                continue
            rental = svc.rental_of(att.instance_id) if att is not None else pending
            if rental is not None and rental.state == "active" and rental.instance_id is not None:
                svc.holds.stop_or_destroy(rental, reason="standby no longer needed", evidence=reason, now=now)
                out.append(rental.instance_id)
        return out
