"""Beat's price-increase task through a real Celery worker against the fake Vast server over HTTP."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.db import init_db, make_engine
from app.jobs import JobSpec, JobStore, Needs
from app.market import LaunchSpec, OfferQuery
from app.rentals import Rentals
from app.settings import load_settings
from beat_schedule import BEAT_SCHEDULE
from providers.fakes import FakeVast
from providers.vast import VastMarket
from support.services import CeleryWorker, celery_client

REPO = Path(__file__).resolve().parents[3]
SPEC = LaunchSpec(image="img", disk_gb=20, label="", ssh_public_key="ssh-ed25519 AAAA t")
PER_S = 1 / 3600


@pytest.mark.slow
def test_the_beat_task_rejects_above_the_max_price_and_accepts_within(th_env: dict[str, str]) -> None:
    """Two increases on two jobs' hosts: the one above its job's $0.40/h is rejected, the other accepted."""
    assert BEAT_SCHEDULE["price-increases"]["task"] == "tuneharness.maintenance.answer_price_increases"
    with FakeVast(offers=[]) as vast:
        env = {**th_env, "VAST_API_URL": vast.url, "VAST_API_KEY": vast.api_key, "TUNEHARNESS_PROVIDER_BACKOFF_S": "0"}
        engine = make_engine(load_settings(env).db_url)
        init_db(engine)
        rentals, jobs = Rentals(engine), JobStore(engine)
        rentals.budget.set_cap("default", 100.0)
        market = VastMarket(api_key=vast.api_key, api_url=vast.url)
        hosts = {}
        for name, new_dph in (("capped", 0.55), ("roomy", 0.35)):
            job = jobs.add(JobSpec(name=name, train={}, needs=Needs(max_usd_per_hour=0.40)))
            oid = vast.add_offer(dph_total=0.30)
            offer = next(o for o in market.search_offers(OfferQuery(limit=1000)) if o.offer_id == oid)
            plan = rentals.plan(
                job=job,
                attempt=1,
                offer=offer,
                disk_gb=20,
                ttl_s=3600,
                now=1.0,
                reserve_usd=1.0,
                budget_name="default",
                spec=SPEC,
            )
            iid = rentals.execute(plan.id, market=market, now=1.0).instance_id or ""
            vast.raise_price(iid, new_gpu_costpersec=new_dph * PER_S)
            hosts[name] = iid
        worker = CeleryWorker.start(env, cwd=REPO, queues="maintenance", concurrency=1, name="prices")
        try:
            summary = (
                celery_client(env)
                .send_task("tuneharness.maintenance.answer_price_increases", queue="maintenance")
                .get(timeout=120)
            )
        finally:
            worker.stop()
        assert (summary["rejected"], summary["accepted"], summary["errors"]) == (
            [hosts["capped"]],
            [hosts["roomy"]],
            [],
        )
        assert not vast.price_increases
        assert [e.instance for e in rentals.ledger.rows(kind="price_increase_rejected")] == [hosts["capped"]]
        assert [e.instance for e in rentals.ledger.rows(kind="price_increase_accepted")] == [hosts["roomy"]]
