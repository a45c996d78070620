"""Preflight judgement: does the host compute, and is it the hardware the offer promised?

Input is the one JSON line `trainer/preflight.py` prints (ok, cuda_initialised, gpu_name,
vram_gb, driver, cuda, matmul_finite, tflops_bf16, error, simulated) plus what the offer said.
Output is a verdict: passed, or one named failure:

- `no_compute`: CUDA did not initialise, the matmul was not finite, or the run errored;
- `gpu_mismatch`: the reported model is not the offered one (vendor spellings normalised);
- `vram_short`: less than 95% of the advertised VRAM;
- `throttled`: measured bf16 TFLOP/s below what that model must reach: with `speed`, what
  `app.policy.speeds` learned from our own passing preflights (85% of the median over machines,
  a seed, or a floor); without it, 85% of `app.policy.gpus`' table. A model neither knows is
  judged on the rest, with a warning;
- `stack_missing`: the host's Python lacks a package of the trainer's stack (`TRAINER_STACK`,
  the report's `stack`): the trainer would die at its first import. Judged after the hardware's
  identity, before its speed; a report without a `stack` (an older preflight) is not judged on it;
- `ssh_unreachable`, `timeout`: the preflight could not run or did not answer (`unreachable`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from app.policy.gpus import canonical_gpu, expected_tflops_bf16, same_gpu
from app.policy.speeds import SpeedExpectation

__all__ = [
    "TRAINER_STACK",
    "PreflightFailure",
    "PreflightReport",
    "PreflightVerdict",
    "judge_preflight",
    "unreachable",
]

PreflightFailure = Literal[
    "no_compute", "gpu_mismatch", "vram_short", "throttled", "stack_missing", "ssh_unreachable", "timeout"
]

# What `python -m trainer` imports (distribution names, as trainer/preflight.py's STACK_MODULES
# reports them; a test keeps this list, that one and trainer/requirements.txt in agreement).
TRAINER_STACK: tuple[str, ...] = (
    "torch",
    "transformers",
    "peft",
    "accelerate",
    "bitsandbytes",
    "safetensors",
    "tokenizers",
    "huggingface-hub",
    "numpy",
)


@dataclass(frozen=True, slots=True)
class PreflightReport:
    """The preflight's JSON line, typed. Missing fields read as 'not shown'."""

    ok: bool = False
    cuda_initialised: bool = False
    gpu_name: str | None = None
    vram_gb: float | None = None
    driver: str | None = None
    cuda: str | None = None
    matmul_finite: bool = False
    tflops_bf16: float | None = None
    error: str | None = None
    simulated: bool = False
    # The hardware's own identity (the GPU's UUID, the host's /etc/machine-id), where it could be read.
    gpu_uuid: str | None = None
    host_machine_id: str | None = None
    # The trainer's stack as this host's Python imports it: package -> version (absent: not importable).
    stack: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> PreflightReport:
        def _num(key: str) -> float | None:
            v = data.get(key)
            return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None

        def _str(key: str) -> str | None:
            v = data.get(key)
            return str(v) if v is not None else None

        # `cuda_init` and `gpu_ram_gb` are accepted as older spellings of the same fields.
        return cls(
            ok=bool(data.get("ok", False)),
            cuda_initialised=bool(data.get("cuda_initialised", data.get("cuda_init", False))),
            gpu_name=_str("gpu_name"),
            vram_gb=_num("vram_gb") if "vram_gb" in data else _num("gpu_ram_gb"),
            driver=_str("driver"),
            cuda=_str("cuda"),
            matmul_finite=bool(data.get("matmul_finite", False)),
            tflops_bf16=_num("tflops_bf16"),
            error=_str("error"),
            simulated=bool(data.get("simulated", False)),
            gpu_uuid=_str("gpu_uuid"),
            host_machine_id=_str("host_machine_id"),
            stack={str(k): str(v) for k, v in stack.items()} if isinstance(stack := data.get("stack"), Mapping) else {},
        )


@dataclass(frozen=True, slots=True)
class PreflightVerdict:
    passed: bool
    failure: PreflightFailure | None
    evidence: str
    warnings: tuple[str, ...] = ()


