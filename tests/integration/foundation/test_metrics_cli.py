"""`tuneharness metrics`: printed once, served to Prometheus on loopback, refused on an open address."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx

from support.services import free_port, sigint_default, wait_until

REPO = Path(__file__).resolve().parents[3]


def test_printed_once_in_the_text_format(cli) -> None:  # type: ignore[no-untyped-def]
    out = cli("metrics")
    assert out.returncode == 0, out.stderr
    assert "# TYPE tuneharness_spend_rate_usd_per_hour gauge" in out.stdout
    assert 'tuneharness_jobs{phase="queued"} 0.0' in out.stdout


def test_an_address_other_machines_reach_is_refused_without_allow_remote(cli) -> None:  # type: ignore[no-untyped-def]
    out = cli("metrics", "--serve", "--host", "0.0.0.0", "--port", str(free_port()))
    assert out.returncode == 2 and out.stdout == ""
    (line,) = out.stderr.strip().splitlines()
    assert "0.0.0.0" in line and "--allow-remote" in line and "Fix:" in line


def test_served_on_loopback_until_interrupted(th_env: dict[str, str]) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli.main", "metrics", "--serve", "--port", str(port)],
        env=th_env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=sigint_default,
    )
    try:

        def scraped() -> bool:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)
            except httpx.HTTPError:
                return False
            return r.status_code == 200 and "tuneharness_recoveries_total 0.0" in r.text

        assert wait_until(scraped, timeout_s=60), proc.stderr.read() if proc.poll() is not None else "not answering"
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "stopped" in err
