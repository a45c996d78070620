"""kill -9 at random moments: the newest complete checkpoint always loads and the run still finishes.

To fit twenty kills into the test budget, trainer processes are forked from a "zygote" process
that has already imported torch, transformers, peft and bitsandbytes (imports take seconds on a
busy machine). Each fork runs the real `trainer.run.run_job` and is killed with SIGKILL; the
final slice runs as `python -m trainer run`, a plain new process. Every process uses one CPU
thread (forked OpenMP pools crawl, and the final adapter is compared bit for bit with a
reference run, which needs the same thread count). Three kills in four land at a random moment
of training: 0-3 steps after the slice started training plus 0-30 ms (a checkpoint is written
every step, so many land inside a checkpoint write or a prune); every fourth lands at a random
moment of start-up.
"""

from __future__ import annotations

import json
import os
import random
import selectors
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from trainer import checkpoint as ckpt
from trainer.run import EXIT_FINISHED, run_job
from trainer.testing import write_causal_job

ZYGOTE = textwrap.dedent("""
    import os, sys
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    import torch, transformers, peft, bitsandbytes, safetensors.torch  # noqa: F401
    from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig  # noqa: F401
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training  # noqa: F401
    from trainer.run import run_job
    print("ready", flush=True)
    for line in sys.stdin:
        job_dir = line.strip()
        pid = os.fork()
        if pid == 0:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.dup2(null, 2)
            os._exit(run_job(job_dir))
        print("pid", pid, flush=True)
        _, status = os.waitpid(pid, 0)
        print("exit", os.waitstatus_to_exitcode(status), flush=True)
""")

KILLS = 20
JOB = {
    "max_steps": 300,
    "checkpoint_every": 1,
    "batch_size": 2,
    "grad_accum": 1,
    "max_seq_len": 32,
    "eval_file": None,
    "keep_checkpoints": 2,
    "warmup_steps": 0,
}


def _read_line(proc: subprocess.Popen[str], timeout_s: float) -> str | None:
    """The zygote's next line, or None if none came within timeout_s (a bounded wait)."""
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    ready = sel.select(timeout_s)
    sel.close()
    return proc.stdout.readline().strip() if ready else None


def _wait_training(proc: subprocess.Popen[str], job: Path, pid: int, *, steps: int) -> str | None:
    """Wait (bounded) until process `pid` has trained `steps` steps (per status.json); a line if it ended first."""
    first: int | None = None
    for _ in range(6000):
        try:
            status = json.loads((job / "status.json").read_text())
        except (OSError, ValueError):
            status = {}
        if status.get("pid") == pid and status.get("phase") in ("training", "checkpointing"):
            first = status["step"] if first is None else first
            if status["step"] - first >= steps:
                return None
        line = _read_line(proc, 0.005)
        if line is not None:
            return line
    pytest.fail("the trainer never reached the training phase")


def _newest_loads(job: Path) -> int:
    """Step of the newest complete checkpoint after it has been fully loaded; every marked one verifies."""
    root = job / "checkpoints"
    for c in ckpt.list_checkpoints(root):
        if (c.path / ckpt.MARKER).exists():
            ckpt.verify(c.path)  # no checkpoint with a marker is ever corrupt
        else:
            pytest.fail(f"a checkpoint directory without marker was renamed into place: {c.path}")
    latest = ckpt.find_latest(root)
    if latest is None:
        return 0
    state = ckpt.read_state(latest.path / "trainer_state.pt")
    load_file(latest.path / "adapter" / "adapter_model.safetensors")
    assert state["step"] == latest.step
    return latest.step


@pytest.mark.slow
@pytest.mark.long
def test_twenty_kills_never_corrupt_and_run_finishes(
    tmp_path: Path, tiny_model: Path, run_trainer: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    """After each of 20 SIGKILLs the newest complete checkpoint loads; the run then finishes exactly."""
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    job = write_causal_job(tmp_path / "job", base_model=tiny_model, **JOB)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[3]))
    env = {k: v for k, v in env.items() if not k.startswith("TUNEHARNESS_")}
    zygote = subprocess.Popen(
        [sys.executable, "-c", ZYGOTE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert _read_line(zygote, 120) == "ready"
        kills, progress = 0, [0]
        while kills < KILLS:
            assert zygote.stdin is not None
            zygote.stdin.write(f"{job}\n")
            zygote.stdin.flush()
            line = _read_line(zygote, 30)
            assert line is not None and line.startswith("pid "), line
            pid = int(line.split()[1])
            if kills % 4 == 3:
                ended = _read_line(
                    zygote, rng.uniform(0.0, 0.3)
                )  # a random moment of start-up (a fork loads in ~0.2 s)
            else:
                ended = _wait_training(zygote, job, pid, steps=rng.randint(0, 3))
                if ended is None:
                    ended = _read_line(zygote, rng.uniform(0.0, 0.03))  # a random moment of training
            if ended is None:
                os.kill(pid, signal.SIGKILL)
                ended = _read_line(zygote, 30)
                kills += 1
            assert ended is not None and ended.startswith("exit "), ended
            if ended != "exit -9":
                pytest.fail(
                    f"seed {seed}: the run ended by itself ({ended}) before {KILLS} kills; "
                    f"raise max_steps (progress {progress})"
                )
            step = _newest_loads(job)
            assert step >= progress[-1], f"seed {seed}: newest checkpoint went back from {progress[-1]} to {step}"
            progress.append(step)
    finally:
        if zygote.stdin is not None:
            zygote.stdin.close()
        zygote.wait(timeout=30)
    assert progress[-1] > 0, f"seed {seed}: no checkpoint in {KILLS} kills"
    result = run_trainer("run", "--job-dir", str(job), env=dict(env, OMP_NUM_THREADS="1"))
    assert result.returncode == EXIT_FINISHED, result.stdout + result.stderr
    status = json.loads((job / "status.json").read_text())
    assert (status["phase"], status["step"]) == ("finished", JOB["max_steps"])

    reference = write_causal_job(tmp_path / "reference", base_model=tiny_model, **JOB)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert run_job(reference) == EXIT_FINISHED
    finally:
        torch.set_num_threads(threads)
    a = load_file(job / "adapter" / "adapter_model.safetensors")
    b = load_file(reference / "adapter" / "adapter_model.safetensors")
    assert max(float((a[k] - b[k]).abs().max()) for k in a) <= 1e-6, f"seed {seed}; progress {progress}"
