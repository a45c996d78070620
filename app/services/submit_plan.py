"""What `tuneharness submit --dry-run` shows: what the provisioning would rent now, and at what cost.

The offers come from the same marketplaces, through the same query (`offer_query`), and are ranked
by the same policy function (`app.policy.provisioning.ranked_offers`) as a real provisioning step;
each one's kill-time (`ProvisioningService.ttl_for`), reservation (`app.policy.fleet.reservation_usd`)
and the caps it would be reserved against (`Rentals.reservation_items`) are the ones a create would
use. Nothing is written: no job row, no ledger event, no reservation, nothing enqueued.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.errors import UserError
from app.jobs import JobSpec
from app.market import MarketError, Offer
from app.policy.fleet import reservation_usd
from app.policy.pricing import expected_cost
from app.policy.provisioning import MarketView, new_job, ranked_offers
from app.services.provisioning.service import ProvisioningService, offer_query

__all__ = ["PlannedOffer", "PlannedReservation", "SubmitPlan", "plan_submission"]

DRY_RUN_JOB = "dry-run"  # the name a job's own cap would have is its id, which submit has not drawn yet


@dataclass(frozen=True, slots=True)
class PlannedReservation:
    cap: str  # the job's own cap (`job` when the file sets budget_usd), default, day, week, month, gpu-minutes-day
    amount: float  # in the cap's unit
    unit: str  # usd | gpu_minutes
    left_before: float | None  # what the cap has left now (None: the job's own cap, not set yet)

    def to_dict(self) -> dict[str, Any]:
        return {"cap": self.cap, "amount": self.amount, "unit": self.unit, "left_before": self.left_before}


@dataclass(frozen=True, slots=True)
class PlannedOffer:
    rank: int
    offer: Offer
    all_in_usd_per_hour: float  # GPU + storage of the job's disk, per hour
    attempt_usd: float  # one attempt: pull + training + overhead, storage and traffic
    delivered_usd: float  # expected cost per delivered job (failed attempts priced in)
    delivery_probability: float
    kill_after_s: float
    kill_at: float
    reservations: tuple[PlannedReservation, ...]

    def to_dict(self) -> dict[str, Any]:
        o = self.offer
        return {
            "rank": self.rank,
            "provider": o.provider,
            "offer_id": o.offer_id,
            "machine_id": o.machine_id,
            "gpu_name": o.gpu_name,
            "num_gpus": o.num_gpus,
            "gpu_ram_gb": o.gpu_ram_gb,
            "dph_total": o.dph_total,
            "reliability": o.reliability,
            "all_in_usd_per_hour": round(self.all_in_usd_per_hour, 6),
            "expected_attempt_usd": round(self.attempt_usd, 6),
            "expected_per_delivered_job_usd": round(self.delivered_usd, 6),
            "delivery_probability": round(self.delivery_probability, 4),
            "kill_after_hours": round(self.kill_after_s / 3600.0, 4),
            "kill_at": self.kill_at,
            "reservations": [r.to_dict() for r in self.reservations],
        }


@dataclass(frozen=True, slots=True)
class SubmitPlan:
    name: str
    source: str
    runs: int  # training runs the job becomes (one per gate seed, else 1)
    budget_per_run_usd: float | None
    providers: tuple[str, ...]
    searched: int  # offers the marketplaces returned
    offers: tuple[PlannedOffer, ...]  # the first ones the provisioning would try, in order
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {
            "dry_run": True,
            "name": self.name,
            "source": self.source,
            "runs": self.runs,
            "budget_per_run_usd": self.budget_per_run_usd,
            "providers": list(self.providers),
            "offers_found": self.searched,
            "offers": [o.to_dict() for o in self.offers],
            "notes": list(self.notes),
        }


def plan_submission(spec: JobSpec, svc: ProvisioningService, *, now: float, top: int = 5) -> SubmitPlan:
    """The ranked offers a submission of `spec` would try first, with their all-in cost, kill-time and
    reservations; reads the marketplaces, the reputation records and the caps, writes nothing."""
    run = spec.seed_run(spec.seeds[0], parent=DRY_RUN_JOB) if spec.seeds else spec
    req, shape = run.needs.requirements(), run.shape()
    notes: list[str] = []
    offers: list[Offer] = []
    providers = svc.providers_for(req)
    for name in providers:
        try:
            offers += svc.market_for(name).search_offers(offer_query(req, shape))
        except (MarketError, UserError) as exc:
            notes.append(f"{name}: no offers searched ({exc})")
    status = {s.name: s for s in svc.rentals.budget.status()}
    if run.budget_usd is not None:
        budget_name, budget_left = "job", run.budget_usd
    elif "default" in status and status["default"].unit == "usd" and status["default"].period == "total":
        budget_name, budget_left = "default", status["default"].left_usd
    else:
        budget_name, budget_left = "", None
        notes.append(
            "no budget cap: every create would be refused. Fix: give the job file a budget_usd, "
            "or tuneharness budget set default --cap-usd N"
        )
    job = new_job(DRY_RUN_JOB, req=req, shape=shape)
    view = MarketView(offers=tuple(offers), records=svc.reputation.records(), budget_left_usd=budget_left)
    ranked = ranked_offers(job, view, now=now, cfg=svc.cfg)
    held = [h for h in svc.pool.held() if h.hold_until > now and not h.standby]
    if held:
        notes.append(f"{len(held)} verified host(s) held now: a compatible one is adopted before any new rental")
    planned = []
    for i, r in enumerate(ranked[:top], start=1):
        o = r.offer
        ttl = svc.ttl_for(shape, o)
        reserve = reservation_usd(o, shape, svc.cfg)
        items = (
            svc.rentals.reservation_items(
                budget_name=budget_name, reserve_usd=reserve, dph_total=o.dph_total, num_gpus=o.num_gpus, max_s=ttl
            )
            if budget_name
            else []
        )
        reservations = tuple(
            PlannedReservation(
                cap=cap,
                amount=amount,
                unit=status[cap].unit if cap in status else "usd",
                left_before=run.budget_usd if cap == "job" else (status[cap].left_usd if cap in status else None),
            )
            for cap, amount in items
        )
        hourly = expected_cost(
            dph_total=o.dph_total,
            storage_per_gb_month=o.storage_per_gb_month,
            inet_down_per_gb=o.inet_down_per_gb,
            hours=1.0,
            disk_gb=shape.disk_gb,
        ).expected_cost_usd
        planned.append(
            PlannedOffer(
                rank=i,
                offer=o,
                all_in_usd_per_hour=hourly,
                attempt_usd=r.attempt_cost_usd,
                delivered_usd=r.cost_per_delivered_job_usd,
                delivery_probability=r.delivery_probability,
                kill_after_s=ttl,
                kill_at=now + ttl,
                reservations=reservations,
            )
        )
    if not ranked:
        notes.append(
            f"no offer fits now ({len(offers)} found): the job would wait in the queue for one "
            f"(at most {svc.cfg.max_offer_wait_s / 3600.0:g} h)"
        )
    return SubmitPlan(
        name=spec.name,
        source=spec.source,
        runs=max(1, len(spec.seeds)),
        budget_per_run_usd=run.budget_usd,
        providers=tuple(providers),
        searched=len(offers),
        offers=tuple(planned),
        notes=tuple(notes),
    )
