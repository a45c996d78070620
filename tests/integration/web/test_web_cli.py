"""`tuneharness web` as the real entry point in a subprocess: it serves a brand-new home's pages
on loopback, refuses another address without Flower's credentials, and asks for them when set."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.stack import free_port
from tests.support.services import wait_until

REPO = Path(__file__).resolve().parents[3]


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TUNEHARNESS_", "VAST_", "RUNPOD_"))}
    env.update(TUNEHARNESS_HOME=str(home), PYTHONPATH=str(REPO), **extra)
    return env


def _status(url: str, auth: str | None = None) -> int | None:
    req = urllib.request.Request(url)
    if auth is not None:
        req.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


@pytest.fixture
def web(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    env = _env(tmp_path / "home", TUNEHARNESS_FLOWER_USER="ops", TUNEHARNESS_FLOWER_PASSWORD="pw")
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli.main", "web", "--port", str(port)],
        env=env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield f"http://127.0.0.1:{port}", proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_web_serves_a_new_homes_pages_behind_flowers_credentials(web: tuple[str, subprocess.Popen[bytes]]) -> None:
    """With Flower's credentials set, every page asks for them and answers with them."""
    url, proc = web
    assert wait_until(lambda: _status(url + "/") is not None or proc.poll() is not None, timeout_s=60)
    assert proc.poll() is None
    assert _status(url + "/") == 401
    for path in ("/", "/money", "/reliability", "/api/live.json", "/static/web.css"):
        assert _status(url + path, auth="ops:pw") == 200, path


def test_web_refuses_an_open_address_without_credentials(tmp_path: Path) -> None:
    """`--host 0.0.0.0` with no credentials exits 2 naming the variables to set, and listens on nothing."""
    out = subprocess.run(
        [sys.executable, "-m", "app.cli.main", "web", "--host", "0.0.0.0", "--port", str(free_port())],
        env=_env(tmp_path / "home"),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert "TUNEHARNESS_FLOWER_USER" in out.stderr and "TUNEHARNESS_FLOWER_PASSWORD" in out.stderr
