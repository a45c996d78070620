"""Serving-box refusal and the simulated preflight."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer.guard import serving_refusal
from trainer.preflight import STALE_DRIVER_ERROR, run_preflight


def test_role_serving_refuses() -> None:
    """TUNEHARNESS_ROLE=serving refuses with a reason that says why and what to do."""
    why = serving_refusal({"TUNEHARNESS_ROLE": "serving"})
    assert why is not None and "inference SLA" in why and "Fix:" in why


def test_marker_file_refuses(tmp_path: Path) -> None:
    """A serving marker file refuses; without it (and without the role) training may run."""
    marker = tmp_path / "serving"
    env = {"TUNEHARNESS_SERVING_MARKER": str(marker)}
    assert serving_refusal(env) is None
    marker.write_text("")
    why = serving_refusal(env)
    assert why is not None and str(marker) in why


def _truth(tmp_path: Path, **fields: object) -> str:
    path = tmp_path / "truth.json"
    path.write_text(json.dumps(fields))
    return str(path)


def test_sim_host_that_does_not_compute_fails_like_a_stale_driver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """computes:false reads like a real stale driver: not ok, CUDA's own error text."""
    monkeypatch.setenv("TUNEHARNESS_SIM_TRUTH", _truth(tmp_path, computes=False))
    result = run_preflight()
    assert result["ok"] is False and result["simulated"] is True
    assert result["error"] == STALE_DRIVER_ERROR and "insufficient" in result["error"]


def test_sim_host_reports_truth(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A computing sim host reports the truth's GPU and expected TFLOP/s times its factor."""
    monkeypatch.setenv(
        "TUNEHARNESS_SIM_TRUTH",
        _truth(
            tmp_path,
            computes=True,
            actual_gpu_name="NVIDIA RTX 3090",
            actual_gpu_ram_gb=24,
            tflops_factor=0.25,
            expected_tflops_bf16=71.0,
        ),
    )
    result = run_preflight()
    assert result["ok"] is True and result["matmul_finite"] is True
    assert (result["gpu_name"], result["vram_gb"], result["tflops_bf16"]) == ("NVIDIA RTX 3090", 24.0, 17.75)
    assert set(result) == {
        "ok",
        "cuda_initialised",
        "gpu_name",
        "vram_gb",
        "driver",
        "cuda",
        "matmul_finite",
        "tflops_bf16",
        "error",
        "simulated",
        "stack",
        "gpu_uuid",
        "host_machine_id",
    }


def test_no_cuda_no_truth_is_a_clear_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a machine without CUDA and without sim truth the report is not ok and says why."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    monkeypatch.delenv("TUNEHARNESS_SIM_TRUTH", raising=False)
    result = run_preflight(size=64, max_seconds=1)
    assert result["ok"] is False and result["error"]
