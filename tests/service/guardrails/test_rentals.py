"""The create protocol: reserve, intent, create, record; a crashed create never creates twice."""

from __future__ import annotations

import pytest

from app.market import OfferQuery
from app.rentals import DestroyRefused, Rentals, parse_label
from providers.sim import SimMarket, VirtualClock

from .conftest import SPEC, host, make_market, rent


class Crash(Exception):
    """Stands in for a process dying at a step of the create."""


def test_a_create_reserves_labels_and_records_once(rentals: Rentals, clock: VirtualClock) -> None:
    """One create: a reservation, a labelled instance with its kill-time, one ledger event."""
    market = make_market([host(1)], clock)
    r = rent(rentals, market, clock, "job1", ttl_s=7200)
    assert r.state == "active" and r.instance_id
    job, attempt, kill_at = parse_label(market.status(r.instance_id).label) or ("", 0, 0)
    assert (job, attempt, kill_at) == ("job1", 1, int(clock.now() + 7200))
    kinds = [e.kind for e in rentals.ledger.rows(job="job1")]
    assert kinds == ["budget_reserved", "instance_created"]
    again = rentals.execute(r.id, market=market, spec=SPEC, now=clock.now())
    assert again.instance_id == r.instance_id
    assert len(market.list_instances("th-")) == 1


@pytest.mark.parametrize("step", ["after_reservation", "after_provider_accepted", "after_ledger"])
def test_a_create_that_crashes_at_any_step_is_retried_without_a_second_create(
    rentals: Rentals, clock: VirtualClock, step: str
) -> None:
    """Crash at each step, retry: exactly one instance exists and one instance_created event."""
    market = make_market([host(1), host(2)], clock)
    offer = market.search_offers(OfferQuery(limit=0))[0]
    plan = rentals.plan(
        job="j", attempt=1, offer=offer, disk_gb=10, ttl_s=3600, now=clock.now(), reserve_usd=1.0, budget_name="default"
    )

    def crash_at(s: str) -> None:
        if s == step:
            raise Crash(s)

    with pytest.raises(Crash):
        rentals.execute(plan.id, market=market, spec=SPEC, now=clock.now(), fault=crash_at)
    done = rentals.execute(plan.id, market=market, spec=SPEC, now=clock.now())
    (inst,) = market.list_instances("th-")
    # A failure between the provider's accept and the record trips the exit trap: stopped.
    expected = "stopped" if step == "after_provider_accepted" else "active"
    assert done.state == expected and (inst.state == "stopped") == (expected == "stopped")
    assert [e.kind for e in rentals.ledger.rows(job="j")].count("instance_created") == 1
    assert [e.kind for e in rentals.ledger.rows(job="j")].count("budget_reserved") == 1


def test_automation_may_destroy_a_failed_boot_but_not_a_host_that_held_work(
    rentals: Rentals, clock: VirtualClock
) -> None:
    """Destroy by automation works before training started and is refused after."""
    market: SimMarket = make_market([host(1), host(2)], clock)
    dud = rent(rentals, market, clock, "a", machine="m-1")
    assert rentals.destroy(dud.id, market=market, by="automation", reason="boot frozen", now=clock.now())
    assert market.status(dud.instance_id or "").state == "gone"
    worked = rent(rentals, market, clock, "b", machine="m-2")
    rentals.mark_held_work(worked.id)
    with pytest.raises(DestroyRefused, match="only the operator"):
        rentals.destroy(worked.id, market=market, by="automation", reason="lost", now=clock.now())
    assert market.status(worked.instance_id or "").state != "gone"
    assert rentals.destroy(worked.id, market=market, by="operator", reason="operator", now=clock.now())
    destroyed = rentals.ledger.rows(kind="instance_destroyed")
    assert [e.payload["by"] for e in destroyed] == ["automation", "operator"]


def test_destroy_settles_the_reservation_with_what_was_billed(rentals: Rentals, clock: VirtualClock) -> None:
    """After destroy, the budget counts the estimated spend instead of the reservation."""
    market = make_market([host(1)], clock)
    r = rent(rentals, market, clock, "a")
    clock.advance(3600)
    rentals.destroy(r.id, market=market, by="automation", reason="preflight failed", now=clock.now())
    status = {s.name: s for s in rentals.budget.status()}["default"]
    assert status.reserved_usd == 0.0
    assert status.spent_usd == pytest.approx(0.101 + 0.15 * 10 / 720, rel=1e-6)


def test_exit_trap_stops_an_instance_whose_create_could_not_be_recorded(rentals: Rentals, clock: VirtualClock) -> None:
    """A failure after the provider accepted stops the new instance before the error propagates."""
    market = make_market([host(1)], clock)
    offer = market.search_offers(OfferQuery(limit=0))[0]
    plan = rentals.plan(
        job="j",
        attempt=1,
        offer=offer,
        disk_gb=10,
        ttl_s=3600,
        now=clock.now(),
        reserve_usd=1.0,
        budget_name="default",
        spec=SPEC,
    )

    def boom(step: str) -> None:
        if step == "after_provider_accepted":
            raise RuntimeError("database went away")

    with pytest.raises(RuntimeError):
        rentals.execute(plan.id, market=market, now=clock.now(), fault=boom)
    (inst,) = market.list_instances("th-")
    assert inst.state == "stopped"
    assert [e.reason for e in rentals.ledger.rows(kind="instance_stopped")] == [
        "exit trap: create failed before hand-over"
    ]
    # The retry adopts the stopped instance: still one create.
    done = rentals.execute(plan.id, market=market, now=clock.now())
    assert done.instance_id == inst.instance_id and done.state == "stopped"
