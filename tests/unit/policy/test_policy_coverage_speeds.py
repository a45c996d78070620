"""Speed expectations the main tests leave undriven: their descriptions, bad samples, a bare A100."""

from __future__ import annotations

import math

from app.policy.speeds import FLOOR_FRACTION_OF_DATASHEET, SpeedSample, expected_speed, per_machine


def test_each_source_describes_itself() -> None:
    """A seeded model names the bench; a model outside the table says so."""
    seeded = expected_speed("NVIDIA H200", [SpeedSample("m1", 700.0)])
    assert seeded.source == "seed"
    assert seeded.describe() == "measured on our bench; 1 of 3 machines measured here"
    unknown = expected_speed("Radeon 7900")
    assert unknown.source == "unknown" and unknown.min_tflops_bf16 is None
    assert unknown.describe() == "not in the TFLOP/s table"


def test_samples_that_are_not_positive_finite_numbers_are_dropped() -> None:
    """Zero, negative, NaN and infinite measurements count for no machine."""
    values = {"m1": 0.0, "m2": -5.0, "m3": math.nan, "m4": math.inf}
    samples = [*(SpeedSample(m, v) for m, v in values.items()), SpeedSample("m5", 60.0), SpeedSample("m5", 70.0)]
    assert per_machine(samples) == {"m5": 65.0}


def test_a_bare_a100_is_held_to_the_floor_of_the_sxm4_datasheet() -> None:
    """An A100 that does not say its form factor is judged against the A100 SXM4 datasheet peak."""
    speed = expected_speed("A100")
    assert speed.source == "floor" and speed.tflops_bf16 == 312.0
    assert speed.min_tflops_bf16 == FLOOR_FRACTION_OF_DATASHEET * 312.0
