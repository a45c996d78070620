"""What renter-side code observes on a simulated host, computed from its truth.

Two views of the same truth:
- `truth_file(...)`: the JSON written into a sim host's sandbox; `trainer/preflight.py` and the
  trainer read it through `TUNEHARNESS_SIM_TRUTH` and behave as that host would.
- `preflight_report(truth)`: the JSON line a preflight would print on that host, for the
  campaign simulator, which does not open SSH.

A host's bf16 TFLOP/s is its model's datasheet peak x the model's `healthy_fraction` (the trace's
`gpu_models`) x the host's `tflops_factor`: the truth, never what the policy expects of the model.
"""

from __future__ import annotations

from typing import Any

from app.policy.gpus import DATASHEET_PEAK_TFLOPS_BF16, canonical_gpu
from app.policy.preflight import TRAINER_STACK
from providers.sim.trace import HostTruth

__all__ = [
    "CUDA_DRIVER_ERROR",
    "DATASHEET_TFLOPS_BF16",
    "bootstrap_s",
    "datasheet_tflops_bf16",
    "healthy_tflops_bf16",
    "image_stack",
    "preflight_report",
    "truth_file",
]

# Datasheet bf16 peaks (dense, FP32 accumulate) of cards app.policy.gpus does not list.
DATASHEET_TFLOPS_BF16: dict[str, float] = {
    "RTX 3060": 25.4,
    "RTX 4070": 58.3,
    "RTX 4080": 97.5,
    "RTX A4000": 76.7,
    "RTX A5000": 111.1,
}

# the text torch raises on a host whose driver is older than the image's CUDA runtime; the same
# text `trainer/preflight.py` reports on a simulated host with `computes: false`
CUDA_DRIVER_ERROR = (
    "CUDA driver version is insufficient for CUDA runtime version (cudaErrorInsufficientDriver, error 35)"
)


def datasheet_tflops_bf16(gpu_name: str) -> float | None:
    """The datasheet's dense bf16 peak of a GPU model, or None when the model is unknown."""
    model = canonical_gpu(gpu_name)
    if model == "A100":
        model = "A100 SXM4"
    return DATASHEET_PEAK_TFLOPS_BF16.get(model, DATASHEET_TFLOPS_BF16.get(model))


def healthy_tflops_bf16(truth: HostTruth) -> float | None:
    """What a healthy card of this host's actual model measures (before the host's own factor)."""
    peak = datasheet_tflops_bf16(truth.actual_gpu_name)
    return None if peak is None else peak * truth.healthy_fraction


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
        # a healthy card of the actual model; trainer/preflight.py multiplies by tflops_factor
        "expected_tflops_bf16": healthy_tflops_bf16(truth),
        "gpu_uuid": truth.gpu_uuid,
        "host_machine_id": truth.host_machine_id,
        "cuda_error": None if truth.computes else CUDA_DRIVER_ERROR,
        # the hang, in the simulated clock's seconds; `clock` says how to read that clock
        "hangs_at_s": truth.hangs_at_s,
        "hangs_at_epoch_s": None if truth.hangs_at_s is None else created_at_s + truth.hangs_at_s,
        "created_at_s": created_at_s,
        "clock": clock,
        "train_step_s": train_step_s,
        "train_start_s": train_start_s,
        "image": truth.image,
    }


def image_stack(image: str, *, bootstrapped: bool = False) -> dict[str, str]:
    """The trainer's stack a preflight reports on a host with this image: all of it on the trainer
    image or once the bootstrap installed it, only torch on a bare one."""
    if image == "trainer" or bootstrapped:
        return {name: "sim" for name in TRAINER_STACK}
    return {"torch": "sim"}


def bootstrap_s(truth: HostTruth, *, cached: bool = False) -> float:
    """Simulated seconds `python -m trainer bootstrap` takes on this host: its `install_s` on a bare
    image the first time, nothing where the stack is already there."""
    return truth.install_s if truth.image == "bare" and not cached else 0.0


def preflight_report(truth: HostTruth, *, bootstrapped: bool = False) -> dict[str, Any]:
    """The JSON line `python -m trainer preflight` prints on a running host with this truth
    (after the bootstrap when `bootstrapped`).

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
        "gpu_uuid": None,
        "host_machine_id": None,
        "stack": image_stack(truth.image, bootstrapped=bootstrapped),
    }
    if not truth.computes:
        report["error"] = CUDA_DRIVER_ERROR
        return report
    full = healthy_tflops_bf16(truth)
    report.update(
        gpu_uuid=truth.gpu_uuid,
        host_machine_id=truth.host_machine_id,
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
