"""Measured speeds are kept durably per GPU model and machine, and the production driver judges with them."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.db import init_db, make_engine
from app.gpu_speeds import KEPT_PER_MACHINE, GpuSpeedStore
from app.policy.preflight import PreflightReport
from app.policy.provisioning import PreflightResult
from app.policy.ranking import Requirements
from app.policy.speeds import expected_speed, per_machine
from tests.service.provisioning.test_provisioning_service import SHAPE, Harness


@pytest.fixture
def store(tmp_path: Path) -> GpuSpeedStore:
    engine = make_engine(f"sqlite:///{tmp_path / 'th.db'}")
    init_db(engine)
    return GpuSpeedStore(engine)


def test_samples_are_kept_per_model_and_machine(store: GpuSpeedStore) -> None:
    """Each machine keeps its last few measurements; models and providers stay apart."""
    for i in range(KEPT_PER_MACHINE + 2):
        store.add("RTX 3090", provider="vast", machine_id="m-1", tflops_bf16=40.0 + i, now=float(i))
    store.add("RTX 3090", provider="runpod", machine_id="m-1", tflops_bf16=48.0, now=1.0)
    store.add("RTX 4090", provider="vast", machine_id="m-2", tflops_bf16=120.0, now=1.0)
    store.add("RTX 4090", provider="vast", machine_id="m-3", tflops_bf16=float("nan"), now=1.0)
    values = per_machine(store.samples("RTX 3090"))
    assert values == {"vast:m-1": pytest.approx(44.0), "runpod:m-1": 48.0}
    assert len(store.samples("RTX 3090")) == KEPT_PER_MACHINE + 1
    assert [s.tflops_bf16 for s in store.samples("RTX 4090")] == [120.0]


def test_a_passing_preflight_is_stored_and_fed_to_the_next_judgement(tmp_path: Path) -> None:
    """The smoke trace's healthy host lands a sample; a later preflight's observation carries it."""
    h = Harness(tmp_path)
    step = h.drive(h.svc.start("job-1", req=Requirements(), shape=SHAPE))
    assert step.phase == "training"
    samples = h.svc.speeds.samples("RTX 3090")
    assert [s.machine_id for s in samples] == ["sim:m-good"] and samples[0].tflops_bf16 == pytest.approx(71.0)
    report = PreflightReport.from_mapping(
        {
            "cuda_initialised": True,
            "matmul_finite": True,
            "gpu_name": "RTX 3090",
            "vram_gb": 24,
            "tflops_bf16": 50.0,
            "gpu_uuid": "GPU-x",
        }
    )
    fed = h.svc._with_knowledge(PreflightResult(report), owner="job-1", provider="sim")
    assert fed.speeds == tuple(samples) and fed.expected_tflops is None and fed.hardware is None
    assert expected_speed("RTX 3090", fed.speeds).source == "floor"  # one machine is not three
