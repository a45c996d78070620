"""A job cannot be judged out of money when no offer prices an attempt: an empty search (a 429 on
the search, every matching host rented by other jobs) says nothing about what an attempt costs."""

from __future__ import annotations

import math

from app.policy.fleet import budget_exhausted


def test_no_offer_is_not_a_budget_too_small_for_one_attempt() -> None:
    """With nothing live and dollars left, an unknown cheapest attempt (no offers) ends nothing."""
    assert not budget_exhausted(budget_left_usd=200.0, cheapest_attempt_usd=math.inf, anything_live=False)
    assert not budget_exhausted(budget_left_usd=0.0, cheapest_attempt_usd=math.inf, anything_live=False)
