"""`doctor` counts the workers answering on the broker by machine, and refuses a fleet of several
machines on SQLite (each machine would write its own file): PostgreSQL is the fleet's database."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from support.services import CeleryWorker

REPO = Path(__file__).resolve().parents[3]


def _workers_check(env: dict[str, str]) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-m", "app.cli.main", "doctor", "--json"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    checks = {c["name"]: c for c in json.loads(out.stdout)}
    return checks["workers"]


@pytest.mark.slow
@pytest.mark.postgres
def test_two_machines_on_sqlite_are_refused_and_on_postgresql_pass(th_env: dict[str, str], pg_url: str) -> None:
    workers = [CeleryWorker.start(th_env, cwd=REPO, queues="maintenance", node=f"w@machine-{m}") for m in ("a", "b")]
    try:
        on_sqlite = _workers_check(th_env)
        assert on_sqlite["ok"] is False and "2 machine(s): machine-a, machine-b" in str(on_sqlite["detail"])
        assert "PostgreSQL" in str(on_sqlite["fix"])
        on_pg = _workers_check({**th_env, "TUNEHARNESS_DB_URL": pg_url})
        assert on_pg["ok"] is True and "2 machine(s)" in str(on_pg["detail"])
    finally:
        for w in workers:
            w.stop()


def test_one_machine_on_sqlite_is_fine_and_no_worker_is_said(th_env: dict[str, str]) -> None:
    check = _workers_check(th_env)
    assert check["ok"] is True and "none answered" in str(check["detail"])
