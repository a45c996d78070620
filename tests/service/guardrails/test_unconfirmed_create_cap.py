"""A create whose answer was lost bills unseen: the caps count it and end it at the cap."""

from __future__ import annotations

import pytest

from app.market import CreateUnconfirmed, LaunchSpec, Offer, OfferQuery, ProviderError
from app.rentals import Rentals
from app.services.guardrails import budget_room, sweep_budgets
from providers.sim import SimMarket, VirtualClock

from .conftest import host, make_market

SPEC = LaunchSpec(image="x", disk_gb=10, label="", ssh_public_key="k")


class LostAnswers:
    """The simulated marketplace, whose create answers are lost and whose listings can fail."""

    def __init__(self, inner: SimMarket) -> None:
        self.inner = inner
        self.name = inner.name
        self.listing_fails = 0

    def create(self, offer: Offer, spec: LaunchSpec) -> str:
        self.inner.create(offer, spec)
        raise CreateUnconfirmed("create: read timeout after the request was sent", provider="sim")

    def list_instances(self, label_prefix: str = ""):  # type: ignore[no-untyped-def]
        if self.listing_fails:
            self.listing_fails -= 1
            raise ProviderError("the instance list is incomplete", provider="sim")
        return self.inner.list_instances(label_prefix)

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self.inner, name)


def _plan(rentals: Rentals, clock: VirtualClock, *, job: str, attempt: int, offer: Offer, reserve_usd: float):  # type: ignore[no-untyped-def]
    """Steps 1 and 2 of a create under the job's own cap `job-<job>`: reserve, then write the intent."""
    return rentals.plan(
        job=job,
        attempt=attempt,
        offer=offer,
        disk_gb=10,
        ttl_s=99_999,
        now=clock.now(),
        reserve_usd=reserve_usd,
        budget_name=f"job-{job}",
    )


def _unconfirmed(rentals: Rentals, market: LostAnswers, clock: VirtualClock, *, cap: float) -> str:
    rentals.budget.set_cap("job-u", cap)
    offer = market.inner.search_offers(OfferQuery(limit=0))[0]
    plan = _plan(rentals, clock, job="u", attempt=1, offer=offer, reserve_usd=cap)
    with pytest.raises(CreateUnconfirmed):
        rentals.execute(plan.id, market=market, now=clock.now(), spec=SPEC)  # type: ignore[arg-type]
    market.listing_fails = 1  # the first look-up by its label fails: the next pass looks again
    return plan.id


def test_an_unconfirmed_create_is_ended_within_its_reservation_though_a_look_up_fails(
    rentals: Rentals, clock: VirtualClock
) -> None:
    """The vendor runs an instance we never heard back about; the budget monitor ends it within its reservation."""
    market = LostAnswers(make_market([host(1)], clock))
    rid = _unconfirmed(rentals, market, clock, cap=0.5)
    assert rentals.get(rid).state == "intent"  # type: ignore[union-attr]
    assert [r.id for r in rentals.billing()] == [rid]
    kw = {"rentals": rentals, "markets": {"sim": market}}
    clock.advance(4.2 * 3600)  # $0.101/h: about $0.43 billed unseen, past 80% of the cap
    warn = sweep_budgets(rentals.budget, now=clock.now(), **kw)  # type: ignore[arg-type]
    assert warn.warnings == ["job-u:warning"] and warn.stopped == []
    reports = []
    while (r := rentals.get(rid)) is not None and r.state == "intent":  # the monitor, once a minute
        clock.advance(60)
        reports.append(sweep_budgets(rentals.budget, now=clock.now(), **kw))  # type: ignore[arg-type]
    failed, ended = reports[-2:]
    assert failed.stopped == [] and failed.errors  # the first look-up by label failed
    assert r is not None and r.instance_id is not None and r.state == "destroyed"
    assert ended.stopped == [r.instance_id]
    assert market.inner.status(r.instance_id).state == "gone"
    kinds = [e.kind for e in rentals.ledger.rows(job="u")]
    assert kinds[-3:] == ["instance_created", "instance_destroyed", "budget_settled"]
    status = rentals.budget.status(["job-u"])[0]
    assert status.reserved_usd == 0.0 and status.spent_usd <= status.cap_usd


