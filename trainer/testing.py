"""Ready-made jobs for tests, the demo and the benchmark (tiny, deterministic, no downloads)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

__all__ = ["causal_rows", "classification_rows", "write_causal_job", "write_classification_job", "write_jsonl"]

_WORDS = ["alpha", "beta", "gamma", "delta", "omega", "red", "green", "blue", "cat", "dog"]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def causal_rows(n: int, *, seed: int = 0) -> list[dict[str, Any]]:
    """Prompt/completion rows with a learnable rule: the completion repeats the prompt reversed."""
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    for i in range(n):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(2, 5))]
        if i % 4 == 3:
            rows.append(
                {
                    "messages": [
                        {"role": "user", "content": " ".join(words)},
                        {"role": "assistant", "content": " ".join(reversed(words))},
                    ]
                }
            )
        else:
            rows.append({"prompt": " ".join(words) + " ->", "completion": " " + " ".join(reversed(words))})
    return rows


def classification_rows(n: int, *, seed: int = 0) -> list[dict[str, Any]]:
    """Short texts labelled by sentiment words (easy for MiniLM)."""
    rng = random.Random(seed)
    good = ["great", "wonderful", "excellent", "lovely", "superb"]
    bad = ["awful", "terrible", "horrible", "dreadful", "poor"]
    things = ["film", "meal", "service", "book", "trip"]
    rows = []
    for _ in range(n):
        label = rng.choice(["positive", "negative"])
        word = rng.choice(good if label == "positive" else bad)
        rows.append({"text": f"the {rng.choice(things)} was {word}", "label": label})
    return rows


def write_causal_job(job_dir: Path, *, base_model: Path, rows: int = 32, **overrides: Any) -> Path:
    """A causal_lm job directory on the tiny model; fields overridable by keyword."""
    job_dir.mkdir(parents=True, exist_ok=True)
    write_jsonl(job_dir / "train.jsonl", causal_rows(rows, seed=1))
    write_jsonl(job_dir / "eval.jsonl", causal_rows(8, seed=2))
    job: dict[str, Any] = {
        "base_model": str(base_model),
        "task": "causal_lm",
        "train_file": "train.jsonl",
        "eval_file": "eval.jsonl",
        "max_steps": 12,
        "checkpoint_every": 4,
        "seed": 1,
        "learning_rate": 1e-2,
        "lr_schedule": "cosine",
        "warmup_steps": 2,
        "batch_size": 4,
        "grad_accum": 2,
        "max_seq_len": 64,
        "lora": {"r": 4, "alpha": 8, "dropout": 0.1, "target_modules": ["q_proj", "v_proj"]},
        "quantization": "nf4",
    }
    job.update(overrides)
    (job_dir / "job.json").write_text(json.dumps(job, indent=1))
    return job_dir


def write_classification_job(job_dir: Path, *, base_model: Path, rows: int = 32, **overrides: Any) -> Path:
    """A classification job directory (MiniLM by default in tests)."""
    job_dir.mkdir(parents=True, exist_ok=True)
    write_jsonl(job_dir / "train.jsonl", classification_rows(rows, seed=1))
    write_jsonl(job_dir / "eval.jsonl", classification_rows(16, seed=2))
    job: dict[str, Any] = {
        "base_model": str(base_model),
        "task": "classification",
        "train_file": "train.jsonl",
        "eval_file": "eval.jsonl",
        "max_steps": 8,
        "checkpoint_every": 4,
        "seed": 1,
        "learning_rate": 1e-3,
        "batch_size": 8,
        "max_seq_len": 32,
        "lora": {"r": 4, "alpha": 8, "dropout": 0.1, "target_modules": ["query", "value"]},
        "quantization": "nf4",
    }
    job.update(overrides)
    (job_dir / "job.json").write_text(json.dumps(job, indent=1))
    return job_dir
