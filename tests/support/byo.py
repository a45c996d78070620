"""Bring-your-own-training fixtures: a project directory as a user would have it (a tiny random model,
prompt/completion rows, a `transformers.Trainer` or TRL script from `examples/byo/`), the job.json
a host gets for it, and `trainer run` slices driven on job directories that stand for hosts."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = {"trainer": ROOT / "examples" / "byo" / "hf_trainer_sft.py", "trl": ROOT / "examples" / "byo" / "trl_sft.py"}


def write_project(root: Path, *, script: str, model: Path | None = None) -> Path:
    """`root` with `base_model/` (a tiny random Qwen2), `train.jsonl` (64 rows) and `sft.py`."""
    from trainer.tiny import write_tiny_causal_lm

    root.mkdir(parents=True, exist_ok=True)
    if model is None:
        write_tiny_causal_lm(root / "base_model")
    else:
        (root / "base_model").symlink_to(model)
    rows = [{"prompt": f"w{i} x{i % 7} ->", "completion": f" x{i % 7} w{i}"} for i in range(64)]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    shutil.copy(SCRIPTS[script], root / "sft.py")
    return root


def job_json(*, max_steps: int, save_steps: int, seed: int = 1) -> dict[str, Any]:
    """The host's job.json of a Trainer-based `command` job running `sft.py`."""
    return {
        "kind": "command",
        "command": [
            "python",
            "sft.py",
            "--model",
            "base_model",
            "--data",
            "train.jsonl",
            "--max-steps",
            str(max_steps),
            "--save-steps",
            str(save_steps),
            "--seed",
            str(seed),
        ],
        "max_steps": max_steps,
        "adapter_meta": {"base_model": "base_model"},
        "grace_s": 30,
    }


def run_slice(job_dir: Path, env: dict[str, str], *args: str, timeout_s: float = 240) -> int:
    """One `python -m trainer run` on `job_dir`; its exit code."""
    done = subprocess.run(
        [sys.executable, "-m", "trainer", "run", "--job-dir", str(job_dir), *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=timeout_s,
        check=False,
    )
    return done.returncode


def max_abs_diff(a: Path, b: Path) -> float:
    """The largest absolute difference between two adapters' tensors (same names required)."""
    from safetensors.torch import load_file

    got, want = load_file(str(a / "adapter_model.safetensors")), load_file(str(b / "adapter_model.safetensors"))
    assert set(got) == set(want)
    return max(float((got[k] - want[k]).abs().max()) for k in want)
