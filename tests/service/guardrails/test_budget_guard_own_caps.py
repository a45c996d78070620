"""A job's own budget guard (`sweep_budgets(only_job=...)`, run by its monitor chain) reads the
rentals under that job's caps, not the whole fleet: a read of every rental at every poll grows with
the fleet squared."""

from __future__ import annotations

from collections.abc import Collection

from app.alerts import InMemoryNotifier
from app.market import LaunchSpec, OfferQuery
from app.rentals import Rentals
from app.services.guardrails import sweep_budgets
from providers.sim import VirtualClock

from .conftest import host, make_market, rent

SPEC = LaunchSpec(image="x", disk_gb=10, label="", ssh_public_key="k")


def _rent_on_own_cap(rentals: Rentals, market, clock: VirtualClock, job: str, machine: str):  # type: ignore[no-untyped-def]
    rentals.budget.set_cap(f"cap-{job}", 1.0)
    offer = next(o for o in market.search_offers(OfferQuery(limit=0)) if o.machine_id == machine)
    plan = rentals.plan(
        job=job,
        attempt=1,
        offer=offer,
        disk_gb=10,
        ttl_s=99_999,
        now=clock.now(),
        reserve_usd=0.5,
        budget_name=f"cap-{job}",
    )
    return rentals.execute(plan.id, market=market, spec=SPEC, now=clock.now())


def test_a_job_with_its_own_cap_reads_only_its_own_rentals(rentals: Rentals, clock: VirtualClock) -> None:
    """Given 6 jobs each on its own cap, one job's guard looks up that job's rental only, and still
    stops it at its cap while the others run on."""
    market = make_market([host(i) for i in range(6)], clock)
    made = [_rent_on_own_cap(rentals, market, clock, f"j{i}", f"m-{i}") for i in range(6)]
    looked_up: list[str] = []
    real = rentals.reservations_of_many

    def counting(rental_ids: Collection[str]) -> dict[str, list[str]]:
        looked_up.extend(rental_ids)
        return real(rental_ids)

    rentals.reservations_of_many = counting  # type: ignore[method-assign]
    clock.advance(10 * 3600)  # $0.10/h for 10 h: every job past its $1 cap
    report = sweep_budgets(
        rentals.budget,
        notifier=InMemoryNotifier(),
        rentals=rentals,
        markets={"sim": market},
        now=clock.now(),
        only_job="j2",
    )
    assert set(looked_up) == {made[2].id}
    assert report.stopped == [made[2].instance_id]
    assert [market.status(m.instance_id or "").state for m in made].count("running") == 5


def test_a_cap_shared_by_several_jobs_still_counts_every_rental_under_it(rentals: Rentals, clock: VirtualClock) -> None:
    """Given three jobs on one shared $4 cap whose spend together passes it while each alone would
    not, one job's guard counts all three and stops that job's host (and no other job's)."""
    market = make_market([host(i) for i in range(4)], clock)
    rentals.budget.set_cap("default", 4.0)
    shared = [rent(rentals, market, clock, f"s{i}", machine=f"m-{i}") for i in range(3)]
    alone = _rent_on_own_cap(rentals, market, clock, "solo", "m-3")
    clock.advance(14 * 3600)  # about $1.40 each: $4.2 under the shared cap
    report = sweep_budgets(
        rentals.budget,
        notifier=InMemoryNotifier(),
        rentals=rentals,
        markets={"sim": market},
        now=clock.now(),
        only_job="s1",
    )
    assert report.warnings == ["default:stop"]
    assert report.stopped == [shared[1].instance_id]
    assert market.status(alone.instance_id or "").state == "running"
    assert [market.status(r.instance_id or "").state for r in shared].count("running") == 2
