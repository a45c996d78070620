"""All-in price of an offer: GPU time, storage and traffic, in dollars. Pure, stdlib only.

`expected_cost_usd = dph_total * hours + storage_per_gb_month * disk_gb * hours / 720
                     + inet_down_per_gb * download_gb`

A month is 720 hours (Vast bills storage per GB per 30-day month). A price the vendor does not
publish counts as 0 and is named in `price_unknown`, so a cheap-looking offer with an unknown
storage or traffic price is visibly not comparable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["HOURS_PER_MONTH", "PriceEstimate", "expected_cost"]

HOURS_PER_MONTH = 720.0


@dataclass(frozen=True, slots=True)
class PriceEstimate:
    """The expected cost and which of its prices were unknown (counted as 0)."""

    expected_cost_usd: float
    gpu_usd: float
    storage_usd: float
    traffic_usd: float
    price_unknown: tuple[str, ...]


def _check(name: str, value: float) -> None:
    if math.isnan(value) or value < 0:
        raise ValueError(f"{name} must be a number >= 0, got {value!r}")


def expected_cost(
    *,
    dph_total: float | None,
    storage_per_gb_month: float | None,
    inet_down_per_gb: float | None,
    hours: float = 1.0,
    disk_gb: float = 0.0,
    download_gb: float = 0.0,
) -> PriceEstimate:
    """What renting for `hours` with `disk_gb` of disk and `download_gb` of downloads costs."""
    for name, amount in (("hours", hours), ("disk_gb", disk_gb), ("download_gb", download_gb)):
        _check(name, amount)
    unknown: list[str] = []
    prices: dict[str, float] = {}
    for name, price in (
        ("dph_total", dph_total),
        ("storage_per_gb_month", storage_per_gb_month),
        ("inet_down_per_gb", inet_down_per_gb),
    ):
        if price is None or math.isnan(price):
            unknown.append(name)
            prices[name] = 0.0
        else:
            _check(name, price)
            prices[name] = price
    gpu_usd = prices["dph_total"] * hours
    storage_usd = prices["storage_per_gb_month"] * disk_gb * hours / HOURS_PER_MONTH
    traffic_usd = prices["inet_down_per_gb"] * download_gb
    return PriceEstimate(
        expected_cost_usd=gpu_usd + storage_usd + traffic_usd,
        gpu_usd=gpu_usd,
        storage_usd=storage_usd,
        traffic_usd=traffic_usd,
        price_unknown=tuple(unknown),
    )
