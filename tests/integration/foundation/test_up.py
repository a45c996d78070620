"""`tuneharness up` starts the local stack as children and Ctrl-C stops every one of them."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx

from support.services import free_port, wait_until

REPO = Path(__file__).resolve().parents[3]


def _running(pattern: str) -> bool:
    return subprocess.run(["pgrep", "-f", pattern], capture_output=True).returncode == 0


def _answers(url: str, *, auth: tuple[str, str] | None) -> int:
    try:
        return httpx.get(url, auth=auth, timeout=2).status_code
    except httpx.HTTPError:
        return 0


def test_up_starts_redis_worker_beat_flower_and_ctrl_c_stops_them(th_env: dict[str, str], th_home: Path) -> None:
    """With no broker reachable, up starts its own redis; Flower and the web pages are on localhost
    behind basic auth."""
    flower_port = free_port()
    env = {
        **th_env,
        "TUNEHARNESS_BROKER_URL": f"redis://127.0.0.1:{free_port()}/0",  # nothing listens there
        "TUNEHARNESS_FLOWER_PORT": str(flower_port),
        "TUNEHARNESS_FLOWER_USER": "ops",
        "TUNEHARNESS_FLOWER_PASSWORD": "s3cret-pass",
    }
    log = th_home / "up.out"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli.main", "up", "--concurrency", "1"],
            env=env,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    run_dir = th_home / "run"
    try:
        assert wait_until(lambda: "running; Ctrl-C" in log.read_text() or proc.poll() is not None, timeout_s=90)
        assert proc.poll() is None, log.read_text()

        def flower_up() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{flower_port}/", timeout=1).status_code == 401
            except httpx.HTTPError:
                return False

        assert wait_until(flower_up, timeout_s=90), (run_dir / "flower.log").read_text()
        ok = httpx.get(f"http://127.0.0.1:{flower_port}/api/workers", auth=("ops", "s3cret-pass"), timeout=5)
        assert ok.status_code == 200
        assert wait_until(lambda: b"ready." in (run_dir / "worker.log").read_bytes(), timeout_s=90)
        broker = next(line.split()[1] for line in log.read_text().splitlines() if line.startswith("broker"))
        redis_pattern = f"redis-server 127.0.0.1:{broker.rsplit(':', 1)[1].split('/')[0]}"
        assert _running(redis_pattern) and _running(str(run_dir / "celerybeat-schedule"))
        assert "s3cret-pass" not in log.read_text()
        web = next(line.split()[1] for line in log.read_text().splitlines() if line.startswith("web"))
        assert wait_until(lambda: _answers(f"{web}/", auth=None) == 401, timeout_s=60), (
            run_dir / "web.log"
        ).read_text()
        assert _answers(f"{web}/", auth=("ops", "s3cret-pass")) == 200  # Flower's credentials guard the pages too
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    assert proc.returncode == 0, log.read_text()
    assert "stopped" in log.read_text()
    web_port = web.rsplit(":", 1)[1]
    for pattern in (
        redis_pattern,
        str(run_dir / "celerybeat-schedule"),
        f"--port={flower_port}",
        f"web --host 127.0.0.1 --port {web_port}",
    ):
        assert wait_until(lambda p=pattern: not _running(p), timeout_s=10), pattern
