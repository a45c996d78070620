"""A beat paused past its lock's expiry carries on when it resumes, unless another beat took over;
a worker with no beat at all raises `beat_overdue` by itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import redis

from support.services import CeleryWorker, wait_until

REPO = Path(__file__).resolve().parents[3]

_HOLDER = textwrap.dedent(
    """
    import sys, threading
    from workers.beatlock import BeatLock, LOCK_KEY
    lock = BeatLock(sys.argv[1], ttl_s=1, renew_every_s=0.2)
    assert lock.acquire() is None
    print("held", flush=True)
    threading.Event().wait()  # a beat doing nothing but holding its lock, until it is killed
    """
)


def _holder(url: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, url], cwd=REPO, stdout=subprocess.PIPE, text=True, env={**os.environ}
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_paused_beat_takes_its_expired_lock_back(redis_url: str) -> None:
    """SIGSTOP past the expiry, nobody else starts, SIGCONT: the beat keeps running and holds the lock."""
    url = redis_url.rsplit("/", 1)[0] + "/14"
    r = redis.Redis.from_url(url)
    r.flushdb()
    proc = _holder(url)
    try:
        value = r.get("tuneharness:beat-lock")
        os.kill(proc.pid, signal.SIGSTOP)
        assert wait_until(lambda: r.get("tuneharness:beat-lock") is None, timeout_s=10)
        os.kill(proc.pid, signal.SIGCONT)
        assert wait_until(lambda: r.get("tuneharness:beat-lock") == value, timeout_s=10)
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()


def test_paused_beat_exits_when_another_took_over(redis_url: str) -> None:
    """While it was stopped another beat took the lock: on resume it exits (never two schedulers)."""
    url = redis_url.rsplit("/", 1)[0] + "/14"
    r = redis.Redis.from_url(url)
    r.flushdb()
    proc = _holder(url)
    try:
        os.kill(proc.pid, signal.SIGSTOP)
        assert wait_until(lambda: r.get("tuneharness:beat-lock") is None, timeout_s=10)
        r.set("tuneharness:beat-lock", "other-host:1", ex=30)
        os.kill(proc.pid, signal.SIGCONT)
        assert proc.wait(timeout=10) == 3
        assert r.get("tuneharness:beat-lock") == b"other-host:1"
    finally:
        proc.kill()
        proc.wait()


def test_worker_without_beat_raises_beat_overdue(th_env: dict[str, str]) -> None:
    """No beat runs: within a few scaled intervals the worker itself records `beat_overdue`."""
    from app.alerts import OutboxNotifier
    from app.db import init_db, make_engine
    from app.settings import load_settings

    env = {**th_env, "TUNEHARNESS_SIM_SCALE": "60"}  # beat's 60 s periods pass in 1 s
    engine = make_engine(load_settings(env).db_url)
    init_db(engine)
    worker = CeleryWorker.start(env, cwd=REPO, queues="provision", name="beatwatch")
    try:
        outbox = OutboxNotifier(engine, None)
        assert wait_until(lambda: any(a.kind == "beat_overdue" for a in outbox.recorded()), timeout_s=90), (
            worker.log.read_text()[-2000:]
        )
    finally:
        worker.stop()
