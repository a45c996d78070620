"""`tuneharness up --sim` records what it started; a command in another shell (nothing but
TUNEHARNESS_HOME set) finds the broker and the shared simulated marketplace there, and doctor does
not call beat's tasks overdue in the first minutes after `up`."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from app import stackstate
from tests.support.services import wait_until

REPO = Path(__file__).resolve().parents[3]


def test_another_shell_finds_the_running_stack(th_env: dict[str, str], th_home: Path) -> None:
    """While `up --sim smoke` runs, `doctor --json` from a shell without TUNEHARNESS_BROKER_URL or
    TUNEHARNESS_SIM_URL reaches the stack's broker and shared marketplace, with beat on time; Ctrl-C
    removes the state file."""
    log = th_home / "up.out"
    with log.open("w") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli.main", "up", "--no-flower", "--concurrency", "1", "--sim", "smoke"],
            env=th_env,
            cwd=REPO,
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
    try:
        assert wait_until(lambda: "running; Ctrl-C" in log.read_text() or proc.poll() is not None, timeout_s=90)
        assert proc.poll() is None, log.read_text()
        state = stackstate.read(th_home)
        assert state is not None and state.pid == proc.pid
        assert state.broker_url == th_env["TUNEHARNESS_BROKER_URL"] and state.sim_url.startswith("http://127.0.0.1:")

        other_shell = {k: v for k, v in th_env.items() if k != "TUNEHARNESS_BROKER_URL"}
        other_shell["TUNEHARNESS_BROKER_URL"] = ""  # set but empty: as good as unset
        out = subprocess.run(
            [sys.executable, "-m", "app.cli.main", "doctor", "--json"],
            env=other_shell,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        checks = {c["name"]: c for c in json.loads(out.stdout)}
        assert checks["stack"]["ok"] and str(proc.pid) in checks["stack"]["detail"]
        assert checks["broker"] == {**checks["broker"], "ok": True, "detail": state.broker_url}
        assert checks["vendor sim"]["ok"] and f"shared marketplace at {state.sim_url}" in checks["vendor sim"]["detail"]
        assert checks["beat"]["ok"], checks["beat"]  # no beat task has had three intervals since `up`
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=90)
    assert proc.returncode == 0, log.read_text()
    assert stackstate.read(th_home) is None
