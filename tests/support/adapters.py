"""Real tiny adapters written by the trainer (as programs: the control plane never imports it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from app.artifacts import ArtifactStore

REPO = Path(__file__).resolve().parents[2]

__all__ = ["REPO", "store_adapter", "train_tiny_adapters", "trainer_env"]


def trainer_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNEHARNESS_")}
    env.update(PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return env


def train_tiny_adapters(root: Path, seeds: tuple[int, ...] = (1, 2), *, steps: int = 2) -> tuple[Path, dict[int, Path]]:
    """A tiny causal LM (`trainer.tiny.write_tiny_causal_lm`) and one adapter per seed from
    `python -m trainer run` (`steps` optimizer steps each). Returns (base model, {seed: adapter})."""
    env = trainer_env()
    base = root / "tiny"
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from trainer.tiny import write_tiny_causal_lm; write_tiny_causal_lm(sys.argv[1])",
            str(base),
        ],
        env=env,
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=300,
    )
    rows = [{"prompt": f"w{i} x{i % 3} ->", "completion": f" x{i % 3}"} for i in range(16)]
    adapters: dict[int, Path] = {}
    for seed in seeds:
        job = root / f"job-seed-{seed}"
        (job / "data").mkdir(parents=True)
        (job / "data" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (job / "job.json").write_text(
            json.dumps(
                {
                    "base_model": str(base),
                    "task": "causal_lm",
                    "train_file": "data/train.jsonl",
                    "max_steps": steps,
                    "checkpoint_every": steps,
                    "seed": seed,
                    "learning_rate": 1e-2,
                    "batch_size": 4,
                    "max_seq_len": 32,
                    "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
                    "quantization": "none",
                }
            )
        )
        done = subprocess.run(
            [sys.executable, "-m", "trainer", "run", "--job-dir", str(job)],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        adapters[seed] = job / "adapter"
    return base, adapters


def store_adapter(store: ArtifactStore, job_id: str, adapter: Path) -> None:
    """Put an adapter into the store as the supervisor leaves it: files first, the manifest last."""
    files = sorted(p for p in adapter.rglob("*") if p.is_file() and p.name != "COMPLETE")
    for p in files:
        store.put_file(f"jobs/{job_id}/adapter/{p.relative_to(adapter).as_posix()}", p)
    store.put_file(f"jobs/{job_id}/adapter/COMPLETE", adapter / "COMPLETE")
