"""The state file `tuneharness up` leaves under TUNEHARNESS_HOME, and what other shells take from it."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

from app import stackstate
from app.settings import load_settings
from app.stack import Stack
from app.stackstate import StackState

BROKER = "redis://127.0.0.1:6390/0"
SIM = "http://127.0.0.1:8765"


def _state(pid: int | None = None, **kw: str) -> StackState:
    return StackState(
        pid=os.getpid() if pid is None else pid,
        host=socket.gethostname(),
        started_at=time.time(),
        broker_url=kw.get("broker_url", BROKER),
        result_url=kw.get("result_url", BROKER),
        sim_url=kw.get("sim_url", SIM),
        sim_scale=kw.get("sim_scale", "10"),
    )


def test_a_shell_that_sets_nothing_takes_the_running_stacks_broker_and_sim(tmp_path: Path) -> None:
    """Given a live `up` recorded for the home, a shell with only TUNEHARNESS_HOME gets its broker,
    result backend, shared simulated marketplace and scale."""
    stackstate.write(tmp_path, _state())
    env = {"TUNEHARNESS_HOME": str(tmp_path)}
    assert stackstate.adopt(env) is not None
    assert env == {
        "TUNEHARNESS_HOME": str(tmp_path),
        "TUNEHARNESS_BROKER_URL": BROKER,
        "TUNEHARNESS_RESULT_URL": BROKER,
        "TUNEHARNESS_SIM_URL": SIM,
        "TUNEHARNESS_SIM_SCALE": "10",
    }
    assert load_settings(env).broker_url == BROKER


def test_what_the_shell_sets_wins_group_by_group(tmp_path: Path) -> None:
    """A shell naming its own broker keeps its own result backend too; the sim still comes from the stack."""
    stackstate.write(tmp_path, _state(result_url="redis://127.0.0.1:6390/1"))
    env = {"TUNEHARNESS_HOME": str(tmp_path), "TUNEHARNESS_BROKER_URL": "redis://elsewhere:6379/0"}
    stackstate.adopt(env)
    assert env["TUNEHARNESS_BROKER_URL"] == "redis://elsewhere:6379/0"
    assert "TUNEHARNESS_RESULT_URL" not in env
    assert env["TUNEHARNESS_SIM_URL"] == SIM


def test_a_stale_state_from_a_killed_up_is_ignored(tmp_path: Path) -> None:
    """The file of an `up` whose process is gone (kill -9) adopts nothing."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stackstate.write(tmp_path, _state(pid=gone.pid))
    env = {"TUNEHARNESS_HOME": str(tmp_path)}
    assert stackstate.adopt(env) is None
    assert env == {"TUNEHARNESS_HOME": str(tmp_path)}


def test_the_file_is_private_and_removed_only_by_its_writer(tmp_path: Path) -> None:
    """Mode 0600 (a broker URL may hold a password); another pid's remove leaves it; garbage reads as none."""
    path = stackstate.write(tmp_path, _state())
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    stackstate.remove(tmp_path, pid=os.getpid() + 1)
    assert path.exists() and stackstate.read(tmp_path) is not None
    stackstate.remove(tmp_path, pid=os.getpid())
    assert not path.exists()
    path.write_text("{not json")
    assert stackstate.read(tmp_path) is None


def test_the_stack_records_what_it_started(tmp_path: Path) -> None:
    """`Stack.state` names its broker, its shared simulated marketplace and scale, Flower and its logs,
    and the children get the same sim URL and scale."""
    settings = load_settings({"TUNEHARNESS_HOME": str(tmp_path), "TUNEHARNESS_FLOWER_PORT": "5599"})
    stack = Stack(settings, run_dir=tmp_path / "run", broker_url=BROKER, sim_trace="smoke", sim_scale=10.0)
    stack.sim_url = SIM
    state = stack.state(started_at=123.0)
    assert (state.broker_url, state.sim_url, state.sim_scale) == (BROKER, SIM, "10")
    assert state.flower_url == "http://127.0.0.1:5599" and state.logs == str(tmp_path / "run")
    assert state.pid == os.getpid() and state.started_at == 123.0
    env = stack.env()
    assert (env["TUNEHARNESS_SIM_URL"], env["TUNEHARNESS_SIM_SCALE"]) == (SIM, "10")
