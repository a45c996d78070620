"""What a GPU model computes on the preflight's matmul, learned from our own passing preflights.

A datasheet's peak is not what a healthy card reaches on the preflight's timed 4096 bf16 matmul:
an H200 reaches 72% of it, consumer Ampere/Ada cards 65-80%. Judging a host against its datasheet
destroys healthy consumer cards as `throttled`. So the expectation is learned, per GPU model:

- each passing preflight is a sample `(machine, TFLOP/s)`; a machine counts once (the median of
  its own samples), so one host preflighted many times does not outvote the others;
- from `MIN_MACHINES` (3) distinct machines on, a healthy card of the model reaches the median of
  their values, and a host below `THROTTLED_FRACTION` (85%) of it is `throttled`. A median of
  three or more is moved by neither one fast outlier nor one throttled host that passed earlier;
- until then, a model measured on our own bench (`app.policy.gpus`: the H200, and the H100s that
  share its processor) is expected at that figure (the seed);
- any other model is held only to the floor: `FLOOR_FRACTION_OF_DATASHEET` (55%) of its datasheet
  peak. A healthy consumer card at 65% of its datasheet passes; a card at half its peak is caught;
- a job may name its own figure (`needs.expected_tflops`), which overrides all of this.

Pure: the driver loads the samples of the reported model and the job's override into the
`PreflightResult` observation, and stores a passing preflight's sample (`Record.tflops_bf16`).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from app.policy.gpus import (
    DATASHEET_PEAK_TFLOPS_BF16,
    EXPECTED_TFLOPS_BF16,
    FAMILY_ACHIEVED_FRACTION,
    canonical_gpu,
)

__all__ = [
    "FLOOR_FRACTION_OF_DATASHEET",
    "MIN_MACHINES",
    "SEED_TFLOPS_BF16",
    "THROTTLED_FRACTION",
    "SpeedExpectation",
    "SpeedSample",
    "SpeedSource",
    "expected_speed",
    "per_machine",
    "speed_model",
]

MIN_MACHINES = 3
THROTTLED_FRACTION = 0.85
FLOOR_FRACTION_OF_DATASHEET = 0.55
# What our own bench measured (and what shares that processor): app.policy.gpus.
SEED_TFLOPS_BF16: dict[str, float] = {name: EXPECTED_TFLOPS_BF16[name] for name in FAMILY_ACHIEVED_FRACTION}

SpeedSource = Literal["override", "measured", "seed", "floor", "unknown"]


@dataclass(frozen=True, slots=True)
class SpeedSample:
    """One passing preflight: the machine it ran on and the bf16 TFLOP/s it measured."""

    machine_id: str
    tflops_bf16: float


@dataclass(frozen=True, slots=True)
class SpeedExpectation:
    """What a healthy card of `model` reaches, and the least a host of it must measure."""

    model: str
    source: SpeedSource
    tflops_bf16: float | None = None  # a healthy card's figure (the floor's: the datasheet peak)
    min_tflops_bf16: float | None = None  # below this: throttled; None: throughput not judged
    machines: int = 0  # distinct machines measured for this model

    def describe(self) -> str:
        if self.source == "measured":
            return f"median of {self.machines} machines measured"
        if self.source == "seed":
            return f"measured on our bench; {self.machines} of {MIN_MACHINES} machines measured here"
        if self.source == "floor":
            return (
                f"floor {FLOOR_FRACTION_OF_DATASHEET:.0%} of the datasheet's {self.tflops_bf16:g} until "
                f"{MIN_MACHINES} machines are measured ({self.machines} so far)"
            )
        if self.source == "override":
            return "the job's needs.expected_tflops"
        return "not in the TFLOP/s table"


def speed_model(gpu_name: str) -> str:
    """The key samples are kept under: the canonical model (`NVIDIA GeForce RTX 3090` -> `RTX 3090`)."""
    return canonical_gpu(gpu_name)


def per_machine(samples: Iterable[SpeedSample]) -> dict[str, float]:
    """One value per machine: the median of that machine's own samples (finite, positive ones)."""
    by: dict[str, list[float]] = {}
    for s in samples:
        if s.tflops_bf16 > 0 and s.tflops_bf16 == s.tflops_bf16 and s.tflops_bf16 != float("inf"):
            by.setdefault(s.machine_id, []).append(s.tflops_bf16)
    return {m: float(statistics.median(v)) for m, v in by.items()}


def _datasheet(model: str) -> float | None:
    if model in DATASHEET_PEAK_TFLOPS_BF16:
        return DATASHEET_PEAK_TFLOPS_BF16[model]
    if model == "A100":
        return DATASHEET_PEAK_TFLOPS_BF16["A100 SXM4"]
    return None


def expected_speed(
    gpu_name: str,
    samples: Sequence[SpeedSample] | Mapping[str, float] = (),
    *,
    override: float | None = None,
    min_machines: int = MIN_MACHINES,
    throttled_fraction: float = THROTTLED_FRACTION,
    floor_fraction: float = FLOOR_FRACTION_OF_DATASHEET,
) -> SpeedExpectation:
    """The expectation for a host reporting `gpu_name`, from the samples of that model.

    `samples`: passing preflights of the model on our machines (or already one value per machine).
    """
    model = speed_model(gpu_name)
    values = dict(samples) if isinstance(samples, Mapping) else per_machine(samples)
    n = len(values)
    if override is not None and override > 0:
        return SpeedExpectation(model, "override", override, throttled_fraction * override, n)
    if n >= max(min_machines, 1):
        med = float(statistics.median(values.values()))
        return SpeedExpectation(model, "measured", med, throttled_fraction * med, n)
    seed = SEED_TFLOPS_BF16.get(model)
    if seed is not None:
        return SpeedExpectation(model, "seed", seed, throttled_fraction * seed, n)
    peak = _datasheet(model)
    if peak is not None:
        return SpeedExpectation(model, "floor", peak, floor_fraction * peak, n)
    return SpeedExpectation(model, "unknown", None, None, n)
