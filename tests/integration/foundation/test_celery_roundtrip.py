"""A real Celery worker executes real tasks through a real Redis and leaves ledger events."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from support.services import CeleryWorker, celery_client


def _ledger(env: dict[str, str]):  # type: ignore[no-untyped-def]
    from app.db import init_db, make_engine
    from app.ledger import Ledger
    from app.settings import load_settings

    engine = make_engine(load_settings(env).db_url)
    init_db(engine)
    return Ledger(engine)


def test_ping_round_trip(celery_worker: CeleryWorker, th_env: dict[str, str]) -> None:
    """A task sent by name to the maintenance queue comes back with its result."""
    client = celery_client(th_env)
    result = client.send_task("tuneharness.maintenance.ping", args=["hello"], queue="maintenance")
    assert result.get(timeout=60) == "hello"


def test_every_queue_is_consumed_and_a_retried_sweep_records_once(
    celery_worker: CeleryWorker, th_env: dict[str, str]
) -> None:
    """Tasks routed to each queue run; the heartbeat records beat liveness in the database."""
    client = celery_client(th_env)
    assert client.send_task("tuneharness.maintenance.heartbeat", queue="maintenance").get(timeout=60) > 0
    for name in ("tuneharness.maintenance.reaper", "tuneharness.maintenance.reaper"):
        assert client.send_task(name, queue="maintenance").get(timeout=60)["stopped"] == []
    from app.db import init_db, make_engine
    from app.liveness import last_successes
    from app.settings import load_settings

    engine = make_engine(load_settings(th_env).db_url)
    init_db(engine)
    assert {"beat-heartbeat", "reaper"} <= set(last_successes(engine))
    assert _ledger(th_env).verify().ok


def test_worker_refuses_to_start_when_visibility_timeout_is_too_short(th_env: dict[str, str], tmp_path: Path) -> None:
    """A worker whose time limits reach the visibility timeout exits instead of double-running tasks."""
    import subprocess

    shim = tmp_path / "shortvt.py"
    shim.write_text(
        "from workers.celery_app import app\n"
        "import workers.tasks  # noqa: F401\n"
        "app.conf.broker_transport_options = {'visibility_timeout': 60}\n"
        "app.conf.result_backend_transport_options = {'visibility_timeout': 60}\n"
        "app.conf.visibility_timeout = 60\n"
    )
    env = {**th_env, "PYTHONPATH": f"{tmp_path}{os.pathsep}{th_env['PYTHONPATH']}"}
    proc = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "shortvt:app", "worker", "-Q", "maintenance", "--pool", "solo"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "visibility timeout 60s is not longer than" in proc.stdout + proc.stderr