def test_a_cap_reached_by_other_hosts_ends_an_unconfirmed_create_too(rentals: Rentals, clock: VirtualClock) -> None:
    """A host billing past its own reservation brings the cap; the unconfirmed create under it is ended with it."""
    market = LostAnswers(make_market([host(1), host(2)], clock))
    market.listing_fails = 0
    rentals.budget.set_cap("job-u", 1.0)
    offers = market.inner.search_offers(OfferQuery(limit=0))
    first = _plan(rentals, clock, job="u", attempt=1, offer=offers[0], reserve_usd=0.2)
    a = rentals.execute(first.id, market=market.inner, now=clock.now(), spec=SPEC)
    clock.advance(8 * 3600)
    second = _plan(rentals, clock, job="u", attempt=2, offer=offers[1], reserve_usd=0.3)
    with pytest.raises(CreateUnconfirmed):
        rentals.execute(second.id, market=market, now=clock.now(), spec=SPEC)  # type: ignore[arg-type]
    kw = {"rentals": rentals, "markets": {"sim": market}}
    reports = []
    while (b := rentals.get(second.id)) is not None and b.state == "intent":
        clock.advance(60)
        reports.append(sweep_budgets(rentals.budget, now=clock.now(), **kw))  # type: ignore[arg-type]
    assert reports[-1].warnings == ["job-u:stop"]
    assert b is not None and b.state == "destroyed" and set(reports[-1].stopped) == {a.instance_id, b.instance_id}
    assert rentals.spent_usd(b, now=clock.now()) < 0.3 - 0.05  # well within its own reservation: the cap ended it


def test_an_unconfirmed_create_not_listed_is_looked_for_again(rentals: Rentals, clock: VirtualClock) -> None:
    """At the cap with nothing listed under the label, nothing is stopped and the sweep says why."""
    market = LostAnswers(make_market([host(1)], clock))
    rid = _unconfirmed(rentals, market, clock, cap=0.5)
    market.listing_fails = 0
    for inst in market.inner.list_instances(""):
        market.inner.destroy(inst.instance_id)  # the vendor dropped it on its side
    clock.advance(5 * 3600)
    report = sweep_budgets(rentals.budget, now=clock.now(), rentals=rentals, markets={"sim": market})  # type: ignore[dict-item]
    assert f"job-u:unconfirmed-create-not-listed:{rid}" in report.warnings and report.stopped == []
    assert rentals.get(rid).state == "intent"  # type: ignore[union-attr]


def test_an_unsent_intent_bills_nothing(rentals: Rentals, clock: VirtualClock) -> None:
    """An intent whose create never went out is not counted as billing."""
    market = make_market([host(1)], clock)
    rentals.budget.set_cap("job-n", 0.5)
    offer = market.search_offers(OfferQuery(limit=0))[0]
    _plan(rentals, clock, job="n", attempt=1, offer=offer, reserve_usd=0.5)
    assert rentals.billing() == []
    clock.advance(10 * 3600)
    assert sweep_budgets(rentals.budget, now=clock.now(), rentals=rentals, markets={"sim": market}).warnings == []


def test_a_stopped_host_has_no_room_while_an_unconfirmed_create_bills_under_its_cap(
    rentals: Rentals, clock: VirtualClock
) -> None:
    """Restarting a stopped host counts what an unconfirmed create under the same cap bills."""
    market = LostAnswers(make_market([host(1), host(2)], clock))
    rentals.budget.set_cap("job-u", 1.0)
    offers = market.inner.search_offers(OfferQuery(limit=0))
    first = _plan(rentals, clock, job="u", attempt=1, offer=offers[0], reserve_usd=0.5)
    a = rentals.execute(first.id, market=market.inner, now=clock.now(), spec=SPEC)
    rentals.stop(a.id, market=market.inner, reason="test", kind="instance_stopped", now=clock.now())
    second = _plan(rentals, clock, job="u", attempt=2, offer=offers[1], reserve_usd=0.5)
    with pytest.raises(CreateUnconfirmed):
        rentals.execute(second.id, market=market, now=clock.now(), spec=SPEC)  # type: ignore[arg-type]
    clock.advance(4 * 3600)  # the unconfirmed one: about $0.40 so far
    assert budget_room(rentals.budget, rentals, rentals.get(a.id), now=clock.now())  # type: ignore[arg-type]
    clock.advance(6 * 3600)  # about $1.02: past the cap before this host even restarts
    assert not budget_room(rentals.budget, rentals, rentals.get(a.id), now=clock.now())  # type: ignore[arg-type]
