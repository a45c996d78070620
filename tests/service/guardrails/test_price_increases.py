"""The price-increase sweep over the fake Vast server: each pending increase on our instances is
answered against its job's max price, written down, alerted; failures stay per increase."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app.alerts import InMemoryNotifier
from app.jobs import JobSpec, JobStore, Needs
from app.market import LaunchSpec, OfferQuery
from app.rentals import Rental, Rentals
from app.services.price_increases import max_price_from, sweep_price_increases
from providers import http
from providers.fakes import FakeVast
from providers.http import RetryPolicy
from providers.sim import VirtualClock
from providers.vast import VastMarket

from .conftest import host, make_market

SPEC = LaunchSpec(image="img", disk_gb=10, label="", ssh_public_key="ssh-ed25519 AAAA t")
PER_S = 1 / 3600  # $/h -> $/s
MAX = {"cheap": 0.40, "open": None}


@pytest.fixture
def vast() -> Iterator[tuple[FakeVast, VastMarket]]:
    http.set_testing(True)
    with FakeVast(offers=[]) as fake:
        market = VastMarket(api_key=fake.api_key, api_url=fake.url, retry=RetryPolicy(attempts=2))
        yield fake, market
        market.close()
    http.set_testing(False)


def _rent(rentals: Rentals, fake: FakeVast, market: VastMarket, job: str, dph: float, attempt: int = 1) -> Rental:
    oid = fake.add_offer(dph_total=dph)
    offer = next(o for o in market.search_offers(OfferQuery(limit=1000)) if o.offer_id == oid)
    plan = rentals.plan(
        job=job,
        attempt=attempt,
        offer=offer,
        disk_gb=10,
        ttl_s=3600,
        now=1000.0,
        reserve_usd=1.0,
        budget_name="default",
    )
    rental = rentals.execute(plan.id, market=market, spec=SPEC, now=1000.0)
    assert rental.instance_id is not None
    return rental


def test_an_increase_above_the_max_price_is_rejected_and_one_within_accepted(
    rentals: Rentals, vast: tuple[FakeVast, VastMarket], notifier: InMemoryNotifier
) -> None:
    """$0.50/h against a $0.40/h max is rejected; $0.35/h is accepted; both on the ledger with an alert."""
    fake, market = vast
    over = _rent(rentals, fake, market, "cheap", 0.30)
    within = _rent(rentals, fake, market, "cheap", 0.30, attempt=2)
    p_over = fake.raise_price(over.instance_id or "", new_gpu_costpersec=0.50 * PER_S)
    p_within = fake.raise_price(within.instance_id or "", new_gpu_costpersec=0.35 * PER_S)
    report = sweep_price_increases(rentals, {"vast": market}, max_price_of=MAX.get, notifier=notifier)
    assert (report.rejected, report.accepted, report.errors) == ([over.instance_id], [within.instance_id], [])
    assert sorted(fake.answered_increases) == sorted([(p_over, "reject"), (p_within, "accept")])
    rejected = rentals.ledger.rows(kind="price_increase_rejected")
    accepted = rentals.ledger.rows(kind="price_increase_accepted")
    assert [(e.job, e.instance, e.provider) for e in rejected] == [("cheap", over.instance_id, "vast")]
    assert rejected[0].rate_usd_per_hour == pytest.approx(0.50) and "above the job's max price" in rejected[0].reason
    assert accepted[0].rate_usd_per_hour == pytest.approx(0.35) and accepted[0].instance == within.instance_id
    assert notifier.kinds() == ["price_increase", "price_increase"]
    assert rentals.ledger.verify().ok
    # the accepted rate is what the budget monitor bills from now on; the rejected one keeps its rate
    after_within, after_over = rentals.get(within.id), rentals.get(over.id)
    assert after_within is not None and after_within.rate_usd_per_hour == pytest.approx(0.35)
    assert after_over is not None and after_over.rate_usd_per_hour == over.rate_usd_per_hour
    assert rentals.spent_usd(after_within, now=4600.0) > rentals.spent_usd(within, now=4600.0)


def test_a_job_without_a_max_price_accepts(rentals: Rentals, vast: tuple[FakeVast, VastMarket]) -> None:
    """No max price in the job file: the increase is accepted and written down."""
    fake, market = vast
    r = _rent(rentals, fake, market, "open", 0.30)
    fake.raise_price(r.instance_id or "", new_gpu_costpersec=2.0 * PER_S)
    report = sweep_price_increases(rentals, {"vast": market}, max_price_of=MAX.get)
    assert report.accepted == [r.instance_id]
    assert "no max price" in rentals.ledger.rows(kind="price_increase_accepted")[0].reason


def test_one_failing_answer_does_not_stop_the_others(rentals: Rentals, vast: tuple[FakeVast, VastMarket]) -> None:
    """A 500 on one answer leaves it pending and an error; the next increase is still answered."""
    fake, market = vast
    first = _rent(rentals, fake, market, "cheap", 0.30)
    second = _rent(rentals, fake, market, "cheap", 0.30)
    fake.raise_price(first.instance_id or "", new_gpu_costpersec=0.9 * PER_S)
    p2 = fake.raise_price(second.instance_id or "", new_gpu_costpersec=0.9 * PER_S)
    fake.inject(500, "Internal Server Error", match="reject-price-increase")  # the first answer fails
    report = sweep_price_increases(rentals, {"vast": market}, max_price_of=MAX.get)
    assert report.rejected == [second.instance_id] and len(report.errors) == 1
    assert first.instance_id in report.errors[0]
    assert fake.answered_increases == [(p2, "reject")] and len(fake.price_increases) == 1
    again = sweep_price_increases(rentals, {"vast": market}, max_price_of=MAX.get)
    assert again.rejected == [first.instance_id] and not fake.price_increases


def test_a_rerun_after_the_answer_writes_nothing_twice(rentals: Rentals, vast: tuple[FakeVast, VastMarket]) -> None:
    """Answered increases leave the pending list: a second sweep has nothing to do."""
    fake, market = vast
    r = _rent(rentals, fake, market, "cheap", 0.30)
    fake.raise_price(r.instance_id or "", new_gpu_costpersec=0.9 * PER_S)
    sweep_price_increases(rentals, {"vast": market}, max_price_of=MAX.get)
    second = sweep_price_increases(rentals, {"vast": market}, max_price_of=MAX.get)
    assert second.examined == 0 and len(rentals.ledger.rows(kind="price_increase_rejected")) == 1


def test_an_increase_on_an_instance_we_do_not_rent_is_left_alone(
    rentals: Rentals, vast: tuple[FakeVast, VastMarket]
) -> None:
    """Someone else's instance on the account: not answered, not written down."""
    fake, market = vast
    stranger = fake.add_instance(label="not-ours", dph_total=0.2)
    fake.raise_price(stranger, new_gpu_costpersec=0.9 * PER_S)
    report = sweep_price_increases(rentals, {"vast": market}, max_price_of=MAX.get)
    assert report.not_ours == [stranger] and fake.answered_increases == []
    assert rentals.ledger.rows(kind="price_increase_rejected") == []


