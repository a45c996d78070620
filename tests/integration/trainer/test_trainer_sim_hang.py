"""On a simulated host whose truth says it hangs, `trainer run` hangs like a stuck collective."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from trainer.reporting import parse_line
from trainer.testing import write_causal_job

REPO = Path(__file__).resolve().parents[3]
HANG_AFTER_S = 8.0  # wall seconds after launch; loading takes a few, so some steps come first


def _status(job: Path) -> dict[str, Any]:
    try:
        status: dict[str, Any] = json.loads((job / "status.json").read_text())
    except (OSError, ValueError):
        return {}
    return status


def _stamp_s(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()


def _wait(proc: subprocess.Popen[bytes], condition: Callable[[], bool], what: str) -> None:
    """Bounded wait (at most ~120 s) for `condition` while the trainer keeps running."""
    for _ in range(2400):
        if condition():
            return
        try:
            proc.wait(timeout=0.05)
        except subprocess.TimeoutExpired:
            continue
        pytest.fail(f"the trainer exited ({proc.returncode}) before {what}")
    pytest.fail(f"timed out waiting for {what}")


@pytest.mark.slow
def test_trainer_hangs_at_the_truths_instant_and_stays_alive(
    tmp_path: Path, tiny_model: Path, trainer_env: Callable[..., dict[str, str]]
) -> None:
    """Past hangs_at_epoch_s (sim clock at scale 60) no step is taken or logged, the heartbeat goes on with a
    frozen step, SIGTERM is not honoured; only SIGKILL ends the process."""
    job = write_causal_job(
        tmp_path / "job",
        base_model=tiny_model,
        max_steps=100000,
        checkpoint_every=1000,
        eval_file=None,
        status_every_s=0.2,
    )
    launch = time.time()
    hang_wall_s = launch + HANG_AFTER_S
    epoch = launch - 100.0  # the sim clock runs 60x from an epoch before the launch
    truth = {
        "format": "tuneharness-sim-truth/1",
        "computes": True,
        "hangs_at_s": 1.0,
        "hangs_at_epoch_s": epoch + 60.0 * (hang_wall_s - epoch),
        "clock": {"scale": 60.0, "epoch_s": epoch},
    }
    (tmp_path / "truth.json").write_text(json.dumps(truth))
    env = trainer_env(TUNEHARNESS_SIM_TRUTH=str(tmp_path / "truth.json"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer", "run", "--job-dir", str(job)],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait(
            proc,
            lambda: time.time() > hang_wall_s + 1.0 and _status(job).get("phase") == "training",
            "the hang instant passed in training",
        )
        frozen = _status(job)
        log_size = (job / "train.log").stat().st_size
        proc.send_signal(signal.SIGTERM)
        beats: set[str] = set()

        def heartbeats_go_on() -> bool:
            status = _status(job)
            if status:
                assert (status["step"], status["phase"], status["exit_code"]) == (frozen["step"], "training", None)
                beats.add(status["updated_at"])
            return len(beats) >= 4

        _wait(proc, heartbeats_go_on, "four more heartbeats")
        assert (job / "train.log").stat().st_size == log_size, "a hung trainer writes nothing more"
        assert proc.poll() is None
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = [p for p in map(parse_line, (job / "train.log").read_text().splitlines()) if p is not None]
    steps = [p for p in lines if p[1] == "step"]
    assert all(_stamp_s(p[0]) < hang_wall_s + 1.0 for p in steps), "no step after the hang instant"
    assert lines[-1][1] in ("start", "step") and int(frozen["step"]) < 100000
