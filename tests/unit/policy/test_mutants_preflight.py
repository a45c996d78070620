"""The preflight judgement and the speeds it judges against, at their exact boundaries and with
their exact verdicts, so that a changed comparison, default or evidence in app/policy/preflight.py
or app/policy/speeds.py fails a test (make mutation)."""

from __future__ import annotations

import pytest

from app.policy.preflight import TRAINER_STACK, PreflightReport, PreflightVerdict, judge_preflight, unreachable
from app.policy.speeds import SpeedExpectation, SpeedSample, expected_speed, per_machine

FULL_STACK = {name: "1.0" for name in TRAINER_STACK}


def report(**kw: object) -> PreflightReport:
    base: dict[str, object] = {
        "ok": True,
        "cuda_initialised": True,
        "gpu_name": "NVIDIA GeForce RTX 4090",
        "vram_gb": 24.0,
        "matmul_finite": True,
        "tflops_bf16": 150.0,
    }
    return PreflightReport.from_mapping({**base, **kw})


def judge(r: PreflightReport, **kw: object) -> PreflightVerdict:
    return judge_preflight(r, offered_gpu_name="RTX 4090", offered_gpu_ram_gb=24.0, **kw)  # type: ignore[arg-type]


def test_every_field_of_the_preflight_line_is_read() -> None:
    """Each field of the JSON line lands in its own attribute, under its own name."""
    line = {
        "ok": True,
        "cuda_initialised": True,
        "gpu_name": "H100",
        "vram_gb": 80,
        "driver": "550.54",
        "cuda": "12.4",
        "matmul_finite": True,
        "tflops_bf16": 700.5,
        "error": "none really",
        "simulated": True,
        "gpu_uuid": "GPU-1",
        "host_machine_id": "abc",
        "stack": {"torch": "2.5"},
    }
    assert PreflightReport.from_mapping(line) == PreflightReport(
        ok=True,
        cuda_initialised=True,
        gpu_name="H100",
        vram_gb=80.0,
        driver="550.54",
        cuda="12.4",
        matmul_finite=True,
        tflops_bf16=700.5,
        error="none really",
        simulated=True,
        gpu_uuid="GPU-1",
        host_machine_id="abc",
        stack={"torch": "2.5"},
    )


def test_an_empty_line_shows_nothing_and_claims_nothing() -> None:
    """Absent fields read as not shown: no CUDA, no finite matmul, not ok, not simulated."""
    assert PreflightReport.from_mapping({}) == PreflightReport()
    assert PreflightReport.from_mapping({"cuda_init": True}).cuda_initialised is True


def test_a_preflight_that_never_ran_fails_with_its_kind() -> None:
    """No report: a failed verdict naming why."""
    assert unreachable("timeout", "no answer in 300s") == PreflightVerdict(False, "timeout", "no answer in 300s")


def test_no_compute_names_what_failed_first() -> None:
    """CUDA not initialised, else the matmul; a reported error outranks both."""
    assert judge(report(cuda_initialised=False)) == PreflightVerdict(
        False, "no_compute", "no compute: CUDA did not initialise"
    )
    assert judge(report(matmul_finite=False)) == PreflightVerdict(False, "no_compute", "no compute: matmul not finite")
    assert judge(report(error="Xid 79")) == PreflightVerdict(False, "no_compute", "no compute: Xid 79")


@pytest.mark.parametrize("tflops", [0.0, float("nan"), float("inf"), -1.0])
def test_a_zero_or_non_finite_measurement_is_no_compute(tflops: float) -> None:
    """0, NaN, infinite or negative TFLOP/s is no usable measurement."""
    assert judge(report(tflops_bf16=tflops)) == PreflightVerdict(
        False, "no_compute", f"no usable TFLOP/s measurement ({tflops})"
    )


