"""Idle watchdog, reaper, reconciler and budget monitor decide from observations and only stop."""

from __future__ import annotations

import threading

import pytest

from app.alerts import InMemoryNotifier
from app.errors import BudgetExceeded
from app.market import LaunchSpec, OfferQuery
from app.rentals import Rentals, label_for
from app.services.guardrails import sweep_budgets, sweep_idle, sweep_reconcile, sweep_ttl
from providers.sim import VirtualClock

from .conftest import host, make_market, rent


def test_a_hung_trainer_is_stopped_after_the_grace_and_a_busy_one_is_not(
    rentals: Rentals, clock: VirtualClock, notifier: InMemoryNotifier
) -> None:
    """GPU at 0% past the grace: stopped, with an alert; a busy GPU keeps running."""
    market = make_market([host(1, hangs_at_s=100), host(2)], clock)
    hung = rent(rentals, market, clock, "hung", machine="m-1")
    busy = rent(rentals, market, clock, "busy", machine="m-2")
    markets = {"sim": market}
    for _ in range(8):  # a sweep every 5 minutes for 40 minutes
        clock.advance(300)
        sweep_idle(rentals, markets, now=clock.now(), notifier=notifier, grace_s=1800)
    assert market.status(hung.instance_id or "").state == "stopped"
    assert market.status(busy.instance_id or "").state == "running"
    stops = rentals.ledger.rows(kind="instance_stopped")
    assert [(e.instance, e.reason) for e in stops] == [(hung.instance_id, "idle")]
    assert notifier.kinds() == ["idle_stopped"]
    # Idle from t=300 (first 0% sample) -> stopped at the first sweep past the grace: <= grace + interval.
    stopped_at = rentals.get(hung.id).stopped_at  # type: ignore[union-attr]
    assert stopped_at is not None and stopped_at - (hung.created_at + 100) <= 1800 + 300


def test_a_job_between_slices_is_not_idle(rentals: Rentals, clock: VirtualClock) -> None:
    """Busy-without-GPU phases never count as idle."""
    market = make_market([host(1, hangs_at_s=0)], clock)
    r = rent(rentals, market, clock, "j")
    for _ in range(10):
        clock.advance(300)
        sweep_idle(rentals, {"sim": market}, now=clock.now(), grace_s=1800, job_phase=lambda job: "between_slices")
    assert market.status(r.instance_id or "").state == "running"


def test_the_reaper_stops_what_is_past_its_kill_time(
    rentals: Rentals, clock: VirtualClock, notifier: InMemoryNotifier
) -> None:
    """An instance past its TTL is stopped once, with a ttl_stopped alert."""
    market = make_market([host(1), host(2)], clock)
    short = rent(rentals, market, clock, "short", machine="m-1", ttl_s=600)
    long = rent(rentals, market, clock, "long", machine="m-2", ttl_s=7200)
    clock.advance(601)
    sweep_ttl(rentals, {"sim": market}, now=clock.now(), notifier=notifier)
    sweep_ttl(rentals, {"sim": market}, now=clock.now(), notifier=notifier)
    assert market.status(short.instance_id or "").state == "stopped"
    assert market.status(long.instance_id or "").state == "running"
    assert len(rentals.ledger.rows(kind="instance_stopped")) == 1
    assert notifier.kinds() == ["ttl_stopped"]


def test_the_reconciler_stops_an_orphan_after_the_grace_and_marks_vanished_hosts_lost(
    rentals: Rentals, clock: VirtualClock, notifier: InMemoryNotifier
) -> None:
    """A labelled instance unknown to the ledger is stopped after the grace; a vanished one is lost."""
    market = make_market([host(1), host(2, dies_at_s=50), host(3)], clock)
    offers = {o.machine_id: o for o in market.search_offers(OfferQuery(limit=0))}
    # An orphan: created with our label by a process that died before writing anything.
    orphan = market.create(
        offers["m-1"],
        LaunchSpec(image="x", disk_gb=10, label=label_for("ghost", 1, clock.now() + 9999), ssh_public_key="k"),
    )
    foreign = market.create(offers["m-3"], LaunchSpec(image="x", disk_gb=10, label="someone-else", ssh_public_key="k"))
    doomed = rent(rentals, market, clock, "doomed", machine="m-2")
    markets = {"sim": market}
    sweep_reconcile(rentals, markets, now=clock.now(), orphan_grace_s=240, notifier=notifier)
    assert market.status(orphan).state != "stopped"  # within the grace: could be a create in flight
    clock.advance(241)
    report = sweep_reconcile(rentals, markets, now=clock.now(), orphan_grace_s=240, notifier=notifier)
    assert report.stopped == [orphan] and report.lost == [doomed.instance_id]
    assert market.status(orphan).state == "stopped"
    assert market.status(foreign).state == "running"  # not ours: never touched
    assert rentals.get(doomed.id).state == "lost"  # type: ignore[union-attr]
    sweep_reconcile(rentals, markets, now=clock.now() + 1, orphan_grace_s=240, notifier=notifier)
    assert len(rentals.ledger.rows(kind="instance_stopped")) == 1
    assert len(rentals.ledger.rows(kind="instance_lost")) == 1
    assert "orphan_stopped" in notifier.kinds()


