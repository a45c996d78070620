"""job.json: parsed and validated once; every refusal names the field and the fix."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["SHAPE_FIELDS", "JobError", "JobSpec", "LoraSpec", "load_job", "parse_job", "shape_of"]

TASKS = ("causal_lm", "classification")
SCHEDULES = ("constant", "linear", "cosine")
QUANTIZATIONS = ("nf4", "none")

# Fields whose change alters the trained model's parameters or their meaning: resume refuses them.
SHAPE_FIELDS = ("base_model", "task", "quantization", "lora.r", "lora.target_modules")


class JobError(ValueError):
    """job.json is missing, unreadable or holds a field that cannot work."""

    def __init__(self, field_name: str, problem: str) -> None:
        self.field = field_name
        self.problem = problem
        super().__init__(f"job.json field {field_name!r}: {problem}")


@dataclass(frozen=True, slots=True)
class LoraSpec:
    r: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "v_proj")


@dataclass(frozen=True, slots=True)
class JobSpec:
    base_model: str
    task: str
    train_file: str
    max_steps: int
    checkpoint_every: int
    seed: int
    learning_rate: float
    batch_size: int
    max_seq_len: int
    lora: LoraSpec
    quantization: str
    eval_file: str | None = None
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    grad_accum: int = 1
    # Optional knobs beyond the contract (documented in docs/trainer.md).
    max_grad_norm: float = 1.0
    keep_checkpoints: int = 3
    log_every: int = 1
    status_every_s: float = 5.0
    deterministic: bool = False
    # A held-out validation split of train_file (rows never trained on) and a wall-clock time box.
    weight_decay: float = 0.0
    val_fraction: float = 0.0
    val_seed: int = 0
    time_box_s: float | None = None
    job_dir: Path = field(default=Path("."), compare=False)

    def resolve(self, rel: str) -> Path:
        """A path from job.json: absolute as given, else relative to the job directory."""
        p = Path(rel)
        return p if p.is_absolute() else (self.job_dir / p)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("job_dir")
        d["lora"]["target_modules"] = list(self.lora.target_modules)
        return d


_REQUIRED = (
    "base_model",
    "task",
    "train_file",
    "max_steps",
    "checkpoint_every",
    "seed",
    "learning_rate",
    "batch_size",
    "max_seq_len",
    "lora",
    "quantization",
)
_OPTIONAL = (
    "eval_file",
    "lr_schedule",
    "warmup_steps",
    "grad_accum",
    "max_grad_norm",
    "keep_checkpoints",
    "log_every",
    "status_every_s",
    "deterministic",
    "weight_decay",
    "val_fraction",
    "val_seed",
    "time_box_s",
)
_LORA_FIELDS = ("r", "alpha", "dropout", "target_modules")
_LORA_REQUIRED = ("r", "alpha", "target_modules")


def _int(name: str, value: Any, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise JobError(name, f"must be an integer, got {value!r}")
    if value < minimum:
        raise JobError(name, f"must be at least {minimum}, got {value}")
    return value


def _float(name: str, value: Any, *, minimum: float, strictly: bool = False, maximum: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise JobError(name, f"must be a finite number, got {value!r}")
    v = float(value)
    if v < minimum or (strictly and v == minimum):
        raise JobError(name, f"must be {'>' if strictly else '>='} {minimum}, got {value}")
    if maximum is not None and v > maximum:
        raise JobError(name, f"must be <= {maximum}, got {value}")
    return v


def _str(name: str, value: Any, *, choices: tuple[str, ...] | None = None) -> str:
    if not isinstance(value, str) or not value:
        raise JobError(name, f"must be a non-empty string, got {value!r}")
    if choices is not None and value not in choices:
        raise JobError(name, f"must be one of {', '.join(choices)}, got {value!r}")
    return value


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise JobError(name, f"must be true or false, got {value!r}")
    return value


def _time_box(value: Any) -> float | None:
    if value is None:
        return None
    return _float("time_box_s", value, minimum=0.0, strictly=True)


def _lora(value: Any) -> LoraSpec:
    if not isinstance(value, dict):
        raise JobError("lora", f"must be an object, got {value!r}")
    for key in value:
        if key not in _LORA_FIELDS:
            raise JobError(f"lora.{key}", f"unknown field; known: {', '.join(_LORA_FIELDS)}")
    for key in _LORA_REQUIRED:
        if key not in value:
            raise JobError(f"lora.{key}", "is required")
    targets = value["target_modules"]
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) and t for t in targets):
        raise JobError("lora.target_modules", f"must be a non-empty list of module names, got {targets!r}")
    return LoraSpec(
        r=_int("lora.r", value["r"], minimum=1),
        alpha=_float("lora.alpha", value["alpha"], minimum=0.0, strictly=True),
        dropout=_float("lora.dropout", value.get("dropout", 0.0), minimum=0.0, maximum=0.99),
        target_modules=tuple(targets),
    )


def parse_job(raw: Any, *, job_dir: Path) -> JobSpec:
    """Validate a decoded job.json; raise JobError naming the first bad field."""
    if not isinstance(raw, dict):
        raise JobError("<root>", "job.json must hold a JSON object")
    for key in raw:
        if key not in _REQUIRED and key not in _OPTIONAL:
            raise JobError(key, "unknown field; see docs/trainer.md for the fields job.json takes")
    for key in _REQUIRED:
        if key not in raw:
            raise JobError(key, "is required")
    max_steps = _int("max_steps", raw["max_steps"], minimum=1)
    eval_file = raw.get("eval_file")
    if eval_file is not None:
        eval_file = _str("eval_file", eval_file)
    spec = JobSpec(
        base_model=_str("base_model", raw["base_model"]),
        task=_str("task", raw["task"], choices=TASKS),
        train_file=_str("train_file", raw["train_file"]),
        eval_file=eval_file,
        max_steps=max_steps,
        checkpoint_every=_int("checkpoint_every", raw["checkpoint_every"], minimum=1),
        seed=_int("seed", raw["seed"], minimum=0),
        learning_rate=_float("learning_rate", raw["learning_rate"], minimum=0.0, strictly=True),
        lr_schedule=_str("lr_schedule", raw.get("lr_schedule", "constant"), choices=SCHEDULES),
        warmup_steps=_int("warmup_steps", raw.get("warmup_steps", 0), minimum=0),
        batch_size=_int("batch_size", raw["batch_size"], minimum=1),
        grad_accum=_int("grad_accum", raw.get("grad_accum", 1), minimum=1),
        max_seq_len=_int("max_seq_len", raw["max_seq_len"], minimum=2),
        lora=_lora(raw["lora"]),
        quantization=_str("quantization", raw["quantization"], choices=QUANTIZATIONS),
        max_grad_norm=_float("max_grad_norm", raw.get("max_grad_norm", 1.0), minimum=0.0, strictly=True),
        keep_checkpoints=_int("keep_checkpoints", raw.get("keep_checkpoints", 3), minimum=1),
        log_every=_int("log_every", raw.get("log_every", 1), minimum=1),
        status_every_s=_float("status_every_s", raw.get("status_every_s", 5.0), minimum=0.1, maximum=10.0),
        deterministic=_bool("deterministic", raw.get("deterministic", False)),
        weight_decay=_float("weight_decay", raw.get("weight_decay", 0.0), minimum=0.0, maximum=1.0),
        val_fraction=_float("val_fraction", raw.get("val_fraction", 0.0), minimum=0.0, maximum=0.5),
        val_seed=_int("val_seed", raw.get("val_seed", 0), minimum=0),
        time_box_s=_time_box(raw.get("time_box_s")),
        job_dir=job_dir,
    )
    if spec.warmup_steps > spec.max_steps:
        raise JobError("warmup_steps", f"must not exceed max_steps ({spec.max_steps}), got {spec.warmup_steps}")
    for name in ("train_file", "eval_file"):
        rel = getattr(spec, name)
        if rel is not None and not spec.resolve(rel).is_file():
            raise JobError(name, f"file {spec.resolve(rel)} does not exist")
    if not spec.resolve(spec.base_model).is_dir():
        raise JobError(
            "base_model",
            f"directory {spec.resolve(spec.base_model)} does not exist "
            "(the trainer never downloads; push the model or use a network volume)",
        )
    return spec


def load_job(job_dir: Path) -> JobSpec:
    """Read and validate DIR/job.json."""
    path = job_dir / "job.json"
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise JobError("<file>", f"{path} does not exist") from None
    except (OSError, json.JSONDecodeError) as e:
        raise JobError("<file>", f"{path} is not readable JSON: {e}") from None
    return parse_job(raw, job_dir=job_dir)


def shape_of(job: dict[str, Any], labels: list[str] | None) -> dict[str, Any]:
    """The part of a job (as JSON) that fixes the model's parameters; compared on resume."""
    lora = job.get("lora", {})
    return {
        "base_model": job.get("base_model"),
        "task": job.get("task"),
        "quantization": job.get("quantization"),
        "lora.r": lora.get("r"),
        "lora.target_modules": sorted(lora.get("target_modules", [])),
        "labels": labels,
    }
