"""With no beat at all, a worker sends the money sweeps itself once beat is late with them: the
budget monitor runs (and records its success) one interval plus FALLBACK_SLACK_S after the worker
started watching, through the broker like any task, and only once per interval."""

from __future__ import annotations

from pathlib import Path

from app.db import init_db, make_engine
from app.liveness import last_successes
from app.settings import load_settings
from support.services import CeleryWorker, wait_until

REPO = Path(__file__).resolve().parents[3]


def test_a_worker_without_beat_runs_the_budget_monitor_itself(th_env: dict[str, str]) -> None:
    env = {**th_env, "TUNEHARNESS_SIM_SCALE": "60"}  # the budget monitor's 60 s period passes in 1 s
    engine = make_engine(load_settings(env).db_url)
    init_db(engine)
    worker = CeleryWorker.start(env, cwd=REPO, queues="maintenance", name="fallback")
    try:
        assert wait_until(lambda: "budget-monitor" in last_successes(engine), timeout_s=90), worker.log.read_text()[
            -3000:
        ]
        log = worker.log.read_text()
        assert "Task tuneharness.maintenance.budget_monitor[" in log
        assert "Task tuneharness.maintenance.redrive[" not in log  # only the sweeps that stop money
    finally:
        worker.stop()
