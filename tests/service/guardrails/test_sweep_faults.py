"""The money sweeps under faults: one instance's failure is isolated and alerted, a listing taken
while creates are recorded marks nothing lost, a budget stop has a deadline no host can extend,
and a host's lies about its GPU do not keep it running."""

from __future__ import annotations

from typing import Any

import pytest

from app.alerts import InMemoryNotifier
from app.market import Instance, LaunchSpec, OfferQuery, ProviderError
from app.rentals import Rentals
from app.services.guardrails import SweepReport, run_sweep, sweep_budgets, sweep_idle, sweep_reconcile
from providers.sim import SimMarket, VirtualClock

from .conftest import SPEC, host, make_market, rent


class StopFails:
    """The simulated market, except that stopping one chosen instance fails at the vendor."""

    def __init__(self, market: SimMarket, failing: set[str]) -> None:
        self.market, self.failing, self.name = market, failing, "sim"

    def __getattr__(self, item: str) -> Any:
        return getattr(self.market, item)

    def stop(self, instance_id: str) -> None:
        if instance_id in self.failing:
            raise ProviderError("500 internal error on stop", provider="sim")
        self.market.stop(instance_id)


def test_one_failing_stop_does_not_abort_the_idle_sweep_over_the_others(rentals: Rentals, clock: VirtualClock) -> None:
    """Two idle hosts, the first one's stop fails at the vendor: the second is stopped all the same."""
    market = make_market([host(1, hangs_at_s=0), host(2, hangs_at_s=0)], clock)
    first = rent(rentals, market, clock, "a", machine="m-1")
    second = rent(rentals, market, clock, "b", machine="m-2")
    markets: Any = {"sim": StopFails(market, {first.instance_id or ""})}
    report = SweepReport("idle_watchdog")
    for _ in range(8):
        clock.advance(300)
        report = sweep_idle(rentals, markets, now=clock.now(), grace_s=1800)
    assert market.status(second.instance_id or "").state == "stopped"
    assert market.status(first.instance_id or "").state == "running"
    assert any(e.startswith(f"{first.instance_id}: ProviderError") for e in report.errors)


def test_a_sweep_that_reports_errors_or_raises_is_alerted_once_per_hour(clock: VirtualClock) -> None:
    """Errors in a report raise sweep_failed keyed per sweep and hour; a raising sweep is alerted and re-raised."""
    notifier = InMemoryNotifier()
    failing = SweepReport("reaper", errors=["i-1: ProviderError: 500", "i-2: ProviderError: 500"])
    run_sweep("reaper", lambda: failing, notifier=notifier, now=7200.0)
    run_sweep("reaper", lambda: failing, notifier=notifier, now=7200.0 + 1800)
    run_sweep("reaper", lambda: SweepReport("reaper"), notifier=notifier, now=7200.0 + 1900)
    assert notifier.kinds() == ["sweep_failed", "sweep_failed"]
    assert {a.key for a in notifier.alerts} == {"sweep_failed:reaper:2"}  # one per hour once deduplicated
    assert "i-1" in notifier.alerts[0].summary and "1 more" in notifier.alerts[0].summary

    def broken() -> SweepReport:
        raise RuntimeError("database is locked")

    with pytest.raises(RuntimeError):
        run_sweep("reconciler", broken, notifier=notifier, now=7200.0)
    assert notifier.alerts[-1].kind == "sweep_failed" and "database is locked" in notifier.alerts[-1].summary
    assert notifier.alerts[-1].key == "sweep_failed:reconciler:2"


class RecordsDuringListing:
    """A market whose listing is taken first, and a create is recorded before the listing comes back:
    the race between a provisioning task and the reconciler."""

    def __init__(self, market: SimMarket, record: Any) -> None:
        self.market, self.record, self.name = market, record, "sim"

    def __getattr__(self, item: str) -> Any:
        return getattr(self.market, item)

    def list_instances(self, label_prefix: str = "") -> list[Instance]:
        listing = self.market.list_instances(label_prefix)
        self.record()
        return listing


def test_a_create_recorded_while_the_listing_is_taken_is_not_marked_lost(rentals: Rentals, clock: VirtualClock) -> None:
    """A rental accepted between the registry read and the listing is neither lost, settled nor stopped."""
    market = make_market([host(1), host(2)], clock)
    rent(rentals, market, clock, "old", machine="m-1")
    made: list[Any] = []
    wrapper: Any = RecordsDuringListing(market, lambda: made.append(rent(rentals, market, clock, "new", machine="m-2")))
    report = sweep_reconcile(rentals, {"sim": wrapper}, now=clock.now(), orphan_grace_s=240)
    (new,) = made
    assert report.lost == [] and report.stopped == []
    assert rentals.get(new.id).state == "active"  # type: ignore[union-attr]
    assert rentals.ledger.rows(kind="instance_lost") == []
    assert market.status(new.instance_id or "").state != "stopped"


