"""End to end: the control plane restarts in the middle of a research run (its worker stopped while the
baseline trains, a fresh worker started, the sweeps' re-arms sent), and the run resumes from the
database: it finishes with every experiment recorded once and no job submitted twice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.research_fleet import research_fleet, research_text, write_inputs
from tests.support.services import CeleryWorker, celery_client, wait_until

AXES = "  learning_rate: {times: [8.0]}\n"

REARM = """
import sys
from app import bootstrap
svc = bootstrap.research()
seq = svc.stale(sys.argv[1], older_than_s=0)
if seq is not None:
    bootstrap.enqueue_research(sys.argv[1], seq)
print(seq)
"""


@pytest.mark.slow
@pytest.mark.long
def test_a_research_run_survives_a_control_plane_restart(th_env: dict[str, str], tmp_path: Path) -> None:
    """Stop the only worker while the baseline trains, start another and re-arm: the run ends with its baseline
    and its one mutation recorded once each, three jobs in all, each submitted once."""
    import subprocess
    import sys

    from app.db import make_engine
    from app.ledger import Ledger
    from tests.support.research_fleet import ROOT

    research = write_inputs(
        tmp_path, research_text(name="restart", iterations=1, mutations=1, axes=AXES, budget_usd=2.0)
    )
    with research_fleet(th_env, tmp_path) as fleet:
        out = fleet.cli("research", "start", str(research))
        assert out.returncode == 0, out.stderr
        run_id = out.stdout.strip()

        def baseline_training() -> bool:
            jobs = json.loads(fleet.cli("jobs", "--json").stdout)
            mine = [j for j in jobs if j["job_id"].startswith(f"{run_id}-e000-")]
            return len(mine) == 2 and all(j["phase"] == "training" for j in mine)

        assert wait_until(baseline_training, timeout_s=600, interval_s=2.0), fleet.log_tail()
        fleet.worker.stop()  # the control plane goes away mid-run
        fleet.worker = CeleryWorker.start(fleet.env, cwd=ROOT, concurrency=3, name="research-again")
        rearm = subprocess.run(
            [sys.executable, "-c", REARM, run_id], cwd=ROOT, env=fleet.env, capture_output=True, text=True, check=False
        )
        assert rearm.returncode == 0, rearm.stderr
        # Beat's backstop, sent by hand (no beat here): a training job whose monitor chain died with the
        # stopped worker is re-armed once overdue.
        client = celery_client(fleet.env)

        def baseline_ended() -> bool:
            client.send_task("tuneharness.maintenance.rearm_monitors", queue="maintenance").get(timeout=60)
            jobs = json.loads(fleet.cli("jobs", "--json").stdout)
            mine = [j for j in jobs if j["job_id"].startswith(f"{run_id}-e000-")]
            return all(j["phase"] in ("done", "failed") for j in mine)

        assert wait_until(baseline_ended, timeout_s=600, interval_s=5.0), fleet.log_tail()
        assert fleet.wait_finished(run_id, timeout_s=1200), fleet.log_tail()

        lines = fleet.experiments(run_id)
        assert [r["exp"] for r in lines] == ["e000", "e001"] and lines[0]["verdict"] == "baseline"
        ledger = Ledger(make_engine(f"sqlite:///{fleet.home / 'tuneharness.db'}"))
        submitted = [e.job for e in ledger.rows(kind="job_submitted") if (e.job or "").startswith(run_id)]
        assert sorted(submitted) == sorted(set(submitted)) and len(submitted) == 3, submitted
        state = fleet.state(run_id)
        assert state is not None and state["finished_reason"] == "iterations done"
