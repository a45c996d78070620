"""Ranking, the all-in price and price increases at their exact boundaries and with their exact
numbers, so that a changed comparison, default or formula in app/policy/ranking.py, pricing.py or
prices.py fails a test (make mutation)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from app.market import Offer
from app.policy.prices import PriceAnswer, PriceIncreaseDecision, decide_price_increase
from app.policy.pricing import expected_cost
from app.policy.ranking import (
    DUD_PULL_FRACTION,
    JobShape,
    Requirements,
    attempt_cost_usd,
    failed_attempt_cost_usd,
    implausible_numbers,
    market_delivery_rate,
    offer_rejection,
    pull_seconds,
    rank_offers,
)
from app.policy.reputation import MachineRecord, delivery_probability

SHAPE = JobShape(download_gb=20.0, train_s=600.0, disk_gb=40.0, overhead_s=120.0)
ANY = Requirements(min_reliability=0.0)


def offer(oid: str = "o1", **kw: Any) -> Offer:
    base: dict[str, Any] = {
        "provider": "sim",
        "offer_id": oid,
        "machine_id": f"m-{oid}",
        "gpu_name": "RTX 3090",
        "num_gpus": 1,
        "gpu_ram_gb": 24.0,
        "dph_total": 0.2,
        "storage_per_gb_month": 0.1,
        "inet_down_per_gb": 0.01,
        "inet_down_mbps": 800.0,
        "reliability": 0.99,
        "cuda_max": "12.4",
    }
    return Offer(**{**base, **kw})


def test_an_attempt_costs_its_whole_life_at_the_offers_prices() -> None:
    """Pull (20 GB at 800 Mb/s: 200 s) + training + overhead, billed as GPU, storage and traffic."""
    life_h = (200.0 + 600.0 + 120.0) / 3600.0
    want = 0.2 * life_h + 0.1 * 40.0 * life_h / 720.0 + 0.01 * 20.0
    got = attempt_cost_usd(
        dph_total=0.2,
        storage_per_gb_month=0.1,
        inet_down_per_gb=0.01,
        inet_down_mbps=800.0,
        download_gb=20.0,
        train_s=600.0,
        disk_gb=40.0,
        overhead_s=120.0,
    )
    assert got == pytest.approx(want, rel=1e-12)


def test_a_dud_bills_part_of_its_pull_and_the_whole_download() -> None:
    """A failed attempt: GPU and storage for DUD_PULL_FRACTION of the 200 s pull, traffic for all 20 GB."""
    pull_h = DUD_PULL_FRACTION * 200.0 / 3600.0
    want = 0.2 * pull_h + 0.1 * 40.0 * pull_h / 720.0 + 0.01 * 20.0
    assert failed_attempt_cost_usd(offer(), SHAPE) == pytest.approx(want, rel=1e-12)


def test_a_ranked_offer_carries_its_exact_costs_and_delivery_probability() -> None:
    """With no record: p is the market rate times the platform prior; cost per job adds the
    failed attempts a geometric number of retries costs."""
    (r,) = rank_offers([offer()], ANY, SHAPE, records={}, now=0.0)
    cost = attempt_cost_usd(
        dph_total=0.2,
        storage_per_gb_month=0.1,
        inet_down_per_gb=0.01,
        inet_down_mbps=800.0,
        download_gb=20.0,
        train_s=600.0,
        disk_gb=40.0,
        overhead_s=120.0,
    )
    p = 0.5 * delivery_probability(platform_reliability=0.99, delivered=0, failed=0)
    assert r.attempt_cost_usd == pytest.approx(cost, rel=1e-12)
    assert r.delivery_probability == pytest.approx(p, rel=1e-12)
    fail = failed_attempt_cost_usd(offer(), SHAPE)
    assert r.cost_per_delivered_job_usd == pytest.approx(cost + fail * (1.0 - p) / p, rel=1e-12)


def test_an_offer_that_never_delivers_costs_infinity_per_job_and_ranks_last() -> None:
    """A platform reliability of 0 with no record: p = 0, an infinite cost per delivered job."""
    never = offer("o0", reliability=0.0, dph_total=0.01)
    ranked = rank_offers([never, offer()], ANY, SHAPE, records={}, now=0.0)
    assert [r.offer.offer_id for r in ranked] == ["o1", "o0"]
    assert ranked[1].delivery_probability == 0.0
    assert ranked[1].cost_per_delivered_job_usd == float("inf")


def test_the_prior_mode_ranks_offers_below_the_soft_floor() -> None:
    """`prior`: the cheaper 0.9-reliability offer is ranked beside the 1.0 one, not filtered out."""
    shiny, cheap = offer("shiny", reliability=1.0, dph_total=0.5), offer("cheap", reliability=0.9, dph_total=0.1)
    ranked = rank_offers([shiny, cheap], Requirements(), SHAPE, records={}, now=0.0, reliability_floor="prior")
    assert {r.offer.offer_id for r in ranked} == {"shiny", "cheap"}


def test_the_fallback_below_the_floor_still_respects_quarantine() -> None:
    """Nothing above the floor: offers below it are admitted, but a quarantined one stays out."""
    low, banned = offer("low", reliability=0.5), offer("banned", reliability=0.5)
    records = {"m-banned": MachineRecord(machine_id="m-banned", quarantined_until=1e9, quarantine_reason="boot")}
    ranked = rank_offers([low, banned], Requirements(), SHAPE, records=records, now=100.0)
    assert [r.offer.offer_id for r in ranked] == ["low"]


def test_the_market_delivery_rate_starts_at_a_two_and_two_prior() -> None:
    """No record: 2 / (2 + 2). One dud boot: 2 / 5. Failures that are not duds do not count."""
    assert market_delivery_rate({}) == 0.5
    dud = MachineRecord(machine_id="m1", failures=(("boot_frozen", 1.0),))
    assert market_delivery_rate({"m1": dud}) == pytest.approx(2.0 / 5.0)
    two = MachineRecord(machine_id="m1", failures=(("boot_frozen", 1.0), ("boot_fatal", 2.0)))
    assert market_delivery_rate({"m1": two}) == pytest.approx(2.0 / 6.0)


def test_a_download_speed_below_one_megabit_is_still_used() -> None:
    """0.5 Mb/s is slow, not missing: 1 GB takes 16000 s."""
    assert pull_seconds(download_gb=1.0, inet_down_mbps=0.5) == 16000.0


@pytest.mark.parametrize("field", ["dph_total", "gpu_ram_gb"])
def test_an_offer_without_a_price_or_vram_is_implausible(field: str) -> None:
    """Price and VRAM are not optional: a missing one is not believed."""
    name = {"dph_total": "price", "gpu_ram_gb": "VRAM"}[field]
    missing: dict[str, Any] = {field: None}
    assert (
        implausible_numbers(offer(**missing)) == f"vendor's {name} None is not a finite number in range: offer ignored"
    )


def test_an_unknown_optional_number_does_not_hide_a_bad_one_after_it() -> None:
    """A missing storage price is skipped; a reliability of 1.5 after it is still caught."""
    bad = offer(storage_per_gb_month=None, reliability=1.5)
    assert implausible_numbers(bad) == "vendor's reliability 1.5 is not a finite number in range: offer ignored"


def test_rejections_at_the_boundaries() -> None:
    """Exactly the VRAM, download speed and max price asked for are enough."""
    assert offer_rejection(offer(gpu_ram_gb=24.0), Requirements(min_gpu_ram_gb=24.0), now=0.0) is None
    assert offer_rejection(offer(inet_down_mbps=500.0), replace(ANY, min_inet_down_mbps=500.0), now=0.0) is None
    assert offer_rejection(offer(dph_total=0.2), replace(ANY, max_dph=0.2), now=0.0) is None


def test_no_floor_asked_admits_an_offer_that_shows_no_score_or_speed() -> None:
    """Without a reliability or download floor, offers that do not show those numbers pass."""
    assert offer_rejection(offer(reliability=None, inet_down_mbps=None), ANY, now=0.0) is None


def test_a_small_download_floor_rejects_an_offer_that_shows_no_speed() -> None:
    """Asked for 0.5 Mb/s at least, an offer that does not show its speed is rejected."""
    got = offer_rejection(offer(inet_down_mbps=None), replace(ANY, min_inet_down_mbps=0.5), now=0.0)
    assert got == "download None Mb/s < 0.5"


def test_excluded_and_quarantined_offers_say_so() -> None:
    """The reason names the exclusion, or the quarantine with its recorded reason."""
    assert offer_rejection(offer(), ANY, now=0.0, excluded=frozenset({"m-o1"})) == "excluded for this job"
    rec = MachineRecord(machine_id="m-o1", quarantine_permanent=True, quarantine_reason="gpu_mismatch")
    assert offer_rejection(offer(), ANY, record=rec, now=0.0) == "quarantined (gpu_mismatch)"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"hours": -1.0}, "hours must be a number >= 0, got -1.0"),
        ({"disk_gb": -1.0}, "disk_gb must be a number >= 0, got -1.0"),
        ({"download_gb": -1.0}, "download_gb must be a number >= 0, got -1.0"),
        ({"storage_per_gb_month": -0.1}, "storage_per_gb_month must be a number >= 0, got -0.1"),
    ],
)
def test_a_negative_amount_or_price_is_refused_by_name(kwargs: dict[str, float], message: str) -> None:
    """The error names the argument that was negative."""
    args: dict[str, Any] = {"dph_total": 0.2, "storage_per_gb_month": 0.1, "inet_down_per_gb": 0.0, **kwargs}
    with pytest.raises(ValueError) as err:
        expected_cost(**args)
    assert str(err.value) == message


def test_price_increase_reasons_name_the_prices() -> None:
    """Each answer's reason gives the new price and, when known, the old one and the max."""
    assert decide_price_increase(new_usd_per_hour=None, max_usd_per_hour=1.0) == PriceIncreaseDecision(
        PriceAnswer.REJECT, "the new price cannot be read"
    )
    assert decide_price_increase(
        new_usd_per_hour=0.5, max_usd_per_hour=1.0, old_usd_per_hour=0.4
    ) == PriceIncreaseDecision(PriceAnswer.ACCEPT, "$0.5000/h from $0.4000/h is within the job's max price $1.0000/h")


def test_our_own_record_of_a_machine_moves_its_delivery_probability() -> None:
    """Three passed preflights and one dud boot on the machine enter its Beta posterior, and the
    market rate."""
    rec = MachineRecord(machine_id="m-o1", preflight_passed=3, failures=(("boot_frozen", 1.0),))
    (r,) = rank_offers([offer()], ANY, SHAPE, records={"m-o1": rec}, now=10.0)
    market = (2.0 + 3) / (2.0 + 2.0 + 3 + 1)
    assert r.delivery_probability == pytest.approx(
        market * delivery_probability(platform_reliability=0.99, delivered=3, failed=1), rel=1e-12
    )
