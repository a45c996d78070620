"""`tuneharness up` starts a child that died again, as compose's `restart: unless-stopped` does (a
worker exits when its broker vanishes mid-restart), and gives up, naming the log, when one keeps
dying."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from app.errors import UserError
from app.settings import load_settings
from app.stack import MAX_RESTARTS, RESTART_WINDOW_S, Stack

SLEEPER = [sys.executable, "-c", "import signal; print('up', flush=True); signal.pause()"]  # runs until killed


def _stack(tmp_path: Path) -> Stack:
    return Stack(load_settings({"TUNEHARNESS_HOME": str(tmp_path)}), run_dir=tmp_path / "run")


def test_a_child_that_died_is_started_again_with_its_command_and_log(tmp_path: Path) -> None:
    stack = _stack(tmp_path)
    child = stack._spawn("worker", SLEEPER)
    try:
        first = child.proc
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        said = stack.check_alive(now=1000.0)
        assert len(said) == 1 and "worker exited with code -9; started again" in said[0]
        assert child.proc is not first and child.proc.poll() is None
        assert stack.check_alive(now=1001.0) == []  # alive: nothing to do
    finally:
        stack.stop(grace_s=5)


def test_one_that_keeps_dying_stops_the_stack_naming_its_log(tmp_path: Path) -> None:
    stack = _stack(tmp_path)
    child = stack._spawn("beat", [sys.executable, "-c", "print('boom'); raise SystemExit(3)"])
    try:
        for i in range(MAX_RESTARTS):
            child.proc.wait(timeout=30)
            assert stack.check_alive(now=100.0 + i)
        child.proc.wait(timeout=30)
        with pytest.raises(UserError, match=rf"beat exited with code 3 {MAX_RESTARTS + 1} times") as info:
            stack.check_alive(now=100.0 + MAX_RESTARTS)
        assert str(child.log) in str(info.value) and "boom" in str(info.value)
        # restarts older than the window do not count
        child.restarts = [t - RESTART_WINDOW_S for t in child.restarts]
        assert stack.check_alive(now=100.0 + MAX_RESTARTS)
    finally:
        stack.stop(grace_s=5)
