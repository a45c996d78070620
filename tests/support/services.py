"""Real services for the tests: a private redis-server and real Celery worker processes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sigint_default() -> None:
    """`Popen(preexec_fn=...)` for a child a test stops with SIGINT (Ctrl-C): the default action even
    when the suite itself started with SIGINT ignored (a background job of a non-interactive shell),
    which Python would keep, never raising KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_until(predicate: Callable[[], object], *, timeout_s: float = 30.0, interval_s: float = 0.05) -> bool:
    """Poll a condition until true or the timeout passes; returns the last result."""
    deadline = time.monotonic() + timeout_s
    pause = threading.Event()
    while time.monotonic() < deadline:
        if predicate():
            return True
        pause.wait(interval_s)
    return bool(predicate())


@dataclass
class RedisServer:
    proc: subprocess.Popen[bytes]
    port: int

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def start_redis(data_dir: Path) -> RedisServer:
    import redis

    port = free_port()
    proc = subprocess.Popen(
        [
            "redis-server",
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
            "--dir",
            str(data_dir),
            "--save",
            "",
            "--appendonly",
            "no",
            "--maxmemory-policy",
            "noeviction",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    server = RedisServer(proc, port)

    def up() -> bool:
        try:
            return bool(redis.Redis(port=port, socket_connect_timeout=0.2).ping())
        except redis.RedisError:
            return False

    if not wait_until(up, timeout_s=15):
        server.stop()
        raise RuntimeError("private redis-server did not start")
    return server


@dataclass
class CeleryWorker:
    proc: subprocess.Popen[bytes]
    log: Path
    env: Mapping[str, str]

    @classmethod
    def start(
        cls,
        env: Mapping[str, str],
        *,
        cwd: Path,
        queues: str = "provision,ssh,monitor,evaluate,maintenance",
        concurrency: int = 1,
        name: str | None = None,
        app: str = "workers.celery_app",
        node: str | None = None,
    ) -> CeleryWorker:
        """A worker on `app` (`support.rent_task` adds the test-only `rent` task to the product's app);
        `node` names it NAME@MACHINE as another machine's worker would be named."""
        log = Path(env["TUNEHARNESS_HOME"]) / f"worker-{name or os.getpid()}-{time.monotonic_ns()}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        if app.startswith("support."):  # tests/ on the worker's path as well as the repository
            env = {**env, "PYTHONPATH": os.pathsep.join([str(cwd / "tests"), env.get("PYTHONPATH", str(cwd))])}
        with log.open("wb") as fh:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    app,
                    "worker",
                    "-Q",
                    queues,
                    "--concurrency",
                    str(concurrency),
                    "--pool",
                    "prefork",
                    "--loglevel",
                    "INFO",
                    "-n",
                    node or f"{name or 'test'}-{time.monotonic_ns()}@%h",
                    "--without-heartbeat",
                    "--without-gossip",
                    "--without-mingle",
                ],
                env=dict(env),
                cwd=cwd,
                stdout=fh,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        worker = cls(proc, log, env)
        if not wait_until(lambda: b"ready." in log.read_bytes() or proc.poll() is not None, timeout_s=60):
            worker.stop()
            raise RuntimeError(f"worker did not become ready; log: {log.read_text(errors='replace')[-2000:]}")
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited {proc.returncode}: {log.read_text(errors='replace')[-2000:]}")
        return worker

    def kill9(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


def celery_client(env: Mapping[str, str]):  # type: ignore[no-untyped-def]
    """A Celery client configured exactly as the workers are, from a test's environment."""
    from celery import Celery

    from app.settings import load_settings
    from workers.config import build_config

    app = Celery("test-client")
    app.conf.update(build_config(load_settings(env)))
    return app
