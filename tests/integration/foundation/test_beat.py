"""Exactly one beat schedules at a time; a frozen beat is flagged."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support.services import wait_until

REPO = Path(__file__).resolve().parents[3]


def _beat(env: dict[str, str], home: Path, name: str) -> tuple[subprocess.Popen[bytes], Path]:
    log = home / f"{name}.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "workers.celery_app",
                "beat",
                "--loglevel",
                "INFO",
                "-s",
                str(home / f"{name}-schedule"),
            ],
            env=env,
            cwd=REPO,
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
    return proc, log


def test_a_second_beat_refuses_to_start(th_env: dict[str, str], th_home: Path) -> None:
    """While one beat holds the lock, a second exits naming the holder."""
    first, first_log = _beat(th_env, th_home, "beat1")
    try:
        assert wait_until(lambda: b"beat: Starting" in first_log.read_bytes(), timeout_s=60)
        second, second_log = _beat(th_env, th_home, "beat2")
        assert second.wait(timeout=60) != 0
        assert "another beat" in second_log.read_text()
        assert first.poll() is None
    finally:
        first.terminate()
        first.wait(timeout=30)


def test_doctor_flags_overdue_periodic_tasks(cli, th_env: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    """With no beat running, doctor names the periodic tasks that never ran and exits 1."""
    out = cli("doctor", "--json")
    assert out.returncode == 1
    assert "beat-heartbeat" in out.stdout and "reconciler" in out.stdout