def test_a_failed_listing_stops_nothing(rentals: Rentals, clock: VirtualClock) -> None:
    """When the provider's listing fails, the reconciler decides nothing."""
    from app.market import ProviderBusy

    market = make_market([host(1)], clock)
    rent(rentals, market, clock, "j")

    class Flaky:
        name = "sim"

        def __getattr__(self, item: str):  # type: ignore[no-untyped-def]
            return getattr(market, item)

        def list_instances(self, label_prefix: str = ""):  # type: ignore[no-untyped-def]
            raise ProviderBusy("429 API requests too frequent", provider="sim")

    report = sweep_reconcile(rentals, {"sim": Flaky()}, now=clock.now() + 10_000, orphan_grace_s=1)  # type: ignore[dict-item]
    assert report.errors and not report.lost and not report.stopped
    assert rentals.ledger.rows(kind="instance_lost") == []


def test_a_crashed_create_is_adopted_by_the_reconciler(rentals: Rentals, clock: VirtualClock) -> None:
    """An intent without an id plus an instance with its label: the reconciler records it."""
    market = make_market([host(1)], clock)
    offer = market.search_offers(OfferQuery(limit=0))[0]
    plan = rentals.plan(
        job="j", attempt=1, offer=offer, disk_gb=10, ttl_s=3600, now=clock.now(), reserve_usd=1.0, budget_name="default"
    )
    iid = market.create(offer, LaunchSpec(image="x", disk_gb=10, label=plan.label, ssh_public_key="k"))
    early = sweep_reconcile(rentals, {"sim": market}, now=clock.now() + 10, orphan_grace_s=240)
    assert early.adopted == [] and early.stopped == []  # its own create may still record it
    report = sweep_reconcile(rentals, {"sim": market}, now=clock.now() + 241, orphan_grace_s=240)
    assert report.adopted == [iid] and report.stopped == [iid]
    adopted = rentals.get(plan.id)
    assert adopted is not None and adopted.instance_id == iid and adopted.state == "stopped"
    assert market.status(iid).state == "stopped"


def test_two_of_each_sweep_at_once_over_twenty_instances_stop_each_once(rentals: Rentals, clock: VirtualClock) -> None:
    """Two watchdogs, two reapers and two reconcilers racing: one stop event per instance."""
    market = make_market([host(i, hangs_at_s=0) for i in range(20)], clock)
    for i in range(20):
        rent(rentals, market, clock, f"j{i}", machine=f"m-{i}", ttl_s=600 if i % 2 else 99_999)
    markets = {"sim": market}
    # Odd instances are past their TTL; all are idle past the grace.
    clock.advance(700)
    for r in rentals.all(states=("active",)):
        rentals.note_utilisation(r.id, gpu_util=0.0, idle_since=clock.now() - 3600)
    now = clock.now()
    sweeps = [
        lambda: sweep_idle(rentals, markets, now=now, grace_s=1800),
        lambda: sweep_idle(rentals, markets, now=now, grace_s=1800),
        lambda: sweep_ttl(rentals, markets, now=now),
        lambda: sweep_ttl(rentals, markets, now=now),
        lambda: sweep_reconcile(rentals, markets, now=now, orphan_grace_s=240),
        lambda: sweep_reconcile(rentals, markets, now=now, orphan_grace_s=240),
    ]
    barrier = threading.Barrier(len(sweeps))
    errors: list[BaseException] = []

    def run(fn):  # type: ignore[no-untyped-def]
        barrier.wait()
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(fn,)) for fn in sweeps]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    stops = rentals.ledger.rows(kind="instance_stopped")
    assert sorted(e.instance or "" for e in stops) == sorted(r.instance_id or "" for r in rentals.all())
    assert all(market.status(r.instance_id or "").state == "stopped" for r in rentals.all())