def test_a_gpu_mismatch_names_both_models() -> None:
    """The offer's model and the host's are both in the evidence."""
    assert judge(report(gpu_name="RTX 3090")) == PreflightVerdict(
        False, "gpu_mismatch", "offer says 'RTX 4090', host reports 'RTX 3090'"
    )


def test_vram_exactly_at_the_fraction_passes_and_less_fails() -> None:
    """95% of the advertised VRAM is enough; a little less is vram_short with the numbers."""
    assert judge(report(vram_gb=0.95 * 24.0)).passed
    assert judge(report(vram_gb=22.0)) == PreflightVerdict(
        False, "vram_short", "VRAM 22.0 GB < 95% of advertised 24 GB"
    )


def test_an_incomplete_stack_lists_what_is_missing_and_what_is_there() -> None:
    """The evidence lists the missing packages and the present ones with their versions."""
    v = judge(report(stack={"torch": "2.5", "numpy": "2.0"}))
    missing = ", ".join(p for p in TRAINER_STACK if p not in ("torch", "numpy"))
    assert v == PreflightVerdict(
        False,
        "stack_missing",
        f"the trainer's stack is incomplete: {missing} not importable (has numpy 2.0, torch 2.5)",
    )


def test_throughput_exactly_at_the_table_fraction_passes_with_its_share() -> None:
    """85% of the table's figure passes; the evidence gives the share of the expectation."""
    want = 165.2
    assert judge(report(tflops_bf16=0.85 * want, stack=FULL_STACK)).passed
    assert judge(report(tflops_bf16=0.85 * want - 0.01)).failure == "throttled"
    assert judge(report(tflops_bf16=150.0)) == PreflightVerdict(
        True, None, "NVIDIA GeForce RTX 4090: 150.0 bf16 TFLOP/s (91% of expected)"
    )


def test_a_throttled_host_gets_the_numbers_in_its_evidence() -> None:
    """Below 85% of the table: throttled, with the measurement, the expectation and the share."""
    assert judge(report(tflops_bf16=100.0)) == PreflightVerdict(
        False, "throttled", "100.0 bf16 TFLOP/s < 85% of 165.2 expected for RTX 4090 (61%)"
    )


def test_a_model_outside_the_table_passes_with_a_warning() -> None:
    """No figure to judge by: passed, its measurement in the evidence, a warning naming the model."""
    r = report(gpu_name="Mystery GPU 9000")
    v = judge_preflight(r, offered_gpu_name="Mystery GPU 9000", offered_gpu_ram_gb=24.0)
    assert v == PreflightVerdict(
        True,
        None,
        "Mystery GPU 9000: 150.0 bf16 TFLOP/s",
        ("GPU model 'MYSTERY GPU 9000' is not in the TFLOP/s table: throughput not judged",),
    )


def speed(*, tflops: float | None, least: float | None) -> SpeedExpectation:
    return SpeedExpectation("RTX 4090", "measured", tflops, least, 3)


def test_a_speed_expectation_judges_exactly_at_its_least() -> None:
    """At the least a healthy card reaches: passed, with the share of the median and its source."""
    v = judge(report(tflops_bf16=120.0), speed=speed(tflops=150.0, least=120.0))
    assert v == PreflightVerdict(
        True, None, "NVIDIA GeForce RTX 4090: 120.0 bf16 TFLOP/s (80% of 150.0: median of 3 machines measured)"
    )


def test_below_the_speed_expectation_is_throttled_with_the_numbers() -> None:
    """Below the least: throttled; the evidence gives least, share and the expectation's source."""
    v = judge(report(tflops_bf16=60.0), speed=speed(tflops=150.0, least=120.0))
    assert v == PreflightVerdict(
        False,
        "throttled",
        "60.0 bf16 TFLOP/s < 120.0, the least a healthy RTX 4090 may reach "
        "(40% of 150.0: median of 3 machines measured)",
    )


