"""The budget monitor's bulk reads (a query per 500 rentals or caps) give what the one-at-a-time
reads give: reservations, billed-from times after a transfer, dollars with traffic, cap levels and
held reservations, also when the ids are cut into several IN (...) lists."""

from __future__ import annotations

import pytest

import app.budget
from app.rentals import Rentals
from providers.sim import VirtualClock

from .conftest import host, make_market, rent


@pytest.mark.parametrize("chunk", [2, 500])
def test_bulk_reads_equal_the_reads_one_at_a_time(
    rentals: Rentals, clock: VirtualClock, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    """Given five rentals (one transferred to another job, two with traffic) and caps of two
    periods, every bulk read equals the one-at-a-time read, with IN lists of 2 and of 500."""
    monkeypatch.setattr(app.budget, "IN_CHUNK", chunk)
    market = make_market([host(i) for i in range(5)], clock)
    for name, period in (("day", "day"), ("c-1", "total"), ("c-2", "total")):
        rentals.budget.set_cap(name, 20.0, period=period)
    made = [rent(rentals, market, clock, f"j{i}", machine=f"m-{i}") for i in range(5)]
    rentals.budget.reserve("day", 2.0, job="j1")  # now, on the wall clock: inside the current day
    clock.advance(600)
    reservation = rentals.budget.reserve("c-1", 1.0, job="b", now=clock.now())
    assert rentals.transfer(
        made[0].id, from_job="j0", to_job="b", reservations=[reservation], now=clock.now(), reason="held host adopted"
    )
    clock.advance(60)
    rentals.add_traffic(made[0].id, nbytes=3 * 10**9, key="pull", now=clock.now())
    rentals.add_traffic(made[3].id, nbytes=10**9, key="push", now=clock.now())
    clock.advance(1200)
    live = rentals.billing()
    ids = [r.id for r in live] + ["no-such-rental"]
    assert rentals.reservations_of_many(ids) == {i: rentals.reservations_of(i) for i in ids}
    assert rentals.billed_from_many(live) == {r.id: rentals.billed_from(r) for r in live}
    assert rentals.billed_from_many(live)[made[0].id] > made[0].created_at
    assert rentals.spent_usd_many(live, now=clock.now()) == {r.id: rentals.spent_usd(r, now=clock.now()) for r in live}
    budget = rentals.budget
    names = budget.caps()
    assert budget.held_by() == {n: budget.held(n) for n in names}
    assert budget.held_by(["c-1", "day", "unknown"]) == {n: budget.held(n) for n in ("c-1", "day")}
    statuses = budget.status()
    assert [s.name for s in statuses] == sorted(names)
    assert budget.held_of(statuses) == budget.held_by()
    assert budget.status(["c-2", "default"]) == [s for s in statuses if s.name in ("c-2", "default")]
    for s in statuses:  # what is held is the sum of the held reservations, one at a time
        assert s.reserved_usd == pytest.approx(sum(budget.held_usd(rid) or 0.0 for rid in budget.held(s.name)))
    by_name = {s.name: s for s in statuses}
    assert by_name["default"].spent_usd > 0 and by_name["day"].reserved_usd == pytest.approx(2.0)
