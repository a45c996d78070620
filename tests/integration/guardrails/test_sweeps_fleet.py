"""The sweeps through real Celery workers over HTTP: racing sweeps stop once; creates respect the budget."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from app.db import init_db, make_engine
from app.errors import BudgetExceeded
from app.market import LaunchSpec, OfferQuery
from app.rentals import Rentals
from app.settings import load_settings
from providers.fakes import FakeVast
from providers.vast import VastMarket
from support.services import CeleryWorker, celery_client, wait_until

REPO = Path(__file__).resolve().parents[3]
SPEC = LaunchSpec(image="img", disk_gb=20, label="", ssh_public_key="ssh-ed25519 AAAA t")


@pytest.fixture
def fleet(th_env: dict[str, str]):  # type: ignore[no-untyped-def]
    with FakeVast(offers=[]) as vast:
        env = {
            **th_env,
            "VAST_API_URL": vast.url,
            "VAST_API_KEY": vast.api_key,
            "TUNEHARNESS_PROVIDER_BACKOFF_S": "0",
            "TUNEHARNESS_IDLE_GRACE_S": "1800",
        }
        engine = make_engine(load_settings(env).db_url)
        init_db(engine)
        rentals = Rentals(engine)
        yield env, vast, rentals, VastMarket(api_key=vast.api_key, api_url=vast.url)


def _offer(vast: FakeVast, market: VastMarket):  # type: ignore[no-untyped-def]
    oid = vast.add_offer()
    return next(o for o in market.search_offers(OfferQuery(limit=1000)) if o.offer_id == oid)


@pytest.mark.slow
def test_two_watchdogs_reapers_and_reconcilers_at_once_stop_each_instance_once(fleet) -> None:  # type: ignore[no-untyped-def]
    """Six sweeps race in separate worker processes over 20 idle, expired instances: 20 stop events."""
    env, vast, rentals, market = fleet
    rentals.budget.set_cap("default", 1000.0)
    long_ago = time.time() - 7200
    for i in range(20):
        plan = rentals.plan(
            job=f"j{i}",
            attempt=1,
            offer=_offer(vast, market),
            disk_gb=20,
            ttl_s=3600,
            now=long_ago,
            reserve_usd=1.0,
            budget_name="default",
            spec=SPEC,
        )
        r = rentals.execute(plan.id, market=market, now=long_ago)
        vast.boot(r.instance_id or "")  # running, GPU at 0%
        rentals.note_utilisation(r.id, gpu_util=0.0, idle_since=long_ago)
    worker = CeleryWorker.start(env, cwd=REPO, queues="maintenance", concurrency=6, name="sweeps")
    try:
        client = celery_client(env)
        names = ["idle_watchdog", "reaper", "reconcile"] * 2
        results = [client.send_task(f"tuneharness.maintenance.{n}", queue="maintenance") for n in names]
        for res in results:
            res.get(timeout=120)
    finally:
        worker.stop()
    stops = rentals.ledger.rows(kind="instance_stopped")
    assert sorted(e.instance or "" for e in stops) == sorted(vast.instances)
    assert all(rec["intended_status"] == "stopped" for rec in vast.instances.values())
    assert rentals.ledger.verify().ok


@pytest.mark.slow
def test_twenty_concurrent_creates_against_a_budget_that_fits_two(fleet) -> None:  # type: ignore[no-untyped-def]
    """Twenty jobs try to rent at once against room for two: two instances exist."""
    env, vast, rentals, market = fleet
    rentals.budget.set_cap("default", 2.5)
    offers = [_offer(vast, market) for _ in range(20)]
    planned: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(20)

    def one(i: int) -> None:
        barrier.wait()
        try:
            p = rentals.plan(
                job=f"c{i}",
                attempt=1,
                offer=offers[i],
                disk_gb=20,
                ttl_s=3600,
                now=time.time(),
                reserve_usd=1.0,
                budget_name="default",
                spec=SPEC,
            )
        except BudgetExceeded:
            return
        with lock:
            planned.append(p.id)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    worker = CeleryWorker.start(
        env, cwd=REPO, queues="provision", concurrency=2, name="creates", app="support.rent_task"
    )
    try:
        client = celery_client(env)
        for res in [client.send_task("tuneharness.provision.rent", args=[p], queue="provision") for p in planned]:
            res.get(timeout=120)
    finally:
        worker.stop()
    assert len(planned) == 2
    assert wait_until(lambda: len(vast.instances) == 2, timeout_s=5)
    assert len(vast.calls_to("/api/v0/asks/")) == 2