def test_markets_without_price_increases_have_none(rentals: Rentals, clock: VirtualClock) -> None:
    """The simulated marketplace answers no pending increases: the sweep examines nothing."""
    market = make_market([host(1)], clock)
    assert sweep_price_increases(rentals, {"sim": market}, max_price_of=MAX.get).examined == 0


def test_a_reading_failure_is_an_error_not_a_crash(rentals: Rentals, vast: tuple[FakeVast, VastMarket]) -> None:
    """A vendor that cannot list its pending increases is reported; other markets still sweep."""
    fake, market = vast
    fake.inject(401, {"success": False, "error": "auth_error", "msg": "bad key"}, match="pending-price-increases")
    report = sweep_price_increases(rentals, {"vast": market}, max_price_of=MAX.get)
    assert report.examined == 0 and "reading pending price increases failed" in report.errors[0]


def test_the_max_price_is_read_from_the_stored_job_file(rentals: Rentals) -> None:
    """max_price_from reads needs.max_usd_per_hour of the job as stored; an unknown job has none."""
    jobs = JobStore(rentals.engine)
    jid = jobs.add(JobSpec(name="capped", train={}, needs=Needs(max_usd_per_hour=0.45)))
    max_price = max_price_from(jobs)
    assert max_price(jid) == pytest.approx(0.45) and max_price("no-such-job") is None
