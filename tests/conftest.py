"""Shared fixtures: real services started by the suite itself.

- `redis_url`: a private redis-server (free port, temp dir) for the whole session.
- `pg_url`: a fresh database on the machine's PostgreSQL server, dropped at the end. Skipped
  when the server is unreachable, except in CI (CI=true), where that is a failure.
- `sqlite_url`: a new SQLite file per test.
- `th_env`: environment for subprocesses (CLI, workers) pointing at a temp TUNEHARNESS_HOME.
- `celery_worker`: a real Celery worker process on the private Redis.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from support.services import (  # noqa: E402
    CeleryWorker,
    start_redis,
    wait_until,
)
from tests.support.sshd import sshd_factory  # noqa: E402, F401  (fixture: real OpenSSH sshd on loopback)

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
PG_ADMIN_URL = os.environ.get("TUNEHARNESS_TEST_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A private redis-server for this test session."""
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed: run `make test` (it installs it) or apt-get install redis-server")
    server = start_redis(tmp_path_factory.mktemp("redis"))
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def pg_admin_url() -> str:
    """The machine's PostgreSQL server (fails in CI, skips elsewhere, when unreachable)."""
    import psycopg

    try:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError as exc:
        msg = f"PostgreSQL unreachable at {PG_ADMIN_URL}: {str(exc).strip().splitlines()[0]}"
        if IN_CI:
            pytest.fail(msg + " (CI must run the PostgreSQL tests)")
        pytest.skip(msg)
    return PG_ADMIN_URL


@pytest.fixture
def pg_url(pg_admin_url: str) -> Iterator[str]:
    """A brand-new PostgreSQL database for one test (SQLAlchemy URL), dropped afterwards."""
    import psycopg

    name = f"th_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_admin_url, autocommit=True, connect_timeout=3) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = pg_admin_url.rsplit("/", 1)[0]
    url = f"{base}/{name}".replace("postgresql://", "postgresql+psycopg://", 1)
    try:
        yield url
    finally:
        from app import bootstrap

        bootstrap._engine_for.cache_clear()
        with psycopg.connect(pg_admin_url, autocommit=True, connect_timeout=3) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'tuneharness.db'}"


@pytest.fixture
def th_home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    return home


_redis_dbs: Any = None


@pytest.fixture
def th_env(th_home: Path, redis_url: str) -> dict[str, str]:
    """Environment for a tuneharness subprocess: private home, SQLite, a flushed database of the
    session's Redis (so no test's leftover tasks or beat lock reach the next test's worker)."""
    import itertools

    import redis as redis_client

    global _redis_dbs
    if _redis_dbs is None:
        _redis_dbs = itertools.cycle(range(1, 16))
    db = next(_redis_dbs)
    broker = f"{redis_url.rsplit('/', 1)[0]}/{db}"
    redis_client.Redis.from_url(broker).flushdb()
    env = dict(os.environ)
    for k in list(env):
        if k.startswith(("TUNEHARNESS_", "VAST_", "RUNPOD_")):
            del env[k]
    env.update(
        TUNEHARNESS_HOME=str(th_home),
        TUNEHARNESS_BROKER_URL=broker,
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PYTHONPATH=str(REPO),
    )
    return env


def run_cli(
    args: list[str], env: dict[str, str], *, input: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run the real `tuneharness` entry point in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "app.cli.main", *args],
        env=env,
        cwd=REPO,
        text=True,
        capture_output=True,
        input=input,
        timeout=timeout,
    )


@pytest.fixture
def cli(th_env: dict[str, str]):  # type: ignore[no-untyped-def]
    """Call the CLI as a user would: `cli("ledger", "show")`."""

    def _run(
        *args: str, input: str | None = None, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return run_cli(list(args), env or th_env, input=input)

    return _run


@pytest.fixture
def celery_worker(th_env: dict[str, str]) -> Iterator[CeleryWorker]:
    """A real Celery worker process consuming every queue on the session's Redis."""
    worker = CeleryWorker.start(th_env, cwd=REPO)
    try:
        yield worker
    finally:
        worker.stop()


__all__ = ["IN_CI", "REPO", "run_cli", "wait_until"]


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The same test on a SQLite file and on a PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'tuneharness.db'}"
    return str(request.getfixturevalue("pg_url"))
