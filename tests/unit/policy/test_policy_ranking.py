"""Offer ranking: filters, all-in attempt cost, and cost per delivered job."""

from __future__ import annotations

import pytest

from app.market import Offer
from app.policy.ranking import (
    JobShape,
    Requirements,
    attempt_cost_usd,
    failed_attempt_cost_usd,
    offer_rejection,
    rank_offers,
)
from app.policy.reputation import MachineRecord, record_failure, record_preflight_passed


def offer(oid: str, *, dph: float = 0.2, rel: float | None = 0.99, gpu: str = "RTX 3090", ram: float = 24.0,
          traffic: float | None = 0.0, mbps: float | None = 800.0) -> Offer:
    return Offer(provider="sim", offer_id=oid, machine_id=f"m-{oid}", gpu_name=gpu, num_gpus=1, gpu_ram_gb=ram,
                 dph_total=dph, storage_per_gb_month=0.1, inet_down_per_gb=traffic, inet_down_mbps=mbps,
                 reliability=rel, cuda_max="12.4")


SHAPE = JobShape(download_gb=23.0, train_s=1140.0, disk_gb=60.0, overhead_s=0.0)


def test_attempt_cost_adds_gpu_storage_and_traffic() -> None:
    """GPU for pull plus training, storage over that life, traffic per GB."""
    cost = attempt_cost_usd(dph_total=0.36, storage_per_gb_month=0.72, inet_down_per_gb=0.01, inet_down_mbps=800.0,
                            download_gb=20.0, train_s=3400.0, disk_gb=10.0)
    # pull 200 s + 3400 s = 1 h: 0.36 GPU + 0.72*10*1/720 storage + 0.2 traffic
    assert cost == pytest.approx(0.36 + 0.01 + 0.2)


def test_filters_name_their_reason() -> None:
    """Each filter rejects with a reason that says which requirement failed."""
    req = Requirements(gpu_names=("RTX 4090",), min_gpu_ram_gb=24, min_inet_down_mbps=500, max_dph=0.5)
    assert "not in" in (offer_rejection(offer("a"), req, now=0.0) or "")
    req = Requirements(min_gpu_ram_gb=40)
    assert "VRAM" in (offer_rejection(offer("a"), req, now=0.0) or "")
    assert "reliability" in (offer_rejection(offer("a", rel=0.9), Requirements(), now=0.0) or "")
    assert "download" in (offer_rejection(offer("a", mbps=100), Requirements(min_inet_down_mbps=500), now=0.0) or "")
    assert "max" in (offer_rejection(offer("a", dph=0.9), Requirements(max_dph=0.5), now=0.0) or "")
    assert offer_rejection(offer("a"), Requirements(), now=0.0) is None


def test_quarantined_and_excluded_machines_are_skipped() -> None:
    """A quarantined machine and one excluded for the job are never ranked."""
    recs = {"m-a": record_failure(MachineRecord("m-a"), reason="no_compute", now=0.0)}
    ranked = rank_offers([offer("a"), offer("b"), offer("c")], Requirements(), SHAPE, records=recs, now=1.0,
                         excluded=frozenset({"m-b"}))
    assert [r.offer.offer_id for r in ranked] == ["c"]


def test_traffic_price_can_outweigh_a_cheaper_hourly_rate() -> None:
    """The all-in price, not the hourly rate, decides: cheap GPU with dear traffic loses."""
    ranked = rank_offers([offer("cheap", dph=0.11, traffic=0.05), offer("fair", dph=0.19)], Requirements(), SHAPE,
                         records={}, now=0.0)
    assert ranked[0].offer.offer_id == "fair"


def test_our_record_beats_the_platform_score() -> None:
    """At the same price, a machine that delivered for us beats one with a perfect score that failed us."""
    bad = record_failure(MachineRecord("m-x"), reason="train_failed", now=0.0)
    good = record_preflight_passed(MachineRecord("m-y"), now=0.0)
    ranked = rank_offers([offer("x", dph=0.19, rel=1.0), offer("y", dph=0.19, rel=0.98)], Requirements(), SHAPE,
                         records={"m-x": bad, "m-y": good}, now=1.0)
    assert [r.offer.offer_id for r in ranked] == ["y", "x"]
    assert ranked[0].delivery_probability > ranked[1].delivery_probability


def test_a_hostile_market_prices_failed_attempts_in() -> None:
    """Once most rentals have failed, an unknown machine with dear traffic loses to a dearer GPU."""
    duds = {f"m-d{i}": record_failure(MachineRecord(f"m-d{i}"), reason="no_compute", now=0.0) for i in range(6)}
    quiet = rank_offers([offer("t", dph=0.14, traffic=0.004), offer("f", dph=0.16)], Requirements(), SHAPE,
                        records={}, now=1.0)
    hostile = rank_offers([offer("t", dph=0.14, traffic=0.004), offer("f", dph=0.16)], Requirements(), SHAPE,
                          records=duds, now=1.0)
    assert quiet[0].delivery_probability > hostile[0].delivery_probability
    assert hostile[0].cost_per_delivered_job_usd > quiet[0].cost_per_delivered_job_usd
    assert hostile[0].offer.offer_id == "f"


def test_reliability_as_prior_ranks_a_cheaper_host_below_the_floor_first() -> None:
    """In "prior" mode the platform score only weighs in as the prior: a cheap zero-traffic host
    at 0.93 beats a dearer one with traffic at 0.99; a hard floor still filters."""
    offers = [offer("low", rel=0.93, dph=0.10), offer("hi", rel=0.99, dph=0.18, traffic=0.02)]
    ranked = rank_offers(offers, Requirements(), SHAPE, records={}, now=0.0, reliability_floor="prior")
    assert [r.offer.offer_id for r in ranked] == ["low", "hi"]
    assert ranked[0].delivery_probability < ranked[1].delivery_probability
    hard = Requirements(reliability_floor_soft=False)
    assert [r.offer.offer_id for r in rank_offers(offers, hard, SHAPE, records={}, now=0.0, reliability_floor="prior")] == ["hi"]


def test_a_failed_attempt_bills_the_whole_download_s_traffic() -> None:
    """The price of failure counts all of the traffic (a stale driver is seen after the pull) and
    part of the pull's GPU time."""
    pricey = offer("t", dph=0.2, traffic=0.05, mbps=800.0)
    assert failed_attempt_cost_usd(pricey, SHAPE) >= 0.05 * SHAPE.download_gb
    free = offer("f", dph=0.2, traffic=0.0, mbps=800.0)
    assert failed_attempt_cost_usd(free, SHAPE) < 0.2 * (SHAPE.download_gb * 8000 / 800) / 3600 + 0.01


def test_soft_reliability_floor_admits_lower_scores_only_when_nothing_else_is_left() -> None:
    """With every offer above the floor gone, offers below it are ranked; a hard floor refuses."""
    offers = [offer("low", rel=0.95)]
    assert [r.offer.offer_id for r in rank_offers(offers, Requirements(), SHAPE, records={}, now=0.0)] == ["low"]
    hard = Requirements(reliability_floor_soft=False)
    assert rank_offers(offers, hard, SHAPE, records={}, now=0.0) == []
    both = rank_offers([offer("low", rel=0.95, dph=0.01), offer("hi", rel=0.99)], Requirements(), SHAPE, records={}, now=0.0)
    assert [r.offer.offer_id for r in both] == ["hi"]
