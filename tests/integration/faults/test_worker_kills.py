"""A worker's main process killed, and a task outliving its visibility timeout, through real Celery
workers on a real Redis, a real database and the Vast HTTP fake.

Both end with the task's message delivered twice. The rental protocol (`app.rentals`) must make
the second delivery harmless: exactly one vendor create per rental, the rental recorded once, and
nothing at the vendor that one reconcile would call an orphan. How the redelivery happens, and why
the tests age a message instead of shortening the visibility timeout: support/worker_faults.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from app.services.guardrails import sweep_reconcile
from providers.fakes import FakeVast
from support.faultlab import record, rounds
from support.services import CeleryWorker, celery_client
from support.worker_faults import (
    HOLD_AT_VAR,
    PAIR_VAR,
    Rig,
    age_delivery,
    broker_idle,
    creates_for,
    open_rig,
    plan_rental,
    unacked_task_ids,
    wait_for,
)
from workers.config import VISIBILITY_TIMEOUT_S

REPO = Path(__file__).resolve().parents[3]
APP = "support.worker_faults_task"
TASK = "tuneharness.provision.rent_watched"
STEPS = ("after_reservation", "after_provider_accepted", "after_ledger")

pytestmark = [pytest.mark.faults, pytest.mark.slow]


@pytest.fixture
def vast() -> Iterator[FakeVast]:
    fake = FakeVast(offers=[])
    with fake:
        yield fake


def _worker(rig: Rig, name: str, **env: str) -> CeleryWorker:
    return CeleryWorker.start({**rig.env, **env}, cwd=REPO, queues="provision", concurrency=1, name=name, app=APP)


def _settled(rig: Rig, rental_id: str) -> bool:
    """The rental is recorded, every delivery that started has ended, and no message is pending."""
    rental = rig.rentals.get(rental_id)
    return (
        rental is not None
        and rental.instance_id is not None
        and rig.journal.settled([rental_id])
        and broker_idle(rig.broker_url, ["provision"])
    )


def _assert_created_once(rig: Rig, rental_id: str) -> None:
    rental = rig.rentals.get(rental_id)
    assert rental is not None and rental.state == "active" and rental.instance_id in rig.vast.instances
    assert creates_for(rig, rental_id) == 1, [c.body for c in rig.vast.calls_to("/api/v0/asks/")]
    assert len(rig.rentals.ledger.rows(job=rental.job, kind="instance_created")) == 1


def _assert_no_orphan(rig: Rig) -> None:
    report = sweep_reconcile(rig.rentals, {"vast": rig.market}, now=time.time() + 1e6, orphan_grace_s=0)
    assert report.stopped == [] and report.adopted == [] and report.lost == []
    assert rig.rentals.ledger.verify().ok


@pytest.mark.parametrize("db", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_task_outliving_the_visibility_timeout_is_created_once_by_two_workers(
    th_env: dict[str, str], vast: FakeVast, tmp_path: Path, request: pytest.FixtureRequest, db: str
) -> None:
    """Redis redelivers a task still running on one worker to a second; both go on from the same
    step at once (the claim to create is then decided by the database's lock), and the rental is
    still created exactly once."""
    n = rounds(ci=1, full=10)
    if db == "postgres":
        th_env = {**th_env, "TUNEHARNESS_DB_URL": str(request.getfixturevalue("pg_url"))}
    rig = open_rig(th_env, vast, tmp_path, **{HOLD_AT_VAR: "after_reservation", PAIR_VAR: "1"})
    client = celery_client(rig.env)
    workers = [_worker(rig, "outlive-0")]
    ids, overlaps, redelivery_s = [], [], []
    try:
        for i in range(n):
            first = workers[-1]
            rid = plan_rental(rig, f"job-outlive-{i}")
            ids.append(rid)
            task_id = client.send_task(TASK, args=[rid], queue="provision").id
            wait_for(partial(rig.journal.held, rid), timeout_s=120, what="the first delivery", log=first.log)
            # The first delivery is still running when the visibility timeout passes ...
            assert age_delivery(rig.broker_url, task_id, by_s=VISIBILITY_TIMEOUT_S + 1)
            aged_at = time.time()
            # ... and the next worker to start puts the message back and takes it.
            second = _worker(rig, f"outlive-{i + 1}")
            workers.append(second)
            wait_for(partial(_settled, rig, rid), timeout_s=180, what="both deliveries", log=second.log)
            one, two = rig.journal.deliveries(rid)[:2]
            assert one.pid != two.pid and one.finished_at is not None
            redelivery_s.append(round(two.started_at - aged_at, 2))
            overlaps.append(two.started_at < one.finished_at)
            assert overlaps[-1], "the second delivery started while the first still ran"
            _assert_created_once(rig, rid)
            first.stop()
    finally:
        for worker in workers:
            worker.stop()
    assert unacked_task_ids(rig.broker_url) == set()
    _assert_no_orphan(rig)
    record(
        f"task_outlives_visibility_timeout_{db}",
        criterion="a task redelivered to a second worker while the first still runs it creates its rental once",
        rounds=n,
        rentals=len(ids),
        vendor_creates=sum(creates_for(rig, rid) for rid in ids),
        duplicates=sum(creates_for(rig, rid) - 1 for rid in ids),
        overlapping_deliveries=sum(overlaps),
        orphans_after_reconcile=0,
        restart_to_redelivery_s_max=max(redelivery_s),
    )


def test_a_task_whose_whole_worker_is_killed_is_redelivered_and_creates_once(
    th_env: dict[str, str], vast: FakeVast, tmp_path: Path
) -> None:
    """kill -9 of a worker's whole process group with a create in flight (at each step in turn):
    after the visibility timeout a restarted worker runs the task again, and the rental is created
    and recorded exactly once."""
    n = rounds(ci=3, full=25)
    rig = open_rig(th_env, vast, tmp_path)
    client = celery_client(rig.env)
    worker = _worker(rig, "whole-0", **{HOLD_AT_VAR: STEPS[0]})
    ids, restore_s = [], []
    try:
        for i in range(n):
            rid = plan_rental(rig, f"job-whole-{i}")
            ids.append(rid)
            task_id = client.send_task(TASK, args=[rid], queue="provision").id
            wait_for(partial(rig.journal.held, rid), timeout_s=120, what="the first delivery", log=worker.log)
            worker.kill9()
            # Nothing puts the message back: it waits, unacknowledged, for the visibility timeout.
            assert task_id in unacked_task_ids(rig.broker_url)
            assert age_delivery(rig.broker_url, task_id, by_s=VISIBILITY_TIMEOUT_S + 1)
            aged_at = time.time()
            # The restarted worker (holding the next round's first delivery) redelivers it.
            worker = _worker(rig, f"whole-{i + 1}", **{HOLD_AT_VAR: STEPS[(i + 1) % len(STEPS)]})
            wait_for(partial(_settled, rig, rid), timeout_s=180, what="the redelivery", log=worker.log)
            one, two = rig.journal.deliveries(rid)
            assert one.finished_at is None and two.outcome == "active"
            restore_s.append(round(two.started_at - aged_at, 2))
            _assert_created_once(rig, rid)
    finally:
        worker.stop()
    _assert_no_orphan(rig)
    record(
        "whole_worker_killed_mid_task",
        criterion="a task whose whole worker was killed -9 is redelivered after the visibility timeout "
        "and creates its rental once",
        rounds=n,
        rentals=len(ids),
        vendor_creates=sum(creates_for(rig, rid) for rid in ids),
        duplicates=sum(creates_for(rig, rid) - 1 for rid in ids),
        lost_tasks=sum(1 for rid in ids if (r := rig.rentals.get(rid)) is None or r.instance_id is None),
        orphans_after_reconcile=0,
        visibility_timeout_s=VISIBILITY_TIMEOUT_S,
        restart_to_redelivery_s_max=max(restore_s),
    )
