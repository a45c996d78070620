"""The all-in price of an offer: GPU time, storage and traffic."""

from __future__ import annotations

import math

import pytest

from app.policy.pricing import HOURS_PER_MONTH, expected_cost


def test_defaults_price_one_hour_of_gpu() -> None:
    """With the defaults (1 h, no disk, no download) the cost is the hourly price."""
    got = expected_cost(dph_total=0.3, storage_per_gb_month=0.1, inet_down_per_gb=0.02)
    assert got.expected_cost_usd == pytest.approx(0.3) and got.price_unknown == ()


def test_storage_and_traffic_are_added() -> None:
    """dph*H + storage*D*H/720 + traffic*G, each part reported."""
    got = expected_cost(
        dph_total=0.11, storage_per_gb_month=0.15, inet_down_per_gb=0.002, hours=10, disk_gb=100, download_gb=200
    )
    assert got.gpu_usd == pytest.approx(1.1)
    assert got.storage_usd == pytest.approx(0.15 * 100 * 10 / HOURS_PER_MONTH)
    assert got.traffic_usd == pytest.approx(0.4)
    assert got.expected_cost_usd == pytest.approx(1.1 + 0.15 * 100 * 10 / 720 + 0.4)


def test_unknown_prices_count_zero_and_are_flagged() -> None:
    """A price the vendor does not publish (None or NaN) counts as 0 and is named."""
    got = expected_cost(
        dph_total=0.22, storage_per_gb_month=None, inet_down_per_gb=math.nan, hours=2, disk_gb=50, download_gb=30
    )
    assert got.expected_cost_usd == pytest.approx(0.44)
    assert got.price_unknown == ("storage_per_gb_month", "inet_down_per_gb")


@pytest.mark.parametrize("bad", [{"hours": -1.0}, {"disk_gb": -5.0}, {"download_gb": math.nan}, {"dph_total": -0.1}])
def test_negative_amounts_are_refused(bad: dict[str, float]) -> None:
    """Negative or NaN amounts are a ValueError, not a discount."""
    args = {"dph_total": 0.1, "storage_per_gb_month": 0.1, "inet_down_per_gb": 0.1, **bad}
    with pytest.raises(ValueError):
        expected_cost(**args)
