"""Through the CLI, a real Celery worker, Redis and the shared sim marketplace (scaled time): a
running job is cancelled (its host stopped, never destroyed; the job never recovered) and resumed
with a new budget on a fresh rental."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.db import make_engine
from app.ledger import Ledger
from tests.support.recovery_fleet import hosts, recovery_fleet
from tests.support.services import wait_until


@pytest.mark.long
def test_cancel_a_running_job_then_resume_it_on_a_fresh_rental(th_env: dict[str, str], tmp_path: Path) -> None:
    """submit -> training -> `cancel` stops the host (stopped_by operator, no destroy), the job is
    cancelled and stays so -> `resume --budget-usd nan` is refused, nothing written -> `resume
    --budget-usd 2` -> provisioning hands the job a different host; `jobs show` has both verbs."""
    with recovery_fleet(th_env, tmp_path, hosts(3), name="lifecycle", scale=60.0, standby_hosts=0) as fleet:
        job_id = fleet.job_id
        book = Ledger(make_engine(f"sqlite:///{Path(th_env['TUNEHARNESS_HOME']) / 'tuneharness.db'}"))

        def ledger(kind: str | None = None) -> list[dict[str, Any]]:
            """The job's ledger rows, read in this process (a CLI call per look costs seconds)."""
            return [r.as_dict() for r in book.rows(job=job_id, kind=kind)]

        assert wait_until(lambda: len(ledger("training_handed_over")) == 1, timeout_s=240, interval_s=0.5), fleet.log()
        first = ledger("training_handed_over")[0]["instance"]

        out = fleet.cli("cancel", job_id, "--reason", "wrong data", "--json")
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["stopped"] == [first]
        assert fleet.phase() == "cancelled"
        stops = [r for r in ledger("instance_stopped") if r["instance"] == first]
        assert [r["payload"]["stopped_by"] for r in stops] == ["operator"]
        assert not [r for r in ledger("instance_destroyed") if r["instance"] == first]
        assert len(ledger("job_cancelled")) == 1

        seen = len(ledger())
        bad = fleet.cli("resume", job_id, "--budget-usd", "nan")
        assert bad.returncode == 2 and "Fix:" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
        assert len(ledger()) == seen and fleet.phase() == "cancelled"

        out = fleet.cli("resume", job_id, "--budget-usd", "2", "--json")
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["from_steps"] == {job_id: 0}
        assert wait_until(lambda: len(ledger("training_handed_over")) == 2, timeout_s=240, interval_s=0.5), fleet.log()
        second = ledger("training_handed_over")[1]["instance"]
        assert second != first and fleet.phase() == "training"
        shown = json.loads(fleet.cli("jobs", "show", job_id, "--json").stdout)
        kinds = [p["kind"] for p in shown["phases"]]
        assert kinds.index("job_cancelled") < kinds.index("job_resumed_by_operator")
        assert {h["instance"]: h["state"] for h in shown["hosts"]}[first] == "stopped"
