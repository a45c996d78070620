"""Exact resume: a run cut into slices at checkpoints equals the uninterrupted run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from trainer.models import minilm_path
from trainer.reporting import parse_line
from trainer.run import EXIT_BAD_JOB, EXIT_CAP, EXIT_FINISHED, run_job
from trainer.testing import write_causal_job, write_classification_job


def _max_abs_diff(a: Path, b: Path) -> float:
    wa, wb = (
        load_file(a / "adapter" / "adapter_model.safetensors"),
        load_file(b / "adapter" / "adapter_model.safetensors"),
    )
    assert set(wa) == set(wb)
    return max(float((wa[k] - wb[k]).abs().max()) for k in wa)


@pytest.mark.slow
def test_causal_nf4_resumed_over_slices_equals_uninterrupted(tmp_path: Path, tiny_model: Path) -> None:
    """Given dropout, grad accumulation and a cosine schedule with warm-up, five slices equal one run."""
    fields = {
        "max_steps": 10,
        "checkpoint_every": 2,
        "lora": {"r": 4, "alpha": 8, "dropout": 0.2, "target_modules": ["q_proj", "v_proj"]},
    }
    whole = write_causal_job(tmp_path / "whole", base_model=tiny_model, **fields)
    sliced = write_causal_job(tmp_path / "sliced", base_model=tiny_model, **fields)
    assert run_job(whole) == EXIT_FINISHED
    codes = [run_job(sliced, slice_steps=2) for _ in range(5)]
    assert codes == [EXIT_CAP] * 4 + [EXIT_FINISHED]
    assert _max_abs_diff(whole, sliced) <= 1e-6
    resumes = [
        p[2]["step"]
        for p in map(parse_line, (sliced / "train.log").read_text().splitlines())
        if p is not None and p[1] == "resume"
    ]
    assert resumes == ["2", "4", "6", "8"]
    assert json.loads((sliced / "status.json").read_text())["step"] == 10


@pytest.mark.slow
def test_a_deterministic_job_turns_on_torchs_deterministic_kernels_and_resumes_exactly(
    tmp_path: Path, tiny_model: Path
) -> None:
    """`deterministic: true` is what made a resumed run bit-identical on an H200 (bench/gpu.py);
    on the CPU it must run the same NF4 job, say so in train.log, and still resume exactly."""
    import torch

    fields = {"max_steps": 4, "checkpoint_every": 2, "deterministic": True}
    whole = write_causal_job(tmp_path / "whole", base_model=tiny_model, **fields)
    sliced = write_causal_job(tmp_path / "sliced", base_model=tiny_model, **fields)
    try:
        assert run_job(whole) == EXIT_FINISHED
        assert torch.are_deterministic_algorithms_enabled()
        assert [run_job(sliced, slice_steps=2) for _ in range(2)] == [EXIT_CAP, EXIT_FINISHED]
    finally:
        torch.use_deterministic_algorithms(False)
    assert _max_abs_diff(whole, sliced) == 0.0
    starts = [
        p[2]
        for p in map(parse_line, (sliced / "train.log").read_text().splitlines())
        if p is not None and p[1] == "start"
    ]
    assert [s["deterministic"] for s in starts] == ["true", "true"]


@pytest.mark.slow
def test_classification_nf4_resume_equals_uninterrupted(tmp_path: Path) -> None:
    """A MiniLM NF4 classification run resumed at a checkpoint equals the uninterrupted run (head included)."""
    fields = {"max_steps": 4, "checkpoint_every": 2, "batch_size": 4}
    whole = write_classification_job(tmp_path / "whole", base_model=minilm_path(), **fields)
    sliced = write_classification_job(tmp_path / "sliced", base_model=minilm_path(), **fields)
    assert run_job(whole) == EXIT_FINISHED
    assert [run_job(sliced, slice_steps=2), run_job(sliced)] == [EXIT_CAP, EXIT_FINISHED]
    weights = load_file(sliced / "adapter" / "adapter_model.safetensors")
    assert any("classifier" in k for k in weights)
    assert _max_abs_diff(whole, sliced) <= 1e-6


def test_resume_refuses_a_change_of_shape(tmp_path: Path, tiny_model: Path) -> None:
    """After a checkpoint, changing lora.r makes the next slice refuse, naming the field; lr may change."""
    job = write_causal_job(tmp_path / "job", base_model=tiny_model, max_steps=4, checkpoint_every=1)
    assert run_job(job, slice_steps=1) == EXIT_CAP
    spec = json.loads((job / "job.json").read_text())
    spec["lora"]["r"] = 8
    (job / "job.json").write_text(json.dumps(spec))
    assert run_job(job) == EXIT_BAD_JOB
    last = parse_line((job / "train.log").read_text().splitlines()[-1])
    assert last is not None and last[1] == "failed" and "lora.r" in last[2]["reason"]
    spec["lora"]["r"] = 4
    spec["learning_rate"] = 1e-3
    (job / "job.json").write_text(json.dumps(spec))
    assert run_job(job, slice_steps=1) == EXIT_CAP
    assert "config_changed fields=learning_rate" in (job / "train.log").read_text()
