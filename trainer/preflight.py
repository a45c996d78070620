"""`python -m trainer preflight`: prove that this host's GPU computes, in one JSON line.

Needs only torch. On a real host: torch.cuda.init(), device name, total memory, driver and CUDA
versions, a bf16 matmul checked for finiteness and timed (warm-up, then batches of iterations until
two successive measurements agree within 3% or the time budget is spent).

On a simulated host (TUNEHARNESS_SIM_TRUTH=/path/truth.json) it runs a small bf16 matmul on the
CPU and reports what the truth dictates, failing the way a real host would when `computes` is false.
Both report `stack`: the version of each package of the trainer's stack this Python finds
(`STACK_MODULES`), so the control plane can refuse a host that cannot run the trainer
(`stack_missing`) before training is handed to it.
Exit 0 when ok, 1 otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

__all__ = ["main_preflight", "run_preflight"]

SIM_TRUTH_ENV = "TUNEHARNESS_SIM_TRUTH"
STALE_DRIVER_ERROR = (
    "CUDA driver version is insufficient for CUDA runtime version (cudaErrorInsufficientDriver, error 35)"
)
# The trainer's stack as the preflight reports it: import name -> distribution name. A package is
# reported when this Python finds it (without importing it: transformers alone takes seconds),
# with its installed version. The control plane's judgement requires each (app/policy/preflight.py,
# TRAINER_STACK; a test keeps the two lists and trainer/requirements.txt in agreement).
STACK_MODULES: dict[str, str] = {
    "torch": "torch",
    "transformers": "transformers",
    "peft": "peft",
    "accelerate": "accelerate",
    "bitsandbytes": "bitsandbytes",
    "safetensors": "safetensors",
    "tokenizers": "tokenizers",
    "huggingface_hub": "huggingface-hub",
    "numpy": "numpy",
}


def stack_report() -> dict[str, str]:
    """Distribution name -> version for each package of the trainer's stack this Python can import."""
    import importlib.util
    from importlib import metadata

    found: dict[str, str] = {}
    for module, dist in STACK_MODULES.items():
        try:
            if importlib.util.find_spec(module) is None:
                continue
            found[dist] = metadata.version(dist)
        except (ImportError, ValueError, metadata.PackageNotFoundError):
            continue
    return found


def _blank(simulated: bool) -> dict[str, Any]:
    return {
        "ok": False,
        "cuda_initialised": False,
        "gpu_name": None,
        "vram_gb": None,
        "driver": None,
        "cuda": None,
        "matmul_finite": False,
        "tflops_bf16": None,
        "error": None,
        "simulated": simulated,
        "stack": {},
        "gpu_uuid": None,
        "host_machine_id": None,
    }


def _host_machine_id(path: str = "/etc/machine-id") -> str | None:
    """This host's /etc/machine-id (None where there is none)."""
    try:
        with open(path, encoding="utf-8") as fh:
            value = fh.read().strip()
    except OSError:
        return None
    return value or None


def _gpu_uuid(props: Any) -> str | None:
    """The first GPU's UUID: torch's device properties where it has them, else nvidia-smi."""
    raw = getattr(props, "uuid", None)
    if raw:
        text = str(raw)
        return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader", "--id=0"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    line = out.stdout.strip().splitlines()
    return line[0].strip() if out.returncode == 0 and line and line[0].strip() else None


def _driver_version() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    line = out.stdout.strip().splitlines()
    return line[0].strip() if out.returncode == 0 and line else None


def _cpu_matmul_finite(size: int = 128) -> bool:
    import torch

    g = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=g).to(torch.bfloat16)
    b = torch.randn(size, size, generator=g).to(torch.bfloat16)
    return bool(torch.isfinite(a @ b).all())


