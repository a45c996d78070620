"""A task killed with its worker on every delivery (out of memory) is not redelivered for ever: after
`MAX_DELIVERIES` deaths its job fails, the ledger says why, and the message is dropped."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

from app.deliveries import MAX_DELIVERIES
from support.faultlab import record, rounds
from support.services import CeleryWorker, wait_until

REPO = Path(__file__).resolve().parents[3]


def _failed(jobs: Any, job_id: str) -> bool:
    rec = jobs.get(job_id)
    return rec is not None and bool(rec.phase == "failed")


def _more_than_max(markers: Path) -> bool:
    return len(list(markers.iterdir())) > MAX_DELIVERIES


@pytest.mark.faults
@pytest.mark.slow
def test_a_task_that_always_kills_its_worker_fails_its_job(th_env: dict[str, str], tmp_path: Path) -> None:
    """Given a job whose task SIGKILLs its worker each time, then the job fails after MAX_DELIVERIES
    deliveries, with a task_poisoned ledger event, and no further delivery happens."""
    from celery import Celery

    from app.bootstrap import _engine_for
    from app.db import init_db, make_engine
    from app.jobs import JobStore, parse_job_text
    from app.ledger import Ledger
    from app.settings import load_settings
    from tests.support.jobfiles import sim_needs_section, train_section

    n = rounds(ci=1, full=3)
    settings = load_settings(th_env)
    engine = make_engine(settings.db_url)
    init_db(engine)
    jobs = JobStore(engine)
    worker = CeleryWorker.start(th_env, cwd=REPO, queues="provision", name="oom", app="support.oom_task")
    deliveries: list[int] = []
    try:
        client = Celery(broker=th_env["TUNEHARNESS_BROKER_URL"])
        for k in range(n):
            job_id = jobs.add(parse_job_text(f"name: oom\n{train_section()}{sim_needs_section()}", check_files=False))
            markers = tmp_path / f"deliveries-{k}"
            markers.mkdir()
            client.send_task("tuneharness.provision.always_oom", args=[job_id, str(markers)], queue="provision")
            assert wait_until(functools.partial(_failed, jobs, job_id), timeout_s=120), worker.log.read_text()[-3000:]
            rec = JobStore(engine).get(job_id)
            assert rec is not None and "out of memory" in rec.detail
            assert len(list(markers.iterdir())) == MAX_DELIVERIES
            assert [e.kind for e in Ledger(engine).rows(job=job_id, kind="task_poisoned")] == ["task_poisoned"]
            assert not wait_until(functools.partial(_more_than_max, markers), timeout_s=5)
            deliveries.append(len(list(markers.iterdir())))
    finally:
        worker.stop()
        _engine_for.cache_clear()
    record(
        "task_oom_killed_on_every_delivery",
        criterion="a task OOM-killed on every delivery fails its job after MAX_DELIVERIES deliveries, no loop",
        rounds=n,
        max_deliveries=MAX_DELIVERIES,
        deliveries=deliveries,
        poisoned_jobs=len(deliveries),
    )
