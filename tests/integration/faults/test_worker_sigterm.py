"""SIGTERM to a worker with creates in flight, through real Celery workers on a real Redis, a real
database and the Vast HTTP fake.

Two ways a worker is told to stop. To its main process (`docker stop`, `kill PID`): a warm
shutdown, which lets the running tasks finish and leaves the tasks it never started in the queue.
To its whole process group (a terminal's or a service manager's stop): the pool's children reset
SIGTERM to its default and die mid-task, and the main process puts their messages back
(`task_reject_on_worker_lost`). Either way each task must complete exactly once: one vendor create
and one recorded rental per task, and nothing that one reconcile would call an orphan.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from app.services.guardrails import sweep_reconcile
from providers.fakes import FakeVast
from support.faultlab import record, rounds
from support.services import CeleryWorker, celery_client
from support.worker_faults import HOLD_AT_VAR, Rig, broker_idle, creates_for, open_rig, plan_rental, wait_for

REPO = Path(__file__).resolve().parents[3]
APP = "support.worker_faults_task"
TASK = "tuneharness.provision.rent_watched"
STEPS = ("after_reservation", "after_provider_accepted", "after_ledger")
CONCURRENCY = 2
TASKS_PER_ROUND = 4  # two in flight on the stopped worker, two still queued behind them

pytestmark = [pytest.mark.faults, pytest.mark.slow]


@pytest.fixture
def vast() -> Iterator[FakeVast]:
    fake = FakeVast(offers=[])
    with fake:
        yield fake


def _worker(rig: Rig, name: str, **env: str) -> CeleryWorker:
    return CeleryWorker.start(
        {**rig.env, **env}, cwd=REPO, queues="provision", concurrency=CONCURRENCY, name=name, app=APP
    )


def _settled(rig: Rig, ids: list[str]) -> bool:
    return (
        all((r := rig.rentals.get(rid)) is not None and r.instance_id is not None for rid in ids)
        and rig.journal.settled(ids)
        and broker_idle(rig.broker_url, ["provision"])
    )


def _stop_mid_batch(rig: Rig, client: Any, *, target: str, step: str, tag: str) -> tuple[list[str], list[str]]:
    """Send a batch, SIGTERM the worker that took its first two while they are held at `step`, let
    the next worker run the rest; (the batch's rentals, those in flight at the signal)."""
    stopping = _worker(rig, f"term-{tag}", **{HOLD_AT_VAR: step})
    taking_over: CeleryWorker | None = None
    try:
        batch = [plan_rental(rig, f"job-term-{tag}-{k}") for k in range(TASKS_PER_ROUND)]
        for rid in batch:
            client.send_task(TASK, args=[rid], queue="provision")
        wait_for(
            lambda: sum(rig.journal.held(rid) for rid in batch) == CONCURRENCY,
            timeout_s=120,
            what="two creates in flight",
            log=stopping.log,
        )
        in_flight = [rid for rid in batch if rig.journal.held(rid)]
        if target == "main":
            os.kill(stopping.proc.pid, signal.SIGTERM)
        else:
            os.killpg(stopping.proc.pid, signal.SIGTERM)
        wait_for(
            lambda: b"Warm shutdown" in stopping.log.read_bytes(), timeout_s=60, what="the shutdown", log=stopping.log
        )
        for rid in in_flight:
            rig.journal.release(rid)
        wait_for(lambda: stopping.proc.poll() is not None, timeout_s=120, what="the worker's exit", log=stopping.log)
        taking_over = _worker(rig, f"term-{tag}-next")
        wait_for(partial(_settled, rig, batch), timeout_s=180, what="every task", log=taking_over.log)
    finally:
        stopping.stop()
        if taking_over is not None:
            taking_over.stop()
    return batch, in_flight


@pytest.mark.parametrize("target", ["main", "group"])
def test_sigterm_with_creates_in_flight_completes_each_task_once(
    th_env: dict[str, str], vast: FakeVast, tmp_path: Path, target: str
) -> None:
    """SIGTERM (to the main process, or to the whole group) while two creates are in flight and two
    wait: each task completes exactly once, on the stopped worker or on the next."""
    n = rounds(ci=1, full=10)
    rig = open_rig(th_env, vast, tmp_path)
    client = celery_client(rig.env)
    ids: list[str] = []
    in_flight_total = noop_redeliveries = cut_off = 0
    for i in range(n):
        batch, in_flight = _stop_mid_batch(rig, client, target=target, step=STEPS[i % len(STEPS)], tag=f"{target}-{i}")
        ids += batch
        for rid in batch:
            deliveries = rig.journal.deliveries(rid)
            # Every delivery ran to its end or was cut off by the signal; the task completed, and any
            # delivery after the one that completed it found the work done (a task that finishes
            # during a warm shutdown can lose its acknowledgement and be delivered again).
            assert all(d.outcome in ("active", "SystemExit", None) for d in deliveries), deliveries
            completed = [d for d in deliveries if d.outcome == "active"]
            assert completed and all(d.noop for d in completed[1:]), deliveries
            if rid in in_flight:
                first = deliveries[0]
                if target == "main":
                    assert first.outcome == "active", "the warm shutdown let the create in flight finish"
                else:
                    assert first.outcome in ("SystemExit", None), "the SIGTERM'd child cut its create off"
            noop_redeliveries += sum(1 for d in completed[1:])
            cut_off += sum(1 for d in deliveries if d.outcome != "active")
            assert creates_for(rig, rid) == 1
            rental = rig.rentals.get(rid)
            assert rental is not None and rental.state == "active" and rental.instance_id in vast.instances
            assert len(rig.rentals.ledger.rows(job=rental.job, kind="instance_created")) == 1
        in_flight_total += len(in_flight)
    report = sweep_reconcile(rig.rentals, {"vast": rig.market}, now=time.time() + 1e6, orphan_grace_s=0)
    assert report.stopped == [] and report.adopted == [] and report.lost == []
    assert rig.rentals.ledger.verify().ok
    record(
        f"sigterm_{target}_with_tasks_in_flight",
        criterion=f"SIGTERM to the worker's {'main process' if target == 'main' else 'process group'} with "
        "creates in flight: each task completes exactly once",
        rounds=n,
        tasks=len(ids),
        vendor_creates=sum(creates_for(rig, rid) for rid in ids),
        duplicates=sum(creates_for(rig, rid) - 1 for rid in ids),
        lost_tasks=sum(1 for rid in ids if (r := rig.rentals.get(rid)) is None or r.instance_id is None),
        in_flight_at_signal=in_flight_total,
        deliveries_cut_off=cut_off,
        redeliveries_that_found_it_done=noop_redeliveries,
        orphans_after_reconcile=0,
    )