def _simulated(truth_path: str) -> dict[str, Any]:
    result = _blank(True)
    try:
        with open(truth_path, encoding="utf-8") as fh:
            truth = json.load(fh)
        if not isinstance(truth, dict):
            raise ValueError("truth must be a JSON object")
    except (OSError, ValueError) as e:
        result["error"] = f"cannot read simulated truth {truth_path}: {e}"
        return result
    if not truth.get("computes", True):
        result["error"] = STALE_DRIVER_ERROR
        result["driver"] = truth.get("driver")
        return result
    result["cuda_initialised"] = True
    result["gpu_name"] = truth.get("actual_gpu_name")
    ram = truth.get("actual_gpu_ram_gb")
    result["vram_gb"] = float(ram) if ram is not None else None
    result["driver"] = truth.get("driver", "sim")
    result["gpu_uuid"] = truth.get("gpu_uuid")
    result["host_machine_id"] = truth.get("host_machine_id")
    result["cuda"] = truth.get("cuda", "sim")
    result["matmul_finite"] = _cpu_matmul_finite()
    expected = truth.get("expected_tflops_bf16")
    factor = truth.get("tflops_factor", 1.0)
    result["tflops_bf16"] = round(float(expected) * float(factor), 3) if expected is not None else None
    result["ok"] = result["matmul_finite"]
    if not result["matmul_finite"]:
        result["error"] = "bf16 matmul produced non-finite values"
    return result


def _real(size: int, max_seconds: float) -> dict[str, Any]:
    import torch

    result = _blank(False)
    result["cuda"] = torch.version.cuda
    result["driver"] = _driver_version()
    result["host_machine_id"] = _host_machine_id()
    if not torch.cuda.is_available() and torch.version.cuda is None:
        result["error"] = "this torch build has no CUDA support (CPU-only wheel) and no simulated truth is set"
        return result
    try:
        torch.cuda.init()
        result["cuda_initialised"] = True
        props = torch.cuda.get_device_properties(0)
        result["gpu_name"] = props.name
        result["vram_gb"] = round(props.total_memory / 2**30, 2)
        result["gpu_uuid"] = _gpu_uuid(props)
        a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
        c = a @ b
        torch.cuda.synchronize()
        result["matmul_finite"] = bool(torch.isfinite(c).all())
        result["tflops_bf16"] = round(_time_matmul(a, b, max_seconds=max_seconds), 3)
    except Exception as e:  # every CUDA failure is a finding, reported in the JSON line
        result["error"] = f"{type(e).__name__}: {e}".strip()
        return result
    result["ok"] = result["matmul_finite"] and (result["tflops_bf16"] or 0) > 0
    if not result["matmul_finite"]:
        result["error"] = "bf16 matmul produced non-finite values"
    return result


def _time_matmul(a: Any, b: Any, *, max_seconds: float) -> float:
    import torch

    flop = 2.0 * a.shape[0] * a.shape[1] * b.shape[1]
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    deadline = time.perf_counter() + max_seconds
    iters, previous, best = 10, None, 0.0
    while time.perf_counter() < deadline:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            a @ b
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1000.0
        tflops = flop * iters / seconds / 1e12
        best = max(best, tflops)
        if seconds < 0.05:
            iters *= 2
            continue
        if previous is not None and abs(tflops - previous) <= 0.03 * max(tflops, previous):
            return float(max(tflops, previous))
        previous = tflops
    return best


def run_preflight(*, size: int = 4096, max_seconds: float = 10.0) -> dict[str, Any]:
    """The preflight report as a dict (the JSON line's content)."""
    truth = os.environ.get(SIM_TRUTH_ENV)
    result = _simulated(truth) if truth else _real(size, max_seconds)
    result["stack"] = stack_report()
    return result


def main_preflight(*, size: int = 4096, max_seconds: float = 10.0) -> int:
    try:
        result = run_preflight(size=size, max_seconds=max_seconds)
    except Exception as e:  # import failures of torch itself, for example
        result = _blank(bool(os.environ.get(SIM_TRUTH_ENV)))
        result["error"] = f"{type(e).__name__}: {e}"
    print(json.dumps(result), flush=True)
    if result["error"] and not result["ok"]:
        print(result["error"], file=sys.stderr, flush=True)
    return 0 if result["ok"] else 1