def test_an_intent_recorded_by_its_own_create_during_the_listing_is_not_adopted_and_stopped(
    rentals: Rentals, clock: VirtualClock
) -> None:
    """An old intent whose create records it while the reconciler lists: a healthy host, left running."""
    market = make_market([host(1)], clock)
    offer = market.search_offers(OfferQuery(limit=0))[0]
    plan = rentals.plan(
        job="j", attempt=1, offer=offer, disk_gb=10, ttl_s=3600, now=clock.now(), reserve_usd=1.0, budget_name="default"
    )
    iid = market.create(offer, LaunchSpec(image="x", disk_gb=10, label=plan.label, ssh_public_key="k"))
    clock.advance(300)  # the create call took long: its intent is older than the grace
    wrapper: Any = RecordsDuringListing(market, lambda: rentals._accept(plan, iid, now=clock.now(), adopted=False))
    report = sweep_reconcile(rentals, {"sim": wrapper}, now=clock.now(), orphan_grace_s=240)
    assert report.adopted == [] and report.stopped == []
    assert market.status(iid).state != "stopped"


def test_a_budget_stop_waits_for_a_safe_checkpoint_at_most_its_deadline(rentals: Rentals, clock: VirtualClock) -> None:
    """A host whose checkpoint never becomes safe is stopped anyway once the wait passes its deadline."""
    market = make_market([host(1)], clock)
    rentals.budget.set_cap("job-t", 0.2)
    offer = market.search_offers(OfferQuery(limit=0))[0]
    plan = rentals.plan(
        job="t", attempt=1, offer=offer, disk_gb=10, ttl_s=99_999, now=clock.now(), reserve_usd=0.2, budget_name="job-t"
    )
    r = rentals.execute(plan.id, market=market, now=clock.now(), spec=SPEC)
    rentals.mark_held_work(r.id)
    clock.advance(3 * 3600)  # well past $0.20
    kw: Any = {"rentals": rentals, "markets": {"sim": market}, "checkpoint_safe": lambda job: False}
    first = sweep_budgets(rentals.budget, now=clock.now(), checkpoint_wait_s=900, **kw)
    later = sweep_budgets(rentals.budget, now=clock.now() + 899, checkpoint_wait_s=900, **kw)
    assert first.stopped == later.stopped == [] and market.status(r.instance_id or "").state == "running"
    final = sweep_budgets(rentals.budget, now=clock.now() + 900, checkpoint_wait_s=900, **kw)
    assert final.stopped == [r.instance_id] and "job-t:checkpoint-wait-over:t" in final.warnings
    (waited,) = rentals.ledger.rows(kind="budget_stop_waiting")
    assert waited.payload["since"] == clock.now()
    (stop,) = rentals.ledger.rows(kind="instance_stopped")
    assert stop.payload["checkpoint_wait_over_s"] == 900 and stop.payload["stopped_by"] == "budget"


@pytest.mark.parametrize("printed", [100.0, 150.0, float("nan")])
def test_a_host_printing_any_utilisation_is_idle_when_its_step_stands_still(
    rentals: Rentals, clock: VirtualClock, printed: float
) -> None:
    """A training host whose step has not advanced for the grace is stopped, whatever GPU figure it prints."""
    market = make_market([host(1, hangs_at_s=0)], clock)
    r = rent(rentals, market, clock, "j")
    advanced_at = clock.now()
    for _ in range(8):
        clock.advance(300)
        sweep_idle(
            rentals,
            {"sim": market},
            now=clock.now(),
            grace_s=1800,
            job_phase=lambda job: "training",
            ssh_util=lambda key_job, inst: printed,
            step_advanced_at=lambda rental: advanced_at,
        )
    assert market.status(r.instance_id or "").state == "stopped"
    (stop,) = rentals.ledger.rows(kind="instance_stopped")
    assert "step not advanced" in stop.payload["evidence"]


