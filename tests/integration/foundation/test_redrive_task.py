"""Beat's `redrive` through a real worker: a submitted job whose `provision` message was lost is
provisioned again, and the ledger says so."""

from __future__ import annotations

import time
from pathlib import Path

from support.services import CeleryWorker, wait_until

REPO = Path(__file__).resolve().parents[3]


def test_a_job_never_provisioned_is_sent_again(th_env: dict[str, str]) -> None:
    """Given a job recorded 11 minutes ago whose provision task never ran, when redrive runs, then the
    job leaves `queued` and a `job_redriven` event names the task sent again."""
    from celery import Celery

    from app.bootstrap import _engine_for
    from app.db import init_db, make_engine
    from app.jobs import JobStore, parse_job_text
    from app.ledger import Ledger
    from app.settings import load_settings
    from tests.support.jobfiles import sim_needs_section, train_section

    engine = make_engine(load_settings(th_env).db_url)
    init_db(engine)
    jobs = JobStore(engine)
    spec = parse_job_text(f"name: lost\n{train_section()}{sim_needs_section()}budget_usd: 1.0\n", check_files=False)
    job_id = jobs.add(spec, now=time.time() - 660)
    worker = CeleryWorker.start(th_env, cwd=REPO, queues="provision,maintenance", name="redrive")
    try:
        Celery(broker=th_env["TUNEHARNESS_BROKER_URL"]).send_task(
            "tuneharness.maintenance.redrive", queue="maintenance"
        )

        def moved() -> bool:
            rec = JobStore(engine).get(job_id)
            return rec is not None and rec.phase != "queued"

        assert wait_until(moved, timeout_s=90), worker.log.read_text()[-3000:]
        (event,) = Ledger(engine).rows(job=job_id, kind="job_redriven")
        assert event.payload["task"] == "provision"
    finally:
        worker.stop()
        _engine_for.cache_clear()
