"""Preflight judgement: named failures from the preflight's JSON line and the offer."""

from __future__ import annotations

import pytest

from app.policy.preflight import PreflightReport, judge_preflight, unreachable


def report(**kw: object) -> PreflightReport:
    base: dict[str, object] = {"ok": True, "cuda_initialised": True, "gpu_name": "NVIDIA GeForce RTX 3090",
                               "vram_gb": 24.0, "matmul_finite": True, "tflops_bf16": 70.0}
    base.update(kw)
    return PreflightReport.from_mapping(base)


def judge(r: PreflightReport, gpu: str = "RTX 3090", ram: float = 24.0) -> str | None:
    return judge_preflight(r, offered_gpu_name=gpu, offered_gpu_ram_gb=ram).failure


def test_healthy_host_passes() -> None:
    """A card that computes at its model's speed with its advertised VRAM passes."""
    v = judge_preflight(report(), offered_gpu_name="RTX 3090", offered_gpu_ram_gb=24)
    assert v.passed and v.failure is None and not v.warnings


@pytest.mark.parametrize(
    ("kw", "failure"),
    [
        ({"cuda_initialised": False, "error": "CUDA driver version is insufficient"}, "no_compute"),
        ({"matmul_finite": False}, "no_compute"),
        ({"tflops_bf16": None}, "no_compute"),
        ({"gpu_name": "NVIDIA GeForce RTX 3080"}, "gpu_mismatch"),
        ({"vram_gb": 22.0}, "vram_short"),
        ({"tflops_bf16": 55.4}, "throttled"),
    ],
)
def test_named_failures(kw: dict[str, object], failure: str) -> None:
    """Each lie is caught with its own name."""
    assert judge(report(**kw)) == failure


def test_vram_at_95_percent_passes() -> None:
    """95% of the advertised VRAM is enough (drivers reserve some)."""
    assert judge(report(vram_gb=22.8)) is None


def test_unknown_model_is_judged_on_the_rest_with_a_warning() -> None:
    """A card the table does not know passes on CUDA, name and VRAM, with a warning."""
    v = judge_preflight(report(gpu_name="Tesla V100-SXM2-16GB", vram_gb=16.0, tflops_bf16=1.0),
                        offered_gpu_name="V100 SXM2", offered_gpu_ram_gb=16)
    assert v.passed and v.warnings and "not in the TFLOP/s table" in v.warnings[0]


def test_older_field_spellings_are_read() -> None:
    """`cuda_init` and `gpu_ram_gb` are read as `cuda_initialised` and `vram_gb`."""
    r = PreflightReport.from_mapping({"cuda_init": True, "gpu_ram_gb": 24, "matmul_finite": True,
                                      "gpu_name": "RTX 3090", "tflops_bf16": 71.0})
    assert r.cuda_initialised and r.vram_gb == 24.0


def test_unreachable_verdicts() -> None:
    """No report at all is ssh_unreachable or timeout, as the driver saw it."""
    assert unreachable("timeout", "no answer in 180s").failure == "timeout"
    assert not unreachable("ssh_unreachable", "refused").passed
