"""job.json validation: every refusal names the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trainer.jobspec import JobError, load_job, parse_job, shape_of
from trainer.run import lr_factor


def _job(tmp_path: Path, **changes: Any) -> dict[str, Any]:
    (tmp_path / "model").mkdir(exist_ok=True)
    (tmp_path / "train.jsonl").write_text('{"prompt": "a", "completion": "b"}\n')
    job: dict[str, Any] = {
        "base_model": "model",
        "task": "causal_lm",
        "train_file": "train.jsonl",
        "max_steps": 10,
        "checkpoint_every": 5,
        "seed": 1,
        "learning_rate": 2e-4,
        "batch_size": 2,
        "max_seq_len": 32,
        "lora": {"r": 8, "alpha": 16, "target_modules": ["q_proj"]},
        "quantization": "nf4",
    }
    job.update(changes)
    return job


def test_valid_job_gets_defaults_for_optional_fields(tmp_path: Path) -> None:
    """A job with only the required fields parses, with documented defaults for the rest."""
    spec = parse_job(_job(tmp_path), job_dir=tmp_path)
    assert (spec.lr_schedule, spec.warmup_steps, spec.grad_accum, spec.lora.dropout, spec.eval_file) == (
        "constant",
        0,
        1,
        0.0,
        None,
    )
    assert spec.resolve(spec.train_file) == tmp_path / "train.jsonl"


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"max_stepz": 3}, "max_stepz"),
        ({"task": "regression"}, "task"),
        ({"max_steps": 0}, "max_steps"),
        ({"max_steps": "10"}, "max_steps"),
        ({"learning_rate": -1}, "learning_rate"),
        ({"quantization": "int3"}, "quantization"),
        ({"lr_schedule": "step"}, "lr_schedule"),
        ({"lora": {"r": 8, "alpha": 16}}, "lora.target_modules"),
        ({"lora": {"r": 0, "alpha": 16, "target_modules": ["q"]}}, "lora.r"),
        ({"lora": {"r": 8, "alpha": 16, "target_modules": ["q"], "rank": 3}}, "lora.rank"),
        ({"train_file": "missing.jsonl"}, "train_file"),
        ({"base_model": "nowhere"}, "base_model"),
        ({"warmup_steps": 11}, "warmup_steps"),
        ({"batch_size": True}, "batch_size"),
        ({"deterministic": "yes"}, "deterministic"),
        ({"deterministic": 1}, "deterministic"),
    ],
)
def test_bad_field_is_named(tmp_path: Path, changes: dict[str, Any], field: str) -> None:
    """An unknown or invalid field is refused with an error that names it."""
    with pytest.raises(JobError) as info:
        parse_job(_job(tmp_path, **changes), job_dir=tmp_path)
    assert info.value.field == field
    assert repr(field) in str(info.value)


def test_missing_required_field_is_named(tmp_path: Path) -> None:
    """A missing required field is named."""
    job = _job(tmp_path)
    del job["seed"]
    with pytest.raises(JobError, match="'seed'"):
        parse_job(job, job_dir=tmp_path)


def test_unreadable_job_file_is_refused(tmp_path: Path) -> None:
    """A job.json that is not JSON is refused with the file named."""
    (tmp_path / "job.json").write_text("{not json")
    with pytest.raises(JobError, match=r"job\.json"):
        load_job(tmp_path)


def test_shape_ignores_training_knobs_but_not_rank() -> None:
    """The shape compared on resume changes with lora.r, not with learning_rate."""
    a = {
        "base_model": "m",
        "task": "causal_lm",
        "quantization": "nf4",
        "learning_rate": 1,
        "lora": {"r": 8, "target_modules": ["v", "q"]},
    }
    b = dict(a, learning_rate=2, lora={"r": 8, "target_modules": ["q", "v"]})
    c = dict(a, lora={"r": 16, "target_modules": ["q", "v"]})
    assert shape_of(a, None) == shape_of(b, None)
    assert shape_of(a, None) != shape_of(c, None)


def test_lr_schedules_warm_up_then_decay() -> None:
    """Warm-up rises linearly; linear and cosine reach zero at max_steps; constant stays at one."""
    assert [lr_factor(s, schedule="constant", warmup_steps=2, max_steps=10) for s in (0, 1, 2, 9)] == [0.5, 1, 1, 1]
    assert lr_factor(10, schedule="linear", warmup_steps=0, max_steps=10) == 0.0
    assert lr_factor(5, schedule="linear", warmup_steps=0, max_steps=10) == pytest.approx(0.5)
    assert lr_factor(10, schedule="cosine", warmup_steps=0, max_steps=10) == pytest.approx(0.0)
    assert lr_factor(0, schedule="cosine", warmup_steps=0, max_steps=10) == pytest.approx(1.0)


def test_job_json_roundtrip_keeps_fields(tmp_path: Path) -> None:
    """to_json writes back every field it read (it is what checkpoints store)."""
    spec = parse_job(_job(tmp_path), job_dir=tmp_path)
    again = parse_job(json.loads(json.dumps(spec.to_json())), job_dir=tmp_path)
    assert again == spec
