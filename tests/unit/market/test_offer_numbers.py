"""A vendor record whose price is NaN, infinite or negative never becomes an offer."""

from __future__ import annotations

import pytest

from providers.vast import vast_offer

RECORD = {"id": 7, "machine_id": 3, "gpu_name": "RTX 3090", "num_gpus": 1, "gpu_ram": 24576, "dph_total": 0.3}


@pytest.mark.parametrize("price", ["NaN", float("nan"), float("inf"), "Infinity", "1e309", -0.2])
def test_a_vast_offer_without_a_finite_non_negative_price_is_refused(price: object) -> None:
    """vast_offer raises ValueError, which the search logs as a warning and skips."""
    with pytest.raises(ValueError, match="dph_total"):
        vast_offer({**RECORD, "dph_total": price})


def test_a_non_finite_reliability_reads_as_unknown() -> None:
    """A NaN reliability is no reliability at all (None), not a number that compares false."""
    assert vast_offer({**RECORD, "reliability2": "nan"}).reliability is None
    assert vast_offer(RECORD).dph_total == 0.3