def test_budget_monitor_counts_billing_not_reservations_and_stops_at_the_cap(
    rentals: Rentals, clock: VirtualClock, notifier: InMemoryNotifier
) -> None:
    """A full reservation is not spend; billing past 80% warns; at 100% the job's instance stops."""
    market = make_market([host(1), host(2)], clock)
    rentals.budget.set_cap("job-a", 1.0)
    offers = {o.machine_id: o for o in market.search_offers(OfferQuery(limit=0))}
    plan = rentals.plan(
        job="a",
        attempt=1,
        offer=offers["m-1"],
        disk_gb=10,
        ttl_s=99_999,
        now=clock.now(),
        reserve_usd=1.0,
        budget_name="job-a",
    )
    a = rentals.execute(
        plan.id, market=market, now=clock.now(), spec=LaunchSpec(image="x", disk_gb=10, label="", ssh_public_key="k")
    )
    other = rent(rentals, market, clock, "b", machine="m-2")  # on the default budget: unaffected
    markets = {"sim": market}
    assert (
        sweep_budgets(rentals.budget, notifier=notifier, rentals=rentals, markets=markets, now=clock.now()).warnings
        == []
    )
    clock.advance(8.5 * 3600)  # $0.101/h: about $0.86 billed
    report = sweep_budgets(rentals.budget, notifier=notifier, rentals=rentals, markets=markets, now=clock.now())
    assert report.warnings == ["job-a:warning"] and report.stopped == []
    clock.advance(1.5 * 3600)  # past $1.00
    report = sweep_budgets(rentals.budget, notifier=notifier, rentals=rentals, markets=markets, now=clock.now())
    assert report.warnings == ["job-a:stop"] and report.stopped == [a.instance_id]
    assert market.status(a.instance_id or "").state == "stopped"
    assert market.status(other.instance_id or "").state == "running"
    assert notifier.kinds() == ["budget_warning", "budget_stop"]
    with pytest.raises(BudgetExceeded, match="job-a"):
        rentals.plan(
            job="a",
            attempt=2,
            offer=offers["m-1"],
            disk_gb=10,
            ttl_s=60,
            now=clock.now(),
            reserve_usd=0.01,
            budget_name="job-a",
        )


def test_receipt_splits_spend_and_names_dead_hosts_and_idle_time(rentals: Rentals, clock: VirtualClock) -> None:
    """A destroyed dud counts as dead-host cost; an idle stop counts idle seconds; a stopped one bills storage."""
    from app.services.receipts import build_receipt

    market = make_market([host(1, computes=False), host(2, hangs_at_s=0)], clock)
    dud = rent(rentals, market, clock, "a", machine="m-1")
    worker = rent(rentals, market, clock, "b", machine="m-2")
    rentals.mark_held_work(worker.id)
    clock.advance(600)
    rentals.destroy(dud.id, market=market, by="automation", reason="no_compute", now=clock.now())
    for _ in range(7):
        clock.advance(300)
        sweep_idle(rentals, {"sim": market}, now=clock.now(), grace_s=1800)
    data = build_receipt(rentals, rentals.ledger, now=clock.now()).as_dict()
    assert data["dead_hosts"] == 1
    assert data["dead_host_cost_usd"] == round(0.101 * 600 / 3600 + 0.15 * 10 / 720 * 600 / 3600, 6)
    assert data["by_reason"].keys() == {"no_compute", "idle"}
    assert 1800 <= data["idle_seconds_billed"] <= 2100
    assert data["stopped"] == [worker.instance_id] and data["running"] == []
    assert data["billing_per_hour_now"] == round(0.15 * 10 / 720, 6)


def test_a_budget_stop_waits_until_the_latest_checkpoint_is_safe(rentals: Rentals, clock: VirtualClock) -> None:
    """At the cap, a training host is stopped only once its newest checkpoint has been pulled."""
    market = make_market([host(1)], clock)
    rentals.budget.set_cap("job-t", 0.2)
    offer = market.search_offers(OfferQuery(limit=0))[0]
    plan = rentals.plan(
        job="t", attempt=1, offer=offer, disk_gb=10, ttl_s=99_999, now=clock.now(), reserve_usd=0.2, budget_name="job-t"
    )
    r = rentals.execute(
        plan.id, market=market, now=clock.now(), spec=LaunchSpec(image="x", disk_gb=10, label="", ssh_public_key="k")
    )
    rentals.mark_held_work(r.id)
    clock.advance(3 * 3600)  # well past $0.20
    safe = {"t": False}
    kw = {"rentals": rentals, "markets": {"sim": market}, "checkpoint_safe": lambda job: safe[job]}
    first = sweep_budgets(rentals.budget, now=clock.now(), **kw)  # type: ignore[arg-type]
    assert first.stopped == [] and "job-t:stop-waits-for-checkpoint:t" in first.warnings
    assert market.status(r.instance_id or "").state == "running"
    safe["t"] = True  # the supervisor pulled the newest checkpoint
    second = sweep_budgets(rentals.budget, now=clock.now() + 60, **kw)  # type: ignore[arg-type]
    assert second.stopped == [r.instance_id]


def test_checkpoint_safe_compares_what_the_host_wrote_with_what_was_pulled(rentals: Rentals) -> None:
    """Safe when nothing trains, or when the pulled step reached the host's newest checkpoint."""
    from app.services.supervisor import SupervisionRow, Watch, checkpoint_safe

    table = SupervisionRow.__table__  # type: ignore[attr-defined]
    assert checkpoint_safe(rentals.engine, "nobody")
    with rentals.engine.begin() as conn:
        conn.execute(
            table.insert().values(
                job_id="j", seq=1, updated_at=0.0, state_json=Watch(pulled_step=20, host_checkpoint_step=30).to_json()
            )
        )
    assert not checkpoint_safe(rentals.engine, "j")
    with rentals.engine.begin() as conn:
        conn.execute(
            table.update()
            .where(table.c.job_id == "j")
            .values(state_json=Watch(pulled_step=30, host_checkpoint_step=30).to_json())
        )
    assert checkpoint_safe(rentals.engine, "j")