def unreachable(kind: Literal["ssh_unreachable", "timeout"], detail: str) -> PreflightVerdict:
    """The verdict when the preflight never produced a report."""
    return PreflightVerdict(False, kind, detail)


def _stack_missing(report: PreflightReport) -> str | None:
    """Evidence that the host cannot run the trainer, or None (complete, or no stack reported)."""
    missing = [p for p in TRAINER_STACK if p not in report.stack] if report.stack else []
    if not missing:
        return None
    has = ", ".join(f"{k} {v}" for k, v in sorted(report.stack.items()))
    return f"the trainer's stack is incomplete: {', '.join(missing)} not importable (has {has})"


def judge_preflight(
    report: PreflightReport,
    *,
    offered_gpu_name: str,
    offered_gpu_ram_gb: float,
    min_vram_fraction: float = 0.95,
    min_tflops_fraction: float = 0.85,
    expected_tflops: float | None = None,
    speed: SpeedExpectation | None = None,
) -> PreflightVerdict:
    """Judge a preflight report against the offer. `expected_tflops` overrides the table; `speed`
    (what `app.policy.speeds` learned for the model) overrides both."""
    if not report.cuda_initialised or not report.matmul_finite or report.error:
        why = report.error or ("CUDA did not initialise" if not report.cuda_initialised else "matmul not finite")
        return PreflightVerdict(False, "no_compute", f"no compute: {why}")
    tflops = report.tflops_bf16
    if tflops is None or not math.isfinite(tflops) or tflops <= 0:
        return PreflightVerdict(False, "no_compute", f"no usable TFLOP/s measurement ({tflops})")
    if not report.gpu_name or not same_gpu(offered_gpu_name, report.gpu_name):
        return PreflightVerdict(
            False,
            "gpu_mismatch",
            f"offer says {offered_gpu_name!r}, host reports {report.gpu_name!r}",
        )
    if report.vram_gb is None or report.vram_gb < min_vram_fraction * offered_gpu_ram_gb:
        return PreflightVerdict(
            False,
            "vram_short",
            f"VRAM {report.vram_gb} GB < {min_vram_fraction:.0%} of advertised {offered_gpu_ram_gb:g} GB",
        )
    if missing := _stack_missing(report):
        return PreflightVerdict(False, "stack_missing", missing)
    if speed is not None and speed.min_tflops_bf16 is not None:
        return _judge_speed(report.gpu_name, tflops, speed)
    want = expected_tflops if expected_tflops is not None else expected_tflops_bf16(report.gpu_name)
    if want is None or speed is not None:
        return PreflightVerdict(
            True,
            None,
            f"{report.gpu_name}: {tflops:.1f} bf16 TFLOP/s",
            (f"GPU model {canonical_gpu(report.gpu_name)!r} is not in the TFLOP/s table: throughput not judged",),
        )
    if tflops < min_tflops_fraction * want:
        return PreflightVerdict(
            False,
            "throttled",
            f"{tflops:.1f} bf16 TFLOP/s < {min_tflops_fraction:.0%} of {want:.1f} expected for "
            f"{canonical_gpu(report.gpu_name)} ({tflops / want:.0%})",
        )
    return PreflightVerdict(
        True, None, f"{report.gpu_name}: {tflops:.1f} bf16 TFLOP/s ({tflops / want:.0%} of expected)"
    )


def _judge_speed(gpu_name: str, tflops: float, speed: SpeedExpectation) -> PreflightVerdict:
    """Throughput judged against what `app.policy.speeds` expects of the model."""
    least = speed.min_tflops_bf16 or 0.0
    want = speed.tflops_bf16 if speed.tflops_bf16 and speed.tflops_bf16 > 0 else least
    if tflops < least:
        return PreflightVerdict(
            False,
            "throttled",
            f"{tflops:.1f} bf16 TFLOP/s < {least:.1f}, the least a healthy {speed.model} may reach "
            f"({tflops / want:.0%} of {want:.1f}: {speed.describe()})",
        )
    return PreflightVerdict(
        True, None, f"{gpu_name}: {tflops:.1f} bf16 TFLOP/s ({tflops / want:.0%} of {want:.1f}: {speed.describe()})"
    )
