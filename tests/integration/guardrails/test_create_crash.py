"""kill -9 at each step of a create, through real Celery workers and a real HTTP vendor fake.

Never two creates for one job, and nothing left running that the registry does not know.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.services.guardrails import sweep_reconcile
from providers.fakes import FakeVast
from support.faultlab import record, rounds
from support.services import CeleryWorker, celery_client, wait_until
from support.worker_faults import Rig, creates_for, open_rig, plan_rental

REPO = Path(__file__).resolve().parents[3]

pytestmark = [pytest.mark.faults, pytest.mark.slow]


@pytest.fixture
def vast() -> Iterator[FakeVast]:
    fake = FakeVast(offers=[])
    with fake:
        yield fake


def _rig(th_env: dict[str, str], vast: FakeVast, tmp_path: Path, **extra: str) -> Rig:
    (tmp_path / "chaos").mkdir()
    return open_rig(th_env, vast, tmp_path, TUNEHARNESS_CHAOS_DIR=str(tmp_path / "chaos"), **extra)


@pytest.mark.parametrize("step", ["after_reservation", "after_provider_accepted", "after_ledger"])
def test_kill_9_at_each_step_of_a_create_never_creates_twice(
    th_env: dict[str, str], vast: FakeVast, tmp_path: Path, step: str
) -> None:
    """The worker process dies at `step` once per job; each job still ends with exactly one instance."""
    n = rounds(ci=3, full=25)
    rig = _rig(th_env, vast, tmp_path, TUNEHARNESS_CHAOS_KILL_AT=step)
    worker = CeleryWorker.start(
        rig.env, cwd=REPO, queues="provision", concurrency=2, name=f"chaos-{step}", app="support.rent_task"
    )
    client = celery_client(rig.env)
    started = time.monotonic()
    try:
        ids = [plan_rental(rig, f"job-{step.replace('_', '')}-{i}") for i in range(n)]
        for rid in ids:
            client.send_task("tuneharness.provision.rent", args=[rid], queue="provision")
        assert wait_until(
            lambda: all((r := rig.rentals.get(rid)) is not None and r.instance_id for rid in ids), timeout_s=240
        ), worker.log.read_text()[-3000:]
        seconds = time.monotonic() - started
    finally:
        worker.stop()
    kills = list((tmp_path / "chaos").iterdir())
    assert len(kills) == n, "every job's worker process was killed once"
    creates = {rid: creates_for(rig, rid) for rid in ids}
    assert creates == dict.fromkeys(ids, 1), creates
    for rid in ids:
        r = rig.rentals.get(rid)
        assert r is not None and r.instance_id in vast.instances
        assert len(rig.rentals.ledger.rows(job=r.job, kind="instance_created")) == 1
    # Killed before the record, a job's redelivery records it: from the kill to the redelivery's start.
    redelivery_s = [
        r.accepted_at - (tmp_path / "chaos" / f"{rid.replace(':', '_')}.{step}").stat().st_mtime
        for rid in ids
        if step != "after_ledger" and (r := rig.rentals.get(rid)) is not None and r.accepted_at is not None
    ]
    # Every instance at the provider is known: one reconcile finds no orphan to stop.
    report = sweep_reconcile(rig.rentals, {"vast": rig.market}, now=1e12, orphan_grace_s=0)
    assert report.stopped == [] and report.adopted == [] and report.lost == []
    assert rig.rentals.ledger.verify().ok
    record(
        f"kill_9_{step}",
        criterion=f"a worker child killed -9 {step.replace('_', ' ')} of each create: one vendor create per rental, "
        "no orphan after one reconcile",
        rounds=n,
        kills=len(kills),
        rentals=len(ids),
        vendor_creates=sum(creates.values()),
        duplicates=sum(k - 1 for k in creates.values()),
        orphans_after_reconcile=len(report.stopped),
        seconds_to_all_recorded=round(seconds, 1),
        kill_to_redelivery_s_max=round(max(redelivery_s), 2) if redelivery_s else None,
    )


def _killed_whole(rig: Rig, client: Any, job: str) -> str:
    """One create whose whole worker is killed after the vendor accepted it; the rental's id."""
    worker = CeleryWorker.start(
        rig.env, cwd=REPO, queues="provision", concurrency=1, name=f"chaos-{job}", app="support.rent_task"
    )
    try:
        rid = plan_rental(rig, job)
        client.send_task("tuneharness.provision.rent", args=[rid], queue="provision")
        assert wait_until(lambda: worker.proc.poll() is not None, timeout_s=120), worker.log.read_text()[-3000:]
    finally:
        worker.stop()
    rental = rig.rentals.get(rid)
    assert creates_for(rig, rid) == 1 and rental is not None and rental.instance_id is None
    return rid


def test_a_worker_killed_whole_after_the_provider_accepted_is_caught_by_one_reconcile(
    th_env: dict[str, str], vast: FakeVast, tmp_path: Path
) -> None:
    """SIGKILL to the whole worker between accept and record: the next reconcile stops the instance."""
    n = rounds(ci=1, full=10)
    rig = _rig(
        th_env, vast, tmp_path, TUNEHARNESS_CHAOS_KILL_AT="after_provider_accepted", TUNEHARNESS_CHAOS_WHOLE_WORKER="1"
    )
    client = celery_client(rig.env)
    ids = [_killed_whole(rig, client, f"job-whole-{i}") for i in range(n)]
    report = sweep_reconcile(rig.rentals, {"vast": rig.market}, now=1e12, orphan_grace_s=240)
    instances = sorted(rig.vast.instances)
    assert len(instances) == n
    assert sorted(report.adopted) == instances and sorted(report.stopped) == instances
    assert all(rig.vast.instances[iid]["intended_status"] == "stopped" for iid in instances)
    for rid in ids:
        r = rig.rentals.get(rid)
        assert r is not None and r.instance_id in instances and r.state == "stopped"
    assert [e.reason for e in rig.rentals.ledger.rows(kind="instance_stopped")] == ["crashed create"] * n
    record(
        "whole_worker_killed_after_provider_accepted",
        criterion="a whole worker killed -9 between the vendor's accept and the record: one reconcile adopts "
        "and stops each instance",
        rounds=n,
        rentals=len(ids),
        vendor_creates=sum(creates_for(rig, rid) for rid in ids),
        adopted_by_reconcile=len(report.adopted),
        stopped_by_reconcile=len(report.stopped),
        orphans_after_reconcile=len(set(instances) - set(report.stopped)),
    )