def test_a_training_host_whose_step_advances_is_not_idle_and_an_impossible_figure_is_unknown(
    rentals: Rentals, clock: VirtualClock
) -> None:
    """Step progress keeps a host running; a utilisation of 150 or NaN is recorded as unknown, not busy."""
    market = make_market([host(1)], clock)
    r = rent(rentals, market, clock, "j")
    for _ in range(8):
        clock.advance(300)
        now = clock.now()
        sweep_idle(
            rentals,
            {"sim": market},
            now=now,
            grace_s=1800,
            ssh_util=lambda key_job, inst: 150.0,
            step_advanced_at=lambda rental, now=now: now - 60,
        )
    assert market.status(r.instance_id or "").state == "running"
    assert rentals.get(r.id).last_gpu_util != 150.0  # type: ignore[union-attr]


def test_the_idle_watchdog_opens_a_handed_over_host_with_the_key_of_the_job_it_was_launched_for(
    rentals: Rentals, clock: VirtualClock
) -> None:
    """A host transferred from job a to job b is read over SSH with a's key (the one on the host)."""
    market = make_market([host(1)], clock)
    r = rent(rentals, market, clock, "a")
    clock.advance(60)
    reservation = rentals.budget.reserve("default", 1.0, job="b", now=clock.now())
    assert rentals.transfer(
        r.id, from_job="a", to_job="b", reservations=[reservation], now=clock.now(), reason="held host adopted"
    )
    assert rentals.get(r.id).job == "b"  # type: ignore[union-attr]
    asked: list[object] = []

    def ssh_util(key_job: object, inst: Instance) -> float:
        asked.append(key_job)
        return 90.0

    clock.advance(300)
    sweep_idle(rentals, {"sim": market}, now=clock.now(), ssh_util=ssh_util)
    assert asked == ["a"]


def test_one_job_that_cannot_be_ended_does_not_stop_the_budget_sweep_over_the_others(
    rentals: Rentals, clock: VirtualClock
) -> None:
    """Two caps over their limit; ending the first job fails: the second is ended, the failure reported."""
    market = make_market([host(1), host(2)], clock)
    for job, machine in (("a", "m-1"), ("b", "m-2")):
        rentals.budget.set_cap(f"job-{job}", 0.2)
        offer = next(o for o in market.search_offers(OfferQuery(limit=0)) if o.machine_id == machine)
        plan = rentals.plan(
            job=job,
            attempt=1,
            offer=offer,
            disk_gb=10,
            ttl_s=99_999,
            now=clock.now(),
            reserve_usd=0.2,
            budget_name=f"job-{job}",
        )
        rentals.execute(plan.id, market=market, now=clock.now(), spec=SPEC)
    clock.advance(3 * 3600)
    ended: list[str] = []

    def end_job(job: str, cap: str, evidence: str) -> bool:
        if job == "a":
            raise RuntimeError("provisioning row locked")
        ended.append(job)
        return True

    report = sweep_budgets(rentals.budget, rentals=rentals, markets={"sim": market}, now=clock.now(), end_job=end_job)
    assert ended == ["b"]
    assert any("RuntimeError: provisioning row locked" in e for e in report.errors)


def test_an_incomplete_vast_listing_marks_nothing_lost_and_stops_nothing(rentals: Rentals, clock: VirtualClock) -> None:
    """Over real HTTP, a Vast listing short of total_instances is refused: the reconciler acts on nothing."""
    from providers import http
    from providers.fakes import FakeVast, sample_vast_offers
    from providers.http import RetryPolicy
    from providers.vast import VastMarket

    http.set_testing(True)
    try:
        with FakeVast(offers=sample_vast_offers()) as fake:
            vast = VastMarket(api_key=fake.api_key, api_url=fake.url, retry=RetryPolicy(attempts=2, timeout_s=5.0))
            try:
                offer = vast.search_offers(OfferQuery())[0]
                plan = rentals.plan(
                    job="j",
                    attempt=1,
                    offer=offer,
                    disk_gb=10,
                    ttl_s=3600,
                    now=clock.now(),
                    reserve_usd=1.0,
                    budget_name="default",
                )
                r = rentals.execute(plan.id, market=vast, spec=SPEC, now=clock.now())
                short = {"success": True, "total_instances": 2, "next_token": None, "instances": []}
                fake.inject(200, short, match="/api/v1/instances/")
                report = sweep_reconcile(rentals, {"vast": vast}, now=clock.now() + 10_000, orphan_grace_s=1)
            finally:
                vast.close()
    finally:
        http.set_testing(False)
    assert report.lost == [] and report.stopped == [] and "listing failed, nothing stopped" in report.errors[0]
    assert rentals.get(r.id).state == "active"  # type: ignore[union-attr]
