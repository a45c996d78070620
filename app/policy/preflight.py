"""Preflight judgement: does the host compute, and is it the hardware the offer promised?

Input is the one JSON line `trainer/preflight.py` prints (ok, cuda_initialised, gpu_name,
vram_gb, driver, cuda, matmul_finite, tflops_bf16, error, simulated) plus what the offer said.
Output is a verdict: passed, or one named failure:

- `no_compute`: CUDA did not initialise, the matmul was not finite, or the run errored;
- `gpu_mismatch`: the reported model is not the offered one (vendor spellings normalised);
- `vram_short`: less than 95% of the advertised VRAM;
- `throttled`: measured bf16 TFLOP/s below 85% of what that model achieves (`app.policy.gpus`);
  a model the table does not know is judged on the rest, with a warning;
- `ssh_unreachable`, `timeout`: the preflight could not run or did not answer (`unreachable`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from app.policy.gpus import canonical_gpu, expected_tflops_bf16, same_gpu

__all__ = [
    "PreflightFailure",
    "PreflightReport",
    "PreflightVerdict",
    "judge_preflight",
    "unreachable",
]

PreflightFailure = Literal["no_compute", "gpu_mismatch", "vram_short", "throttled", "ssh_unreachable", "timeout"]


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


def judge_preflight(
    report: PreflightReport,
    *,
    offered_gpu_name: str,
    offered_gpu_ram_gb: float,
    min_vram_fraction: float = 0.95,
    min_tflops_fraction: float = 0.85,
    expected_tflops: float | None = None,
) -> PreflightVerdict:
    """Judge a preflight report against the offer. `expected_tflops` overrides the table."""
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
    want = expected_tflops if expected_tflops is not None else expected_tflops_bf16(report.gpu_name)
    if want is None:
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
