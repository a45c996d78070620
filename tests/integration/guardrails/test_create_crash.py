"""kill -9 at each step of a create, through real Celery workers and a real HTTP vendor fake.

Never two creates for one job, and nothing left running that the registry does not know.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from app.db import init_db, make_engine
from app.market import LaunchSpec, OfferQuery
from app.rentals import Rentals
from app.services.guardrails import sweep_reconcile
from app.settings import load_settings
from providers.fakes import FakeVast
from providers.vast import VastMarket
from support.services import CeleryWorker, celery_client, wait_until

REPO = Path(__file__).resolve().parents[3]
SPEC = LaunchSpec(image="tuneharness/trainer:cpu", disk_gb=20, label="", ssh_public_key="ssh-ed25519 AAAA test")
ROUNDS = 10


@pytest.fixture
def vast() -> FakeVast:
    with FakeVast(offers=[]) as fake:
        yield fake  # type: ignore[misc]


def _setup(th_env: dict[str, str], vast: FakeVast, tmp_path: Path) -> tuple[dict[str, str], Rentals, VastMarket]:
    env = {
        **th_env,
        "VAST_API_URL": vast.url,
        "VAST_API_KEY": vast.api_key,
        "TUNEHARNESS_PROVIDER_BACKOFF_S": "0",
        "TUNEHARNESS_CHAOS_DIR": str(tmp_path / "chaos"),
    }
    (tmp_path / "chaos").mkdir()
    engine = make_engine(load_settings(env).db_url)
    init_db(engine)
    rentals = Rentals(engine)
    rentals.budget.set_cap("default", 1000.0)
    return env, rentals, VastMarket(api_key=vast.api_key, api_url=vast.url)


def _plan(rentals: Rentals, market: VastMarket, vast: FakeVast, job: str) -> str:
    oid = vast.add_offer()
    offer = next(o for o in market.search_offers(OfferQuery(limit=1000)) if o.offer_id == oid)
    import time

    return rentals.plan(
        job=job,
        attempt=1,
        offer=offer,
        disk_gb=20,
        ttl_s=3600,
        now=time.time(),
        reserve_usd=1.0,
        budget_name="default",
        spec=SPEC,
    ).id


@pytest.mark.slow
@pytest.mark.parametrize("step", ["after_reservation", "after_provider_accepted", "after_ledger"])
def test_kill_9_at_each_step_of_a_create_never_creates_twice(
    th_env: dict[str, str], vast: FakeVast, tmp_path: Path, step: str
) -> None:
    """The worker process dies at `step` 10 times; each job still ends with exactly one instance."""
    env, rentals, market = _setup(th_env, vast, tmp_path)
    env["TUNEHARNESS_CHAOS_KILL_AT"] = step
    worker = CeleryWorker.start(
        env, cwd=REPO, queues="provision", concurrency=2, name=f"chaos-{step}", app="support.rent_task"
    )
    client = celery_client(env)
    try:
        ids = [_plan(rentals, market, vast, f"job-{step.replace('_', '')}-{i}") for i in range(ROUNDS)]
        for rid in ids:
            client.send_task("tuneharness.provision.rent", args=[rid], queue="provision")
        assert wait_until(
            lambda: all((r := rentals.get(rid)) is not None and r.instance_id for rid in ids), timeout_s=240
        ), worker.log.read_text()[-3000:]
    finally:
        worker.stop()
    kills = list((tmp_path / "chaos").iterdir())
    assert len(kills) == ROUNDS, "every job's worker process was killed once"
    creates = vast.calls_to("/api/v0/asks/")
    assert len(creates) == ROUNDS, [c.path for c in creates]
    for rid in ids:
        r = rentals.get(rid)
        assert r is not None and r.instance_id in vast.instances
        assert len(rentals.ledger.rows(job=r.job, kind="instance_created")) == 1
    # Every instance at the provider is known: one reconcile finds no orphan to stop.
    report = sweep_reconcile(rentals, {"vast": market}, now=1e12, orphan_grace_s=0)
    assert report.stopped == [] and report.adopted == [] and report.lost == []
    assert rentals.ledger.verify().ok


@pytest.mark.slow
def test_a_worker_killed_whole_after_the_provider_accepted_is_caught_by_one_reconcile(
    th_env: dict[str, str], vast: FakeVast, tmp_path: Path
) -> None:
    """SIGKILL to the whole worker between accept and record: the next reconcile stops the instance."""
    env, rentals, market = _setup(th_env, vast, tmp_path)
    env.update(TUNEHARNESS_CHAOS_KILL_AT="after_provider_accepted", TUNEHARNESS_CHAOS_WHOLE_WORKER="1")
    worker = CeleryWorker.start(
        env, cwd=REPO, queues="provision", concurrency=1, name="chaos-whole", app="support.rent_task"
    )
    rid = _plan(rentals, market, vast, "job-whole")
    celery_client(env).send_task("tuneharness.provision.rent", args=[rid], queue="provision")
    assert wait_until(lambda: worker.proc.poll() is not None, timeout_s=120)
    assert len(vast.instances) == 1 and rentals.get(rid).instance_id is None  # type: ignore[union-attr]
    report = sweep_reconcile(rentals, {"vast": market}, now=1e12, orphan_grace_s=240)
    (iid,) = vast.instances
    assert report.adopted == [iid] and report.stopped == [iid]
    assert vast.instances[iid]["intended_status"] == "stopped"
    r = rentals.get(rid)
    assert r is not None and r.instance_id == iid and r.state == "stopped"
    assert [e.reason for e in rentals.ledger.rows(kind="instance_stopped")] == ["crashed create"]
