"""What renter-side code observes on a simulated host, computed from its truth.

Two views of the same truth:
- `truth_file(...)`: the JSON written into a sim host's sandbox; `trainer/preflight.py` and the
  trainer read it through `TUNEHARNESS_SIM_TRUTH` and behave as that host would.
- `preflight_report(truth)`: the JSON line a preflight would print on that host, for the
  campaign simulator, which does not open SSH.
"""

from __future__ import annotations

from typing import Any

from app.policy.gpus import expected_tflops_bf16 as policy_expected
from providers.sim.trace import HostTruth

__all__ = [
    "CUDA_DRIVER_ERROR",
    "EXPECTED_TFLOPS_BF16",
    "expected_tflops_bf16",
    "preflight_report",
    "truth_file",
]

# Full-speed bf16 TFLOP/s of a healthy card. The policy's table (app.policy.gpus) comes first so a
# healthy sim card measures exactly what the preflight judgement expects; these fill the gaps for
# cards it does not list (dense bf16 tensor peak, FP32 accumulate, from the datasheets).
EXPECTED_TFLOPS_BF16: dict[str, float] = {
    "RTX 3060": 25.4,
    "RTX 3080": 59.5,
    "RTX 3090": 71.0,
    "RTX 4070": 58.3,
    "RTX 4080": 97.5,
    "RTX 4090": 165.2,
    "RTX A4000": 76.7,
    "RTX A5000": 111.1,
    "RTX A6000": 154.8,
    "A40": 149.7,
    "L40S": 362.0,
    "A100 PCIE": 312.0,
    "A100 SXM4": 312.0,
    "H100 PCIE": 756.5,
    "H100 SXM": 989.5,
}

# the text torch raises on a host whose driver is older than the image's CUDA runtime; the same
# text `trainer/preflight.py` reports on a simulated host with `computes: false`
CUDA_DRIVER_ERROR = (
    "CUDA driver version is insufficient for CUDA runtime version (cudaErrorInsufficientDriver, error 35)"
)


def expected_tflops_bf16(gpu_name: str) -> float | None:
    """Full-speed bf16 TFLOP/s of a GPU model, or None when the model is unknown."""
    known = policy_expected(gpu_name)
    if known is not None:
        return known
    return EXPECTED_TFLOPS_BF16.get(gpu_name.strip().upper().replace("GEFORCE ", "").replace("NVIDIA ", ""))


def truth_file(
    truth: HostTruth,
    *,
    instance_id: str,
    machine_id: str,
    created_at_s: float,
    clock: dict[str, float] | None = None,
    train_step_s: float | None = None,
    train_start_s: float | None = None,
) -> dict[str, Any]:
    """The truth JSON written into a sim host's sandbox (TUNEHARNESS_SIM_TRUTH).

    `train_step_s`: simulated seconds one training step takes on this host at full speed (its
    `tflops_factor` slows it), after `train_start_s` to start up; None leaves the trainer at its
    own pace.
    """
    return {
        "format": "tuneharness-sim-truth/1",
        "instance_id": instance_id,
        "machine_id": machine_id,
        "computes": truth.computes,
        "actual_gpu_name": truth.actual_gpu_name,
        "actual_gpu_ram_gb": truth.actual_gpu_ram_gb,
        "tflops_factor": truth.tflops_factor,
        "expected_tflops_bf16": expected_tflops_bf16(truth.actual_gpu_name),
        "cuda_error": None if truth.computes else CUDA_DRIVER_ERROR,
        # the hang, in the simulated clock's seconds; `clock` says how to read that clock
        "hangs_at_s": truth.hangs_at_s,
        "hangs_at_epoch_s": None if truth.hangs_at_s is None else created_at_s + truth.hangs_at_s,
        "created_at_s": created_at_s,
        "clock": clock,
        "train_step_s": train_step_s,
        "train_start_s": train_start_s,
    }


def preflight_report(truth: HostTruth) -> dict[str, Any]:
    """The JSON line `python -m trainer preflight` prints on a running host with this truth.

    Same keys and values as trainer/preflight.py's simulated mode, so the campaign simulator
    (no SSH) and the Celery path (real SSH) feed the judgement the same observation.
    """
    report: dict[str, Any] = {
        "ok": False,
        "cuda_initialised": False,
        "gpu_name": None,
        "vram_gb": None,
        "driver": None,
        "cuda": None,
        "matmul_finite": False,
        "tflops_bf16": None,
        "error": None,
        "simulated": True,
    }
    if not truth.computes:
        report["error"] = CUDA_DRIVER_ERROR
        return report
    full = expected_tflops_bf16(truth.actual_gpu_name)
    report.update(
        ok=True,
        cuda_initialised=True,
        gpu_name=truth.actual_gpu_name,
        vram_gb=float(truth.actual_gpu_ram_gb),
        driver="sim",
        cuda="sim",
        matmul_finite=True,
        tflops_bf16=None if full is None else round(full * truth.tflops_factor, 3),
    )
    return report