def test_a_speed_without_a_healthy_figure_is_judged_against_its_least() -> None:
    """No (or no positive) healthy figure: the least is what the share is of."""
    for healthy in (None, 0.0, -5.0):
        v = judge(report(tflops_bf16=100.0), speed=speed(tflops=healthy, least=80.0))
        assert v.evidence == "NVIDIA GeForce RTX 4090: 100.0 bf16 TFLOP/s (125% of 80.0: median of 3 machines measured)"


def test_a_small_positive_healthy_figure_is_used_as_is() -> None:
    """A healthy figure of 0.5 TFLOP/s is a figure, not a missing one."""
    v = judge(report(tflops_bf16=1.0), speed=speed(tflops=0.5, least=0.25))
    assert v.evidence == "NVIDIA GeForce RTX 4090: 1.0 bf16 TFLOP/s (200% of 0.5: median of 3 machines measured)"


def test_a_zero_least_passes_any_measurement() -> None:
    """An expectation whose least is 0 throttles nothing."""
    assert judge(report(tflops_bf16=0.5), speed=speed(tflops=10.0, least=0.0)).passed


# -- speeds -------------------------------------------------------------------------------------
def test_per_machine_keeps_small_positive_samples() -> None:
    """A sample of 0.5 TFLOP/s is finite and positive: kept; 0, NaN and infinity are not."""
    samples = [SpeedSample("m1", 0.5), SpeedSample("m2", 0.0), SpeedSample("m3", float("nan"))]
    samples.append(SpeedSample("m4", float("inf")))
    assert per_machine(samples) == {"m1": 0.5}


def test_values_per_machine_may_be_given_as_a_mapping() -> None:
    """A mapping is already one value per machine: its median is the healthy figure."""
    got = expected_speed("NVIDIA GeForce RTX 4090", {"m1": 140.0, "m2": 150.0, "m3": 160.0})
    assert got == SpeedExpectation("RTX 4090", "measured", 150.0, 0.85 * 150.0, 3)


def test_an_override_wins_and_counts_the_machines_measured() -> None:
    """A job's own positive figure, however small, is the expectation; the machine count stays."""
    got = expected_speed("RTX 4090", {"m1": 140.0}, override=0.5)
    assert got == SpeedExpectation("RTX 4090", "override", 0.5, 0.85 * 0.5, 1)
    assert got.describe() == "the job's needs.expected_tflops"
    assert expected_speed("RTX 4090", {"m1": 140.0}, override=0.0).source != "override"


def test_one_machine_suffices_when_one_is_the_minimum() -> None:
    """min_machines=1: a single machine's value is the measured median."""
    got = expected_speed("RTX 4090", {"m1": 140.0}, min_machines=1)
    assert got == SpeedExpectation("RTX 4090", "measured", 140.0, 0.85 * 140.0, 1)


def test_a_seeded_model_below_the_minimum_expects_its_seed() -> None:
    """An H200 with two machines measured: our bench's figure, with the count."""
    got = expected_speed("NVIDIA H200", {"m1": 600.0, "m2": 650.0})
    assert got == SpeedExpectation("H200", "seed", 709.2, 0.85 * 709.2, 2)


def test_a_datasheet_model_below_the_minimum_is_held_to_the_floor() -> None:
    """An RTX 3090 with one machine measured: 55% of its datasheet, described as the floor."""
    got = expected_speed("RTX 3090", {"m1": 60.0})
    assert got == SpeedExpectation("RTX 3090", "floor", 71.0, 0.55 * 71.0, 1)
    assert got.describe() == "floor 55% of the datasheet's 71 until 3 machines are measured (1 so far)"


def test_an_unknown_model_is_not_judged_and_keeps_its_count() -> None:
    """A model in no table: no figure, no least, the machines counted."""
    assert expected_speed("Mystery GPU 9000", {"m1": 10.0}) == SpeedExpectation(
        "MYSTERY GPU 9000", "unknown", None, None, 1
    )
