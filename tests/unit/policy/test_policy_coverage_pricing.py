"""All-in price edges: a price the vendor does not publish, and amounts that are not money."""

from __future__ import annotations

import math

import pytest

from app.policy.pricing import expected_cost


def test_an_unpublished_or_nan_price_counts_as_zero_and_is_named() -> None:
    """A missing storage price and a NaN traffic price cost nothing but are listed as unknown."""
    est = expected_cost(
        dph_total=0.5, storage_per_gb_month=None, inet_down_per_gb=math.nan, hours=2.0, disk_gb=100.0, download_gb=10.0
    )
    assert est.expected_cost_usd == pytest.approx(1.0)
    assert est.price_unknown == ("storage_per_gb_month", "inet_down_per_gb")


@pytest.mark.parametrize("kw", [{"hours": -1.0}, {"disk_gb": math.nan}, {"dph_total": -0.1}])
def test_a_negative_or_nan_amount_is_refused(kw: dict[str, float]) -> None:
    """Negative hours, a NaN disk size or a negative price raise instead of pricing an offer."""
    args: dict[str, float | None] = {"dph_total": 0.5, "storage_per_gb_month": 0.1, "inet_down_per_gb": 0.0}
    args.update(kw)
    with pytest.raises(ValueError, match="must be a number >= 0"):
        expected_cost(**args)  # type: ignore[arg-type]
