"""`python -m trainer slices`: forked slices, each a transaction, equal one uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from trainer import checkpoint as ckpt
from trainer.reporting import parse_line
from trainer.run import EXIT_CAP, EXIT_FAILED, EXIT_FINISHED, run_job
from trainer.testing import write_causal_job

REPO = Path(__file__).resolve().parents[3]
JOB = {
    "max_steps": 40,
    "checkpoint_every": 4,
    "batch_size": 2,
    "max_seq_len": 32,
    "eval_file": None,
    "warmup_steps": 0,
    "status_every_s": 0.2,
}


def _events(job: Path) -> list[tuple[str, dict[str, str]]]:
    lines = [parse_line(x) for x in (job / "train.log").read_text().splitlines()]
    return [(p[1], p[2]) for p in lines if p is not None]


def _status(job: Path) -> dict[str, Any]:
    try:
        status: dict[str, Any] = json.loads((job / "status.json").read_text())
    except (OSError, ValueError):
        return {}
    return status


def _wait_for(proc: subprocess.Popen[bytes], condition: Callable[[], bool], what: str) -> None:
    """Bounded wait (at most ~120 s) until `condition` holds while `proc` is still running."""
    for _ in range(2400):
        if condition():
            return
        try:
            proc.wait(timeout=0.05)
        except subprocess.TimeoutExpired:
            continue
        pytest.fail(f"the runner exited ({proc.returncode}) before {what}")
    pytest.fail(f"timed out waiting for {what}")


def _starts(job: Path) -> list[int]:
    return [int(f["pid"]) for e, f in _events(job) if e == "start"] if (job / "train.log").exists() else []


def _started(job: Path, *, more_than: int) -> Callable[[], bool]:
    """More than `more_than` slices have written their `start` line."""
    return lambda: len(_starts(job)) > more_than


@pytest.mark.slow
def test_slices_survive_sigterm_and_a_killed_slice_and_equal_one_run(
    tmp_path: Path, tiny_model: Path, trainer_env: Callable[..., dict[str, str]]
) -> None:
    """SIGTERM ends the runner resumable (exit 3); a SIGKILLed slice fails it (exit 1, named); a third
    runner finishes, and the adapter equals an uninterrupted run's within 1e-6."""
    job = write_causal_job(tmp_path / "job", base_model=tiny_model, **JOB)
    env = trainer_env(OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "trainer", "slices", "--job-dir", str(job), "--slice-steps", "5"]

    # 1. SIGTERM to the runner once its second slice runs: forwarded, checkpointed, exit 3
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(proc, _started(job, more_than=1), "the second slice started")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == EXIT_CAP
    finally:
        if proc.poll() is None:
            proc.kill()
    events = _events(job)
    assert len(set(_starts(job))) >= 2 and proc.pid not in _starts(job), "each slice is a process of its own"
    assert events[-1][0] == "cap"
    stopped_at = int(events[-1][1]["step"])
    latest = ckpt.find_latest(job / "checkpoints")
    assert latest is not None and latest.step == stopped_at

    # 2. SIGKILL of a running slice (as the OOM killer): the runner says so, the checkpoint is intact
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        done = len(_starts(job))
        for _ in range(100):
            _wait_for(proc, _started(job, more_than=done), "a slice of the second runner started")
            try:
                os.kill(_starts(job)[-1], signal.SIGKILL)
                break
            except ProcessLookupError:  # that slice had just ended; kill the next one
                done = len(_starts(job))
        assert proc.wait(timeout=60) == EXIT_FAILED
    finally:
        if proc.poll() is None:
            proc.kill()
    event, fields = _events(job)[-1]
    assert event == "failed" and "killed by SIGKILL" in fields["reason"]
    assert _status(job)["phase"] == "failed"
    latest = ckpt.find_latest(job / "checkpoints")
    assert latest is not None and latest.step >= stopped_at

    # 3. a third runner resumes and finishes; the result equals one uninterrupted run
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=180, check=False)
    assert result.returncode == EXIT_FINISHED, result.stdout + result.stderr
    assert (_status(job)["phase"], _status(job)["step"]) == ("finished", JOB["max_steps"])
    resumes = [int(f["step"]) for e, f in _events(job) if e == "resume"]
    assert resumes == sorted(resumes) and len(resumes) >= 3

    reference = write_causal_job(tmp_path / "reference", base_model=tiny_model, **JOB)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert run_job(reference) == EXIT_FINISHED
    finally:
        torch.set_num_threads(threads)
    a = load_file(job / "adapter" / "adapter_model.safetensors")
    b = load_file(reference / "adapter" / "adapter_model.safetensors")
    assert max(float((a[k] - b[k]).abs().max()) for k in a) <= 1e-6


def test_slices_refuses_a_missing_job_and_needs_a_cap(
    tmp_path: Path, run_trainer: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    """Without job.json the runner exits 2 before importing anything; without a cap argparse refuses."""
    result = run_trainer("slices", "--job-dir", str(tmp_path), "--slice-seconds", "5")
    assert result.returncode == 2 and "job.json" in result.stdout
    result = run_trainer("slices", "--job-dir", str(tmp_path))
    assert result.returncode == 2 and "--slice-seconds" in result.stderr
