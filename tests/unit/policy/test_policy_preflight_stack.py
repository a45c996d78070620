"""Preflight judgement of the trainer's stack: a host whose Python cannot import it fails `stack_missing`."""

from __future__ import annotations

from app.policy.preflight import TRAINER_STACK, PreflightReport, judge_preflight

FULL = {name: "1.0" for name in TRAINER_STACK}


def judge(**kw: object) -> tuple[str | None, str]:
    base: dict[str, object] = {
        "ok": True,
        "cuda_initialised": True,
        "gpu_name": "NVIDIA GeForce RTX 3090",
        "vram_gb": 24.0,
        "matmul_finite": True,
        "tflops_bf16": 70.0,
        "stack": FULL,
    }
    base.update(kw)
    v = judge_preflight(PreflightReport.from_mapping(base), offered_gpu_name="RTX 3090", offered_gpu_ram_gb=24)
    return v.failure, v.evidence


def test_a_complete_stack_passes() -> None:
    """Every package of the stack reported: the host passes."""
    assert judge()[0] is None


def test_a_bare_image_fails_stack_missing_naming_what_is_missing() -> None:
    """Only torch importable (a pytorch runtime image): `stack_missing`, the evidence names the rest."""
    failure, evidence = judge(stack={"torch": "2.5.1"})
    assert failure == "stack_missing"
    assert "transformers" in evidence and "peft" in evidence and "has torch 2.5.1" in evidence


def test_one_missing_package_is_enough() -> None:
    """A stack without bitsandbytes cannot run a QLoRA job: `stack_missing`."""
    failure, evidence = judge(stack={k: v for k, v in FULL.items() if k != "bitsandbytes"})
    assert failure == "stack_missing" and "bitsandbytes not importable" in evidence


def test_a_report_without_a_stack_is_not_judged_on_it() -> None:
    """An older preflight that reports no stack is judged on the hardware alone."""
    assert judge(stack=None)[0] is None


def test_lying_hardware_is_named_before_a_missing_stack() -> None:
    """A wrong card on a bare image is a `gpu_mismatch` (the permanent reason), not `stack_missing`."""
    assert judge(gpu_name="NVIDIA GeForce RTX 3080", stack={"torch": "2.5.1"})[0] == "gpu_mismatch"
    assert judge(cuda_initialised=False, error="no CUDA", stack={"torch": "2.5.1"})[0] == "no_compute"
