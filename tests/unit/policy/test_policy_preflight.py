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


# The JSON lines `python -m trainer preflight` printed on two healthy NVIDIA H200s (bench/gpu.py,
# 2026-12-04): the fastest and slowest of six 4096 runs.
H200_MEASURED = [
    '{"ok": true, "cuda_initialised": true, "gpu_name": "NVIDIA H200", "vram_gb": 139.8, "driver": "580.159.04", '
    '"cuda": "13.0", "matmul_finite": true, "tflops_bf16": 713.612, "error": null, "simulated": false}',
    '{"ok": true, "cuda_initialised": true, "gpu_name": "NVIDIA H200", "vram_gb": 139.8, "driver": "580.159.04", '
    '"cuda": "13.0", "matmul_finite": true, "tflops_bf16": 683.749, "error": null, "simulated": false}',
]


@pytest.mark.parametrize("line", H200_MEASURED)
def test_a_healthy_h200s_real_preflight_passes(line: str) -> None:
    """Judged against the datasheet alone (989.5 dense), both real H200s read as throttled (72%,
    69%): the table's H200 figure is what the preflight measured, so healthy ones pass."""
    import json

    r = PreflightReport.from_mapping(json.loads(line))
    v = judge_preflight(r, offered_gpu_name="H200", offered_gpu_ram_gb=141)
    assert v.passed, v.evidence
    assert judge_preflight(r, offered_gpu_name="H200", offered_gpu_ram_gb=141,
                           expected_tflops=989.5).failure == "throttled"


def test_an_h200_at_three_quarters_of_its_measured_speed_is_throttled() -> None:
    slow = report(gpu_name="NVIDIA H200", vram_gb=139.8, tflops_bf16=0.75 * 709.2)
    assert judge(slow, gpu="H200", ram=141) == "throttled"
