"""The budget monitor's pass reads each live rental's reservations once, not once per cap: with a
cap per job (every submitted job with a budget has one) the pass would otherwise cost caps x live
rentals queries every minute, and the nemesis at 500 jobs spent most of its time there."""

from __future__ import annotations

from collections.abc import Collection

from app.alerts import InMemoryNotifier
from app.rentals import Rentals
from app.services.guardrails import sweep_budgets
from providers.sim import VirtualClock

from .conftest import host, make_market, rent


def test_each_live_rental_is_looked_up_once_per_pass(rentals: Rentals, clock: VirtualClock) -> None:
    """Given 12 caps and 3 live rentals, one pass looks up each rental's reservations once, and
    still finds every rental under its cap."""
    market = make_market([host(i) for i in range(3)], clock)
    for i in range(3):
        rent(rentals, market, clock, f"job-{i}", machine=f"m-{i}")
    for i in range(10):
        rentals.budget.set_cap(f"other-{i}", 50.0)
    rentals.budget.set_cap("tight", 0.5)
    looked_up: list[str] = []
    real = rentals.reservations_of_many

    def counting(rental_ids: Collection[str]) -> dict[str, list[str]]:
        looked_up.extend(rental_ids)
        return real(rental_ids)

    rentals.reservations_of_many = counting  # type: ignore[method-assign]
    report = sweep_budgets(
        rentals.budget, notifier=InMemoryNotifier(), rentals=rentals, markets={"sim": market}, now=clock.now() + 3600
    )
    assert sorted(looked_up) == sorted(r.id for r in rentals.all(states=("active", "stopped")))
    assert report.examined == 12 and not report.errors
