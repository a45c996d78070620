"""A vendor's non-finite or out-of-range numbers never rank: the offer is ignored, with its reason."""

from __future__ import annotations

import math

import pytest

from app.market import Offer
from app.policy.ranking import JobShape, Requirements, implausible_numbers, offer_rejection, rank_offers

SHAPE = JobShape(download_gb=20.0, train_s=3600.0, disk_gb=40.0)


def offer(oid: str, **kw: float | None) -> Offer:
    values: dict[str, float | None] = {
        "dph_total": 0.3,
        "gpu_ram_gb": 24.0,
        "storage_per_gb_month": 0.1,
        "inet_down_per_gb": 0.0,
        "inet_down_mbps": 800.0,
        "reliability": 0.99,
    }
    values.update(kw)
    return Offer(
        provider="sim",
        offer_id=oid,
        machine_id=f"m-{oid}",
        gpu_name="RTX 3090",
        num_gpus=1,
        cuda_max="12.4",
        **values,  # type: ignore[arg-type]
    )


BAD = [
    ("price-nan", {"dph_total": math.nan}, "price"),
    ("price-inf", {"dph_total": math.inf}, "price"),
    ("price-negative", {"dph_total": -0.5}, "price"),
    ("storage-nan", {"storage_per_gb_month": math.nan}, "storage price"),
    ("traffic-negative", {"inet_down_per_gb": -0.01}, "traffic price"),
    ("traffic-inf", {"inet_down_per_gb": math.inf}, "traffic price"),
    ("speed-nan", {"inet_down_mbps": math.nan}, "download speed"),
    ("reliability-nan", {"reliability": math.nan}, "reliability"),
    ("reliability-above-1", {"reliability": 1.5}, "reliability"),
    ("reliability-negative", {"reliability": -0.1}, "reliability"),
    ("vram-nan", {"gpu_ram_gb": math.nan}, "VRAM"),
]


@pytest.mark.parametrize(("fields", "name"), [(b[1], b[2]) for b in BAD], ids=[b[0] for b in BAD])
def test_an_offer_with_an_implausible_number_is_rejected_naming_it(fields: dict[str, float], name: str) -> None:
    """The rejection names the number that cannot be believed."""
    bad = offer("x", **fields)
    reason = offer_rejection(bad, Requirements(min_reliability=0.0), now=0.0) or ""
    assert reason.startswith(f"vendor's {name} ") and "offer ignored" in reason
    assert implausible_numbers(bad) == reason


@pytest.mark.parametrize("mode", ["fallback", "prior"])
def test_implausible_offers_never_rank_even_when_cheapest(mode: str) -> None:
    """A NaN or negative price would sort first or anywhere: only the sane offer is ranked."""
    offers = [offer(b[0], **b[1]) for b in BAD] + [offer("sane")]
    ranked = rank_offers(offers, Requirements(), SHAPE, records={}, now=0.0, reliability_floor=mode)  # type: ignore[arg-type]
    assert [r.offer.offer_id for r in ranked] == ["sane"]
    assert all(math.isfinite(r.cost_per_delivered_job_usd) for r in ranked)


def test_unknown_optional_numbers_are_not_implausible() -> None:
    """An offer that does not advertise storage, traffic, speed or reliability is still rentable."""
    quiet = offer("q", storage_per_gb_month=None, inet_down_per_gb=None, inet_down_mbps=None, reliability=None)
    assert implausible_numbers(quiet) is None
