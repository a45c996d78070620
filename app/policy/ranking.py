"""Which offer to rent: filters, then the expected cost per DELIVERED job, cheapest first.

The hourly rate is not the number that matters. One attempt on an offer costs the GPU for the
image/model pull plus the training at the offer's price, the storage of the job's disk over the
attempt's life, and the traffic of the download (`attempt_cost_usd`). A host delivers only with
probability p: the platform's reliability as the prior of a Beta posterior updated by our own
record of the machine, times how often rentals on this marketplace deliver for us at all
(`market_delivery_rate`). A failed attempt costs the GPU time and storage of the part of the pull
a dud bills before it is caught, and the traffic of the whole download (a stale driver or
misreported hardware is seen only by the preflight, once everything was pulled and billed), so
with geometric retries:

    cost per delivered job = attempt cost + failed-attempt cost x (1 - p) / p

which ranks a $0.11/h host with dear traffic and a poor record below a $0.14/h host that delivers.

The platform's reliability score is uptime, not delivery. `reliability_floor="fallback"` treats
the job's minimum reliability as a filter that relaxes only when nothing above it is left (the
platform's own filter; the naive renter); `"prior"` ranks every offer and lets the score weigh
in only as the prior of p, as the guarded policy does: measured on marketplace-shaped traces, the
floor pushed renters onto dear, traffic-billing duds with shiny scores while cheaper zero-traffic
hosts below 0.98 delivered as often (docs/simulation.md). A hard floor
(`Requirements.reliability_floor_soft=False`, what a job file's `needs.min_reliability` asks for)
filters in both modes.

(The all-in price formula is `app.policy.pricing.expected_cost`, shared with the market CLI; this
module adds the per-job life, the delivery probability and the price of failure.)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Literal

from app.market import Offer
from app.policy.gpus import same_gpu
from app.policy.pricing import expected_cost
from app.policy.reputation import (
    BOOT_FAILURES,
    PREFLIGHT_FAILURES,
    MachineRecord,
    delivery_probability,
    is_quarantined,
)

__all__ = [
    "DEFAULT_INET_DOWN_MBPS",
    "JobShape",
    "RankedOffer",
    "ReliabilityFloor",
    "Requirements",
    "attempt_cost_usd",
    "failed_attempt_cost_usd",
    "implausible_numbers",
    "machine_key",
    "market_delivery_rate",
    "offer_rejection",
    "pull_seconds",
    "rank_offers",
]

DEFAULT_INET_DOWN_MBPS = 100.0  # assumed when an offer does not advertise its download speed
DUD_PULL_FRACTION = 0.6  # assumption: what share of its pull's GPU time a dud bills before it is caught
_DUD_REASONS = BOOT_FAILURES | PREFLIGHT_FAILURES
ReliabilityFloor = Literal["fallback", "prior"]


@dataclass(frozen=True, slots=True)
class Requirements:
    """What a job needs from a host. Empty `gpu_names` = any model."""

    gpu_names: tuple[str, ...] = ()
    min_gpu_ram_gb: float = 0.0
    num_gpus: int = 1
    min_reliability: float = 0.98
    # A soft floor: when no offer above it is left (all taken, quarantined or excluded), offers
    # below it are admitted, still ranked by cost per delivered job (reliability is the prior of
    # the delivery probability). Markets game the score: duds with perfect reliability exist.
    reliability_floor_soft: bool = True
    min_inet_down_mbps: float = 0.0
    max_dph: float | None = None
    providers: tuple[str, ...] = ()
    # Only datacenter hosts (Vast's datacenter offers, RunPod's secure cloud). Offers carry no such
    # field: the market adapters filter on `OfferQuery.datacenter_only`, which this sets.
    datacenter_only: bool = False


@dataclass(frozen=True, slots=True)
class JobShape:
    """What one attempt at the job moves and runs."""

    download_gb: float  # image + model pulled before training
    train_s: float  # training at full speed
    disk_gb: float  # disk billed as storage from create to destroy
    overhead_s: float = 120.0  # preflight, bundle push, adapter pull
    kill_after_s: float | None = None  # a rental's kill-time after its create (None: derived, app.policy.fleet)


@dataclass(frozen=True, slots=True)
class RankedOffer:
    offer: Offer
    attempt_cost_usd: float
    delivery_probability: float
    cost_per_delivered_job_usd: float


def machine_key(offer: Offer) -> str:
    """The id reputation is kept under: the machine, or the offer when the vendor hides it."""
    return offer.machine_id if offer.machine_id else f"offer:{offer.offer_id}"


def pull_seconds(*, download_gb: float, inet_down_mbps: float | None) -> float:
    mbps = inet_down_mbps if inet_down_mbps and inet_down_mbps > 0 else DEFAULT_INET_DOWN_MBPS
    return download_gb * 8000.0 / mbps


def attempt_cost_usd(
    *,
    dph_total: float,
    storage_per_gb_month: float | None,
    inet_down_per_gb: float | None,
    inet_down_mbps: float | None,
    download_gb: float,
    train_s: float,
    disk_gb: float,
    overhead_s: float = 0.0,
) -> float:
    """GPU for pull + training + overhead, storage for the disk over that life, and traffic.

    The all-in arithmetic is `app.policy.pricing.expected_cost` (the one formula the market CLI
    uses too), over the attempt's life.
    """
    life_s = pull_seconds(download_gb=download_gb, inet_down_mbps=inet_down_mbps) + train_s + overhead_s
    return expected_cost(
        dph_total=dph_total,
        storage_per_gb_month=storage_per_gb_month,
        inet_down_per_gb=inet_down_per_gb,
        hours=life_s / 3600.0,
        disk_gb=disk_gb,
        download_gb=download_gb,
    ).expected_cost_usd


def implausible_numbers(offer: Offer) -> str | None:
    """Why the vendor's numbers for this offer cannot be believed (a NaN, an infinity, a negative
    price or a reliability outside [0, 1] would rank anywhere), or None when they can."""
    checks = (
        ("price", offer.dph_total, False, None),
        ("VRAM", offer.gpu_ram_gb, False, None),
        ("storage price", offer.storage_per_gb_month, True, None),
        ("traffic price", offer.inet_down_per_gb, True, None),
        ("download speed", offer.inet_down_mbps, True, None),
        ("reliability", offer.reliability, True, 1.0),
    )
    for name, value, optional, highest in checks:
        if value is None and optional:
            continue
        if value is None or not math.isfinite(value) or value < 0 or (highest is not None and value > highest):
            return f"vendor's {name} {value!r} is not a finite number in range: offer ignored"
    return None


def offer_rejection(
    offer: Offer,
    req: Requirements,
    *,
    record: MachineRecord | None = None,
    now: float,
    excluded: frozenset[str] = frozenset(),
) -> str | None:
    """Why this offer may not be rented for the job, or None when it may."""
    bad = implausible_numbers(offer)
    if bad is not None:
        return bad
    key = machine_key(offer)
    if key in excluded:
        return "excluded for this job"
    if is_quarantined(record, now=now):
        return f"quarantined ({record.quarantine_reason if record else ''})"
    if req.providers and offer.provider not in req.providers:
        return f"provider {offer.provider} not allowed"
    if req.gpu_names and not any(same_gpu(want, offer.gpu_name) for want in req.gpu_names):
        return f"GPU {offer.gpu_name} not in {list(req.gpu_names)}"
    if offer.num_gpus < req.num_gpus:
        return f"{offer.num_gpus} GPUs < {req.num_gpus}"
    if offer.gpu_ram_gb < req.min_gpu_ram_gb:
        return f"VRAM {offer.gpu_ram_gb:g} GB < {req.min_gpu_ram_gb:g} GB"
    if req.min_reliability > 0 and (offer.reliability is None or offer.reliability < req.min_reliability):
        return f"reliability {offer.reliability} < {req.min_reliability}"
    if req.min_inet_down_mbps > 0 and (offer.inet_down_mbps is None or offer.inet_down_mbps < req.min_inet_down_mbps):
        return f"download {offer.inet_down_mbps} Mb/s < {req.min_inet_down_mbps:g}"
    if req.max_dph is not None and offer.dph_total > req.max_dph:
        return f"${offer.dph_total:.3f}/h > max ${req.max_dph:.3f}/h"
    return None


def rank_offers(
    offers: Iterable[Offer],
    req: Requirements,
    shape: JobShape,
    *,
    records: Mapping[str, MachineRecord],
    now: float,
    excluded: frozenset[str] = frozenset(),
    reliability_floor: ReliabilityFloor = "fallback",
) -> list[RankedOffer]:
    """Eligible offers, cheapest expected cost per delivered job first (ties: cheaper hourly).

    A soft reliability floor either falls back to the offers below it when none above is left
    (`"fallback"`) or does not filter at all (`"prior"`: the score is only the prior of p).
    """
    offers = list(offers)
    if reliability_floor == "prior" and req.reliability_floor_soft:
        req = replace(req, min_reliability=0.0)
    ranked = _rank(offers, req, shape, records=records, now=now, excluded=excluded)
    if not ranked and req.reliability_floor_soft and req.min_reliability > 0:
        ranked = _rank(offers, replace(req, min_reliability=0.0), shape, records=records, now=now, excluded=excluded)
    return ranked


def _rank(
    offers: list[Offer],
    req: Requirements,
    shape: JobShape,
    *,
    records: Mapping[str, MachineRecord],
    now: float,
    excluded: frozenset[str],
) -> list[RankedOffer]:
    ranked: list[RankedOffer] = []
    market_rate = market_delivery_rate(records)
    for offer in offers:
        rec = records.get(machine_key(offer))
        if offer_rejection(offer, req, record=rec, now=now, excluded=excluded) is not None:
            continue
        cost = attempt_cost_usd(
            dph_total=offer.dph_total,
            storage_per_gb_month=offer.storage_per_gb_month,
            inet_down_per_gb=offer.inet_down_per_gb,
            inet_down_mbps=offer.inet_down_mbps,
            download_gb=shape.download_gb,
            train_s=shape.train_s,
            disk_gb=shape.disk_gb,
            overhead_s=shape.overhead_s,
        )
        fail_cost = failed_attempt_cost_usd(offer, shape)
        p = market_rate * delivery_probability(
            platform_reliability=offer.reliability,
            delivered=rec.delivered if rec else 0,
            failed=rec.failure_count if rec else 0,
        )
        per_job = cost + fail_cost * (1.0 - p) / p if p > 0 else float("inf")
        ranked.append(RankedOffer(offer, cost, p, per_job))
    ranked.sort(key=lambda r: (r.cost_per_delivered_job_usd, r.offer.dph_total, r.offer.offer_id))
    return ranked


def failed_attempt_cost_usd(offer: Offer, shape: JobShape) -> float:
    """What a dud on this offer bills before it is caught: GPU time and storage for
    DUD_PULL_FRACTION of the pull (frozen and fatal pulls die part-way, stale drivers at its end),
    and the traffic of the whole download (the preflight sees a stale driver only after it)."""
    pull_h = pull_seconds(download_gb=shape.download_gb, inet_down_mbps=offer.inet_down_mbps) / 3600.0
    return expected_cost(
        dph_total=offer.dph_total,
        storage_per_gb_month=offer.storage_per_gb_month,
        inet_down_per_gb=offer.inet_down_per_gb,
        hours=DUD_PULL_FRACTION * pull_h,
        disk_gb=shape.disk_gb,
        download_gb=shape.download_gb,
    ).expected_cost_usd


def market_delivery_rate(
    records: Mapping[str, MachineRecord], *, prior_delivered: float = 2.0, prior_failed: float = 2.0
) -> float:
    """How often a rental on THIS marketplace delivers, from our record across all machines.

    The mean of a Beta posterior whose prior (2 delivered, 2 failed: a coin flip) encodes what the
    field reports measured (62 of 100 creates never delivered); our own record quickly takes over.
    On a marketplace where most rentals fail, every unknown machine is a gamble, and the price of a
    failed attempt (a slow pull, traffic billed per GB) must weigh in the ranking.
    """
    delivered = sum(r.delivered for r in records.values())
    failed = sum(sum(1 for reason, _ in r.failures if reason in _DUD_REASONS) for r in records.values())
    return (prior_delivered + delivered) / (prior_delivered + prior_failed + delivered + failed)
