"""`status --watch`: redrawn in place on a terminal, printed refresh after refresh into a pipe, one
JSON object a line with --json; Ctrl-C ends each cleanly."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
import threading
from pathlib import Path

from support.services import sigint_default, wait_until

REPO = Path(__file__).resolve().parents[3]
CMD = [sys.executable, "-m", "app.cli.main", "status", "--watch", "--interval", "0.5"]


def _stop(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGINT)
    return proc.wait(timeout=30)


def _piped(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    proc = subprocess.Popen(
        [*CMD, *args], env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=sigint_default
    )
    out: list[bytes] = []
    reader = threading.Thread(target=lambda: out.extend(iter(proc.stdout.readline, b"")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        assert wait_until(lambda: b"".join(out).count(b"interruptions") >= 2, timeout_s=60), out
    finally:
        rc = _stop(proc)
        reader.join(timeout=10)
    return rc, b"".join(out).decode(), proc.stderr.read().decode()  # type: ignore[union-attr]


def test_on_a_terminal_it_redraws_in_place(th_env: dict[str, str]) -> None:
    master, slave = pty.openpty()
    env = {**th_env, "COLUMNS": "160", "LINES": "50", "TERM": "xterm"}
    proc = subprocess.Popen(CMD, env=env, cwd=REPO, stdout=slave, stderr=subprocess.PIPE, preexec_fn=sigint_default)
    os.close(slave)
    out = bytearray()

    def read() -> None:
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                return
            if not chunk:
                return
            out.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert wait_until(lambda: out.count(b"interruptions") >= 2, timeout_s=60), bytes(out)
    finally:
        rc = _stop(proc)
        reader.join(timeout=10)
        os.close(master)
    assert rc == 0 and b"Traceback" not in proc.stderr.read()  # type: ignore[union-attr]
    assert b"\x1b[2K" in out and b"\x1b[2J" not in out  # lines erased and redrawn, never the whole screen


def test_into_a_pipe_each_refresh_follows_the_last(th_env: dict[str, str]) -> None:
    rc, out, err = _piped(th_env)
    assert rc == 0 and "Traceback" not in err and "\x1b[" not in out and out.count("jobs") >= 2


def test_json_streams_one_object_per_line(th_env: dict[str, str]) -> None:
    rc, out, err = _piped(th_env, "--json")
    lines = [json.loads(x) for x in out.splitlines() if x.strip()]
    assert rc == 0 and "Traceback" not in err and len(lines) >= 2
    assert all({"jobs", "hosts", "interruptions"} <= set(d) for d in lines)
