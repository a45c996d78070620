"""A create whose answer is lost after the vendor acted (a 504, a 502, a dropped connection) rents
once: the rental keeps its intent and reservation and finds the instance by its label; only a clear
refusal abandons. Driven against the fake Vast server on loopback."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.db import init_db, make_engine
from app.market import CreateUnconfirmed, LaunchSpec, MarketError, OfferGone, OfferQuery
from app.rentals import Rentals
from providers import http
from providers.fakes import FakeVast
from providers.http import RetryPolicy
from providers.vast import VastMarket
from support.faultlab import record, rounds

SPEC = LaunchSpec(image="img", disk_gb=10, label="", ssh_public_key="ssh-ed25519 AAAA t")
EMPTY_PAGE = {"success": True, "instances_found": 0, "total_instances": 0, "label_counts": {}, "next_token": None,
              "instances": []}  # fmt: skip


@pytest.fixture
def rentals(tmp_path: Path) -> Rentals:
    engine = make_engine(f"sqlite:///{tmp_path / 'th.db'}")
    init_db(engine)
    r = Rentals(engine)
    r.budget.set_cap("default", 1000.0)
    return r


@pytest.fixture
def vast() -> Iterator[tuple[FakeVast, VastMarket]]:
    http.set_testing(True)
    with FakeVast(offers=[]) as fake:
        market = VastMarket(api_key=fake.api_key, api_url=fake.url, retry=RetryPolicy(attempts=3))
        yield fake, market
        market.close()
    http.set_testing(False)


def _plan(rentals: Rentals, fake: FakeVast, market: VastMarket, attempt: int) -> str:
    oid = fake.add_offer(dph_total=0.30)
    offer = next(o for o in market.search_offers(OfferQuery(limit=1000)) if o.offer_id == oid)
    plan = rentals.plan(
        job="j",
        attempt=attempt,
        offer=offer,
        disk_gb=10,
        ttl_s=3600,
        now=1000.0,
        reserve_usd=1.0,
        budget_name="default",
    )
    return plan.id


def _creates(fake: FakeVast) -> int:
    return len([c for c in fake.calls_to("/api/v0/asks/") if c.method == "PUT"])


@pytest.mark.parametrize("status", [502, 504])
def test_a_lost_answer_is_found_by_label_not_rented_again(
    rentals: Rentals, vast: tuple[FakeVast, VastMarket], status: int
) -> None:
    """The vendor rents, then answers 5xx: the rental stays an intent with its reservation; the next
    try finds the instance by label and adopts it; the vendor saw one create."""
    fake, market = vast
    rid = _plan(rentals, fake, market, 1)
    fake.inject(status, "upstream timed out", method="PUT", match="/asks/", acted=True)
    with pytest.raises(CreateUnconfirmed):
        rentals.execute(rid, market=market, spec=SPEC, now=1001.0)
    intent = rentals.get(rid)
    assert intent is not None and intent.state == "intent" and intent.instance_id is None
    assert rentals.reservations_of(rid), "the reservation is kept while the create is unconfirmed"
    adopted = rentals.execute(rid, market=market, spec=SPEC, now=1020.0)
    assert adopted.state == "active" and adopted.instance_id is not None
    assert [i.instance_id for i in market.list_instances(adopted.label)] == [adopted.instance_id]
    assert _creates(fake) == 1


def test_an_instance_not_listed_yet_is_not_created_again(rentals: Rentals, vast: tuple[FakeVast, VastMarket]) -> None:
    """While the listing lags behind an accepted create, every try says unconfirmed and sends nothing."""
    fake, market = vast
    rid = _plan(rentals, fake, market, 1)
    fake.inject(504, "gateway timeout", method="PUT", match="/asks/", acted=True)
    with pytest.raises(CreateUnconfirmed):
        rentals.execute(rid, market=market, spec=SPEC, now=1001.0)
    fake.inject(200, EMPTY_PAGE, method="GET", match="/api/v1/instances/", times=2)
    for now in (1016.0, 1031.0):
        with pytest.raises(CreateUnconfirmed, match="not listed yet"):
            rentals.execute(rid, market=market, spec=SPEC, now=now)
    assert _creates(fake) == 1
    assert rentals.execute(rid, market=market, spec=SPEC, now=1046.0).state == "active"
    assert rentals.create_sent_at(rid) == 1001.0


@pytest.mark.faults
@pytest.mark.slow
def test_a_hundred_creates_under_faults_rent_at_most_once_each(
    rentals: Rentals, vast: tuple[FakeVast, VastMarket]
) -> None:
    """100 creates, 30% answered 504 after acting and others refused 429/503 (not acted): every
    instance at the vendor is one active rental's, each rental has at most one, none is orphaned."""
    fake, market = vast
    n = rounds(ci=1, full=5)
    outcome: dict[str, str] = {}
    active_per_round: list[int] = []
    for r in range(n):
        rng = random.Random(26 + r)
        mine: list[str] = []
        for attempt in range(100 * r + 1, 100 * r + 101):
            rid = _plan(rentals, fake, market, attempt)
            mine.append(rid)
            roll = rng.random()
            if roll < 0.30:
                fake.inject(rng.choice([502, 504]), "lost", method="PUT", match="/asks/", acted=True)
            elif roll < 0.45:
                fake.inject(rng.choice([429, 503]), "busy", method="PUT", match="/asks/", times=3)
            for step in range(5):
                try:
                    got = rentals.execute(rid, market=market, spec=SPEC, now=2000.0 + attempt * 10 + step)
                    outcome[rid] = f"active:{got.instance_id}"
                    break
                except CreateUnconfirmed:
                    continue
                except (OfferGone, MarketError):
                    rentals.abandon(rid, reason="refused", now=2000.0 + attempt * 10 + step)
                    outcome[rid] = "abandoned"
                    break
        active_per_round.append(sum(1 for rid in mine if outcome.get(rid, "").startswith("active:")))
    listed = market.list_instances("th-")
    by_label: dict[str, int] = {}
    for inst in listed:
        by_label[inst.label or ""] = by_label.get(inst.label or "", 0) + 1
    assert max(by_label.values()) == 1
    active = {v.split(":", 1)[1] for v in outcome.values() if v.startswith("active:")}
    assert {i.instance_id for i in listed} == active
    refused = sum(1 for v in outcome.values() if v == "abandoned")
    assert _creates(fake) == len(active) + 3 * refused  # a refusal not acted on is retried (3 tries), nothing else
    assert all(60 <= k < 100 for k in active_per_round)  # some were refused outright, the lost answers were all adopted
    record(
        "hundred_creates_under_vendor_faults",
        criterion="100 creates with 30% answers lost after acting and 429/5xx refusals: no rental created twice",
        rounds=n,
        creates=100 * n,
        active=len(active),
        refused=refused,
        vendor_creates=_creates(fake),
        duplicate_rentals=sum(k - 1 for k in by_label.values()),
    )


def test_a_stale_intent_with_nothing_listed_releases_its_reservation(
    rentals: Rentals, vast: tuple[FakeVast, VastMarket]
) -> None:
    """An intent an hour old that no step resolved: abandoned if nothing is listed under its label, its
    reservation freed; one whose instance is listed is left for the reconciler to adopt; a young one waits."""
    fake, market = vast
    idle = _plan(rentals, fake, market, 1)  # planned, never sent (its job's task was lost)
    listed = _plan(rentals, fake, market, 2)
    fake.inject(504, "lost", method="PUT", match="/asks/", acted=True)
    with pytest.raises(CreateUnconfirmed):
        rentals.execute(listed, market=market, spec=SPEC, now=1001.0)
    assert rentals.release_stale_intents({"vast": market}, now=1000.0 + 1800, older_than_s=3600) == []
    assert rentals.release_stale_intents({"vast": market}, now=1000.0 + 3601, older_than_s=3600) == [idle]
    assert [r.state for r in (rentals.get(idle), rentals.get(listed))] == ["abandoned", "intent"]  # type: ignore[union-attr]
    assert not set(rentals.reservations_of(idle)) & rentals.budget.held("default")
