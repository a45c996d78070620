"""A host's price increase is rejected above the job's max price and accepted within it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from app.policy.prices import PriceAnswer, decide_price_increase

PRICES = st.floats(min_value=0.0, max_value=100.0, allow_nan=False)


def test_above_the_max_price_is_rejected() -> None:
    """$0.50/h against a $0.40/h max is rejected, and the reason names both prices."""
    d = decide_price_increase(new_usd_per_hour=0.50, max_usd_per_hour=0.40, old_usd_per_hour=0.30)
    assert d.answer is PriceAnswer.REJECT
    assert "$0.5000/h from $0.3000/h" in d.reason and "max price $0.4000/h" in d.reason


def test_at_or_below_the_max_price_is_accepted() -> None:
    """A new price equal to the max is still within it."""
    assert decide_price_increase(new_usd_per_hour=0.40, max_usd_per_hour=0.40).answer is PriceAnswer.ACCEPT


def test_no_max_price_accepts() -> None:
    """A job that sets no max price accepts any increase."""
    d = decide_price_increase(new_usd_per_hour=9.0, max_usd_per_hour=None)
    assert d.answer is PriceAnswer.ACCEPT and "no max price" in d.reason


def test_an_unreadable_new_price_is_rejected() -> None:
    """Never agree to a price that cannot be read."""
    assert decide_price_increase(new_usd_per_hour=None, max_usd_per_hour=None).answer is PriceAnswer.REJECT


@given(new=PRICES, limit=PRICES)
def test_the_answer_is_exactly_the_comparison(new: float, limit: float) -> None:
    """Reject if and only if the new price is above the limit."""
    d = decide_price_increase(new_usd_per_hour=new, max_usd_per_hour=limit)
    assert (d.answer is PriceAnswer.REJECT) == (new > limit)
