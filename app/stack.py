"""A local stack as child processes: redis (when none is reachable), optionally a shared simulated
marketplace (`sim serve`), a worker, one beat, Flower.

Used by `tuneharness up` and the demo. `stop()` terminates every child (SIGTERM, then SIGKILL
after a grace period) in reverse start order, so Ctrl-C leaves nothing running. `state()` is what
`up` records under TUNEHARNESS_HOME for every other shell (`app.stackstate`).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from app.errors import ServiceUnavailable, UserError
from app.settings import Settings
from app.settings_catalogue import secret_names
from app.stackstate import StackState

__all__ = [
    "ALL_QUEUES",
    "Stack",
    "broker_reachable",
    "free_port",
    "is_loopback",
    "port_free",
    "refuse_open_flower",
    "wait_until",
]

ALL_QUEUES = "provision,ssh,monitor,evaluate,maintenance"


def is_loopback(host: str) -> bool:
    """Is `host` an address only this machine reaches (what Flower, the pages and metrics may listen
    on without authentication)?"""
    host = host.strip()
    return host in ("localhost", "::1") or host.startswith("127.")


def refuse_open_flower(settings: Settings) -> None:
    """Flower shows every task's arguments and can revoke tasks: on an address other machines reach
    it needs basic auth, and without it nothing is started."""
    addr = settings.flower_address.strip()
    if not is_loopback(addr) and not (settings.flower_user and settings.flower_password):
        raise UserError(
            f"Flower would listen on {addr} without authentication. Fix: set TUNEHARNESS_FLOWER_USER and "
            "TUNEHARNESS_FLOWER_PASSWORD, keep TUNEHARNESS_FLOWER_ADDRESS=127.0.0.1, or pass --no-flower"
        )


def _popen(argv: list[str], env: Mapping[str, str], log: Path) -> subprocess.Popen[bytes]:
    """A child in its own session (a signal to `up` is not sent to it), its output appended to `log`."""
    with log.open("ab") as fh:
        return subprocess.Popen(
            argv, stdout=fh, stderr=subprocess.STDOUT, env=dict(env), cwd=str(Path.cwd()), start_new_session=True
        )


def port_free(port: int) -> bool:
    """Can a server bind 127.0.0.1:`port` now?"""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(predicate: Callable[[], object], *, timeout_s: float, interval_s: float = 0.1) -> bool:
    """Poll `predicate()` until it is true or `timeout_s` passes (never a bare sleep)."""
    import time

    deadline = time.monotonic() + timeout_s
    ev = threading.Event()
    while time.monotonic() < deadline:
        if predicate():
            return True
        ev.wait(interval_s)
    return bool(predicate())


def broker_reachable(url: str, *, timeout_s: float = 1.0) -> bool:
    import redis

    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s)
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    restarts: list[float] = field(default_factory=list)  # monotonic times this child was started again


# A child that dies is started again (a worker that lost its broker mid-restart exits; compose
# restarts it, and so does `up`), at most this often in this window; more means something is broken.
MAX_RESTARTS = 5
RESTART_WINDOW_S = 600.0


@dataclass
class Stack:
    """Start and stop the local processes of tuneharness."""

    settings: Settings
    run_dir: Path
    flower: bool = True
    beat: bool = True
    worker_concurrency: int = 2
    extra_env: Mapping[str, str] = field(default_factory=dict)
    children: list[Child] = field(default_factory=list)
    broker_url: str = ""
    sim_trace: str | None = None  # start `sim serve` on this trace (a file or a shipped trace's name)
    sim_scale: float = 1.0
    sim_url: str = ""  # the shared simulated marketplace the children use ("" : none)
    web: bool = True  # the read-only pages (`tuneharness web`), on loopback
    web_port: int = 0  # 0: the pages' default port, or a free one when another process holds it
    web_url: str = ""

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.extra_env)
        env["TUNEHARNESS_HOME"] = str(self.settings.home)
        env["TUNEHARNESS_DB_URL"] = self.settings.db_url
        env["TUNEHARNESS_BROKER_URL"] = self.broker_url
        env["TUNEHARNESS_RESULT_URL"] = (
            self.broker_url if self.settings.result_url == self.settings.broker_url else self.settings.result_url
        )
        if self.sim_url:
            env["TUNEHARNESS_SIM_URL"] = self.sim_url
            if self.sim_trace is not None:
                env["TUNEHARNESS_SIM_SCALE"] = f"{self.sim_scale:g}"
        env.pop("FLOWER_BASIC_AUTH", None)
        return env

    def state(self, *, started_at: float) -> StackState:
        """What this stack runs, for `app.stackstate.write`."""
        s = self.settings
        env = self.env()
        return StackState(
            pid=os.getpid(),
            host=socket.gethostname(),
            started_at=started_at,
            broker_url=self.broker_url,
            result_url=env["TUNEHARNESS_RESULT_URL"],
            sim_url=self.sim_url,
            sim_scale=env.get("TUNEHARNESS_SIM_SCALE", "") if self.sim_url else "",
            flower_url=f"http://{s.flower_address}:{s.flower_port}" if self.flower else "",
            web_url=self.web_url,
            logs=str(self.run_dir),
        )

    def flower_env(self) -> dict[str, str]:
        """Flower is code we did not write: it gets the broker and its own basic auth, never vendor
        keys, webhooks, or the database URL (which may hold a password)."""
        drop = secret_names() | {"TUNEHARNESS_DB_URL", "TUNEHARNESS_FLOWER_USER"}
        env = {k: v for k, v in self.env().items() if k not in drop}
        s = self.settings
        if s.flower_user and s.flower_password:
            env["FLOWER_BASIC_AUTH"] = f"{s.flower_user}:{s.flower_password}"
        return env

    def _spawn(self, name: str, argv: list[str], env: Mapping[str, str] | None = None) -> Child:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        log = self.run_dir / f"{name}.log"
        child_env = dict(env or self.env())
        child = Child(name, _popen(argv, child_env, log), log, argv=list(argv), env=child_env)
        self.children.append(child)
        return child

    def _respawn(self, child: Child) -> None:
        child.proc = _popen(child.argv, child.env, child.log)

    def start_broker(self) -> None:
        url = self.settings.broker_url
        if broker_reachable(url):
            self.broker_url = url
            return
        host = urlsplit(url).hostname or ""
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise ServiceUnavailable(
                f"broker unreachable at {url}. Fix: start Redis there, or unset TUNEHARNESS_BROKER_URL "
                "to let `tuneharness up` start a local redis-server"
            )
        exe = shutil.which("redis-server")
        if exe is None:
            raise ServiceUnavailable(
                "no broker reachable and redis-server is not installed. Fix: apt-get install redis-server"
            )
        port = free_port()
        data = self.run_dir / "redis"
        data.mkdir(parents=True, exist_ok=True)
        child = self._spawn(
            "redis",
            [
                exe,
                "--bind",
                "127.0.0.1",
                "--port",
                str(port),
                "--dir",
                str(data),
                "--appendonly",
                "yes",
                "--save",
                "",
                "--maxmemory-policy",
                "noeviction",
                "--protected-mode",
                "yes",
            ],
            env={k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")},
        )
        self.broker_url = f"redis://127.0.0.1:{port}/0"
        if not wait_until(lambda: broker_reachable(self.broker_url, timeout_s=0.2), timeout_s=15):
            raise ServiceUnavailable(f"redis-server did not come up; see {child.log}")

    def start_sim(self) -> None:
        """`sim serve` on `sim_trace` at `sim_scale`, its hosts under run/sim; waits for its URL."""
        if self.sim_trace is None:
            return
        url_file = self.run_dir / "sim-url"
        url_file.unlink(missing_ok=True)
        child = self._spawn(
            "sim",
            [
                sys.executable,
                "-m",
                "app.cli.main",
                "sim",
                "serve",
                "--trace",
                self.sim_trace,
                "--scale",
                f"{self.sim_scale:g}",
                "--root",
                str(self.run_dir / "sim"),
                "--url-file",
                str(url_file),
            ],
        )
        if not wait_until(lambda: url_file.exists() or child.proc.poll() is not None, timeout_s=60):
            raise ServiceUnavailable(f"the simulated marketplace did not come up in 60 s; see {child.log}")
        if child.proc.poll() is not None:
            raise UserError(f"sim serve exited with code {child.proc.returncode}; see {child.log}")
        self.sim_url = url_file.read_text(encoding="utf-8").strip()

    def start(self) -> None:
        """Start broker (if needed), the shared simulated marketplace (if asked), worker, beat, Flower
        and the web pages."""
        if self.flower:
            refuse_open_flower(self.settings)
        self.start_broker()
        if self.sim_trace is None:  # a shared marketplace this shell names is the stack's too
            self.sim_url = self.sim_url or self.env().get("TUNEHARNESS_SIM_URL", "")
        self.start_sim()
        py = sys.executable
        self._spawn(
            "worker",
            [
                py,
                "-m",
                "celery",
                "-A",
                "workers.celery_app",
                "worker",
                "-Q",
                ALL_QUEUES,
                "-E",
                "--loglevel",
                "INFO",
                "--concurrency",
                str(self.worker_concurrency),
                "-n",
                f"th-worker-{os.getpid()}@%h",
            ],
        )
        if self.beat:
            self._spawn(
                "beat",
                [
                    py,
                    "-m",
                    "celery",
                    "-A",
                    "workers.celery_app",
                    "beat",
                    "--loglevel",
                    "INFO",
                    "-s",
                    str(self.run_dir / "celerybeat-schedule"),
                ],
            )
        if self.flower:
            s = self.settings
            self._spawn(
                "flower",
                [
                    py,
                    "-m",
                    "celery",
                    "-A",
                    "workers.celery_app",
                    "flower",
                    f"--address={s.flower_address}",
                    f"--port={s.flower_port}",
                ],
                env=self.flower_env(),
            )
        if self.web:
            self.start_web()

    def start_web(self) -> None:
        """`tuneharness web` on 127.0.0.1: the pages' default port, or a free one when it is taken."""
        from app.web.server import DEFAULT_PORT, web_argv

        port = self.web_port or (DEFAULT_PORT if port_free(DEFAULT_PORT) else free_port())
        self._spawn("web", web_argv(host="127.0.0.1", port=port))
        self.web_url = f"http://127.0.0.1:{port}"

    def check_alive(self, *, now: float | None = None) -> list[str]:
        """Start a child that died again (what compose's `restart: unless-stopped` does), and return
        a line for each one started; raise, naming its log, when one keeps dying (MAX_RESTARTS in
        RESTART_WINDOW_S)."""
        now = time.monotonic() if now is None else now
        said: list[str] = []
        for c in self.children:
            code = c.proc.poll()
            if code is None:
                continue
            c.restarts = [t for t in c.restarts if now - t < RESTART_WINDOW_S]
            if len(c.restarts) >= MAX_RESTARTS or not c.argv:
                tail = c.log.read_text(errors="replace").strip().splitlines()[-5:]
                raise UserError(
                    f"{c.name} exited with code {code} {len(c.restarts) + 1} times in "
                    f"{RESTART_WINDOW_S / 60:.0f} minutes; last lines of {c.log}: " + " | ".join(tail)
                )
            c.restarts.append(now)
            self._respawn(c)
            said.append(f"{c.name} exited with code {code}; started again (see {c.log})")
        return said

    def stop(self, *, grace_s: float = 20.0) -> None:
        """SIGTERM every child in reverse order, SIGKILL what is left after `grace_s`."""
        for c in reversed(self.children):
            if c.proc.poll() is None:
                try:
                    os.killpg(c.proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for c in reversed(self.children):
            try:
                c.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(c.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                c.proc.wait(timeout=5)
        self.children.clear()

    def __enter__(self) -> Stack:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
