"""What a GPU model must compute is learned from our own passing preflights, per model, robustly."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.market import Instance, Offer
from app.policy.gpus import DATASHEET_PEAK_TFLOPS_BF16, hardware_key
from app.policy.preflight import PreflightReport, judge_preflight
from app.policy.provisioning import (
    CreateResult,
    Destroy,
    JobState,
    Polled,
    PreflightResult,
    Record,
    StartTraining,
    decide,
    guarded_config,
    new_job,
)
from app.policy.ranking import JobShape, Requirements
from app.policy.reputation import MachineRecord, record_failure
from app.policy.speeds import (
    FLOOR_FRACTION_OF_DATASHEET,
    MIN_MACHINES,
    SpeedSample,
    expected_speed,
    per_machine,
)

PEAK_3090 = DATASHEET_PEAK_TFLOPS_BF16["RTX 3090"]  # 71.0
HEALTHY_3090 = 0.68 * PEAK_3090  # what a healthy consumer card reaches on the preflight's matmul
CFG = guarded_config()


def report(tflops: float, gpu: str = "NVIDIA GeForce RTX 3090", **kw: object) -> PreflightReport:
    base: dict[str, object] = {
        "ok": True,
        "cuda_initialised": True,
        "gpu_name": gpu,
        "vram_gb": 24.0,
        "matmul_finite": True,
        "tflops_bf16": tflops,
    }
    return PreflightReport.from_mapping({**base, **kw})


def judged(tflops: float, samples: list[SpeedSample] | None = None, **kw: object) -> str | None:
    speed = expected_speed("RTX 3090", samples or [], **kw)  # type: ignore[arg-type]
    return judge_preflight(report(tflops), offered_gpu_name="RTX 3090", offered_gpu_ram_gb=24, speed=speed).failure


def machines(*values: float) -> list[SpeedSample]:
    return [SpeedSample(f"m-{i}", v) for i, v in enumerate(values)]


def test_a_healthy_consumer_card_at_65_percent_of_its_datasheet_passes_before_anything_is_measured() -> None:
    """With no machine measured, only the floor applies: 65% of the datasheet passes, 50% is throttled."""
    assert judged(0.65 * PEAK_3090) is None
    assert judged(0.50 * PEAK_3090) == "throttled"
    speed = expected_speed("RTX 3090", [])
    assert speed.source == "floor" and speed.min_tflops_bf16 == pytest.approx(FLOOR_FRACTION_OF_DATASHEET * PEAK_3090)


def test_the_datasheet_table_alone_would_destroy_that_healthy_card() -> None:
    """The judgement without a learned speed (85% of the table's datasheet figure) calls it throttled."""
    r = report(HEALTHY_3090)
    assert judge_preflight(r, offered_gpu_name="RTX 3090", offered_gpu_ram_gb=24).failure == "throttled"


def test_below_three_machines_the_samples_do_not_judge_yet() -> None:
    """Two machines measured are not enough: a host at 82% of them is still held only to the floor."""
    assert MIN_MACHINES == 3
    assert judged(0.82 * HEALTHY_3090, machines(HEALTHY_3090, HEALTHY_3090)) is None


def test_from_three_machines_a_host_slow_against_their_median_is_throttled() -> None:
    """Three machines measured: below 85% of their median is throttled, at 90% passes."""
    samples = machines(HEALTHY_3090 * 0.98, HEALTHY_3090, HEALTHY_3090 * 1.03)
    speed = expected_speed("RTX 3090", samples)
    assert speed.source == "measured" and speed.machines == 3 and speed.tflops_bf16 == pytest.approx(HEALTHY_3090)
    assert judged(0.80 * HEALTHY_3090, samples) == "throttled"
    assert judged(0.90 * HEALTHY_3090, samples) is None


def test_a_single_fast_outlier_does_not_poison_the_expectation() -> None:
    """One machine 30% faster than the rest moves the median nowhere near: healthy hosts still pass."""
    samples = machines(1.3 * HEALTHY_3090, HEALTHY_3090, 0.97 * HEALTHY_3090)
    assert judged(0.95 * HEALTHY_3090, samples) is None
    assert judged(0.92 * HEALTHY_3090, samples) is None


def test_a_throttled_first_host_does_not_poison_the_expectation() -> None:
    """A throttled host that passed the floor before anything was known is outvoted by two healthy ones."""
    samples = machines(0.6 * HEALTHY_3090, HEALTHY_3090, 1.02 * HEALTHY_3090)
    assert judged(0.7 * HEALTHY_3090, samples) == "throttled"


def test_one_machine_counts_once_however_often_it_was_preflighted() -> None:
    """Ten slow preflights on one machine are one value; the median is over distinct machines."""
    samples = [SpeedSample("slow", 0.6 * HEALTHY_3090)] * 10 + machines(HEALTHY_3090, HEALTHY_3090)
    assert per_machine(samples)["slow"] == pytest.approx(0.6 * HEALTHY_3090)
    assert expected_speed("RTX 3090", samples).tflops_bf16 == pytest.approx(HEALTHY_3090)


def test_the_jobs_own_figure_overrides_everything() -> None:
    """`needs.expected_tflops` wins over samples and floor alike."""
    speed = expected_speed("RTX 3090", machines(HEALTHY_3090, HEALTHY_3090, HEALTHY_3090), override=60.0)
    assert speed.source == "override" and speed.min_tflops_bf16 == pytest.approx(51.0)
    assert judged(HEALTHY_3090, [], override=60.0) == "throttled"


def test_a_measured_card_is_seeded_with_our_bench_figure_until_three_machines_are_measured() -> None:
    """The H200 starts at the bench's 709.2; three machines measured here replace it with their median."""
    seeded = expected_speed("NVIDIA H200", [])
    assert seeded.source == "seed" and seeded.tflops_bf16 == pytest.approx(709.2)
    learned = expected_speed("NVIDIA H200", machines(690.0, 700.0, 720.0))
    assert learned.source == "measured" and learned.tflops_bf16 == pytest.approx(700.0)


def test_a_model_no_table_knows_is_learned_once_measured() -> None:
    """A card with no datasheet figure is not judged until three machines of it were measured."""
    assert expected_speed("Tesla V100-SXM2-16GB", []).min_tflops_bf16 is None
    learned = expected_speed("Tesla V100-SXM2-16GB", machines(90.0, 92.0, 95.0))
    assert learned.source == "measured" and learned.min_tflops_bf16 == pytest.approx(0.85 * 92.0)


# -- the provisioning policy judges with what the observation carries --------------------------------
def offer(machine_id: str | None = "m-a") -> Offer:
    return Offer(
        provider="runpod" if machine_id is None else "vast",
        offer_id="o-1",
        machine_id=machine_id,
        gpu_name="RTX 3090",
        num_gpus=1,
        gpu_ram_gb=24,
        dph_total=0.2,
        storage_per_gb_month=0.1,
        inet_down_per_gb=0.0,
        inet_down_mbps=800,
        reliability=0.99,
        cuda_max="12.4",
    )


def in_preflight(machine_id: str | None = "m-a") -> JobState:
    j = new_job("job-1", req=Requirements(), shape=JobShape(download_gb=23.0, train_s=600.0, disk_gb=60.0))
    j, _ = decide(j, CreateResult(offer(machine_id), "i-1"), 0.0, cfg=CFG)
    running = Instance(
        provider="vast",
        instance_id="i-1",
        machine_id=machine_id,
        label="th",
        state="running",
        status_line="running",
        ssh=None,
        gpu_util=None,
        dph_total=0.2,
        started_at=0.0,
    )
    j, _ = decide(j, Polled(running), 300.0, cfg=CFG)
    assert j.phase == "preflight"
    return j


def test_a_passing_preflight_records_its_measurement_for_the_driver_to_keep() -> None:
    """The preflight_passed record carries the model and the TFLOP/s, so the driver stores a sample."""
    j, acts = decide(in_preflight(), PreflightResult(report(HEALTHY_3090)), 315.0, cfg=CFG)
    assert j.phase == "training" and any(isinstance(a, StartTraining) for a in acts)
    passed = [a for a in acts if isinstance(a, Record) and a.event == "preflight_passed"]
    assert passed and passed[0].gpu_model == "RTX 3090" and passed[0].tflops_bf16 == pytest.approx(HEALTHY_3090)


def test_the_policy_judges_against_the_samples_the_observation_carries() -> None:
    """Three machines measured at the healthy speed: a host at 70% of it is destroyed as throttled."""
    samples = tuple(machines(HEALTHY_3090, HEALTHY_3090, HEALTHY_3090))
    j, acts = decide(in_preflight(), PreflightResult(report(0.7 * HEALTHY_3090), speeds=samples), 315.0, cfg=CFG)
    assert j.phase == "queued"
    destroy = next(a for a in acts if isinstance(a, Destroy))
    assert destroy.reason == "throttled" and "median of 3 machines" in destroy.evidence
    j, _ = decide(
        in_preflight(), PreflightResult(report(0.7 * HEALTHY_3090), expected_tflops=0.75 * HEALTHY_3090), 315.0, cfg=CFG
    )
    assert j.phase == "training"


# -- hardware identity ---------------------------------------------------------------------------------
def test_the_hardware_key_prefers_the_gpus_uuid() -> None:
    """The GPU's UUID names the host; /etc/machine-id only where no UUID was read; neither: None."""
    assert hardware_key(gpu_uuid="GPU-1", host_machine_id="abc") == "gpu:GPU-1"
    assert hardware_key(gpu_uuid=None, host_machine_id="abc") == "host:abc"
    assert hardware_key(gpu_uuid=" ", host_machine_id=None) is None


def test_a_vendor_that_names_no_machine_has_its_record_kept_under_the_hardware() -> None:
    """An offer without a machine id: after the preflight read the GPU's UUID, records go under it."""
    j, acts = decide(in_preflight(None), PreflightResult(report(HEALTHY_3090, gpu_uuid="GPU-7")), 315.0, cfg=CFG)
    assert j.attempt is not None and j.attempt.machine_id == "gpu:GPU-7"
    assert any(isinstance(a, Record) and a.machine_id == "gpu:GPU-7" for a in acts)


def test_a_preflight_that_reveals_quarantined_hardware_fails() -> None:
    """A host listed again under a new offer is destroyed, not trained on, when its GPU is quarantined."""
    bad = record_failure(MachineRecord("gpu:GPU-7", "runpod"), reason="throttled", now=0.0)
    res = PreflightResult(report(HEALTHY_3090, gpu_uuid="GPU-7"), hardware=bad)
    j, acts = decide(in_preflight(None), res, 315.0, cfg=CFG)
    assert j.phase == "queued" and {"gpu:GPU-7", "offer:o-1"} <= j.excluded
    destroy = next(a for a in acts if isinstance(a, Destroy))
    assert destroy.reason == "throttled" and "gpu:GPU-7 is quarantined" in destroy.evidence
    assert not any(isinstance(a, StartTraining) for a in acts)
    # lifted (or never quarantined): the same report passes
    j, _ = decide(in_preflight(None), replace(res, hardware=MachineRecord("gpu:GPU-7", "runpod")), 315.0, cfg=CFG)
    assert j.phase == "training"
