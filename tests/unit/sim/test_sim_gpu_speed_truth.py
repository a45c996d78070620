"""A simulated card measures its datasheet x its model's healthy fraction x its own factor, and
reports the hardware identity of its machine; the sandbox truth and the campaign agree."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.policy.gpus import DATASHEET_PEAK_TFLOPS_BF16
from providers.sim.observe import preflight_report, truth_file
from providers.sim.trace import TRACE_FORMAT, TraceError, parse_trace, sim_hardware_ids
from trainer.preflight import run_preflight


def trace(*truths: dict[str, Any], gpu_models: dict[str, Any] | None = None, gpu: str = "RTX 3090") -> Any:
    data: dict[str, Any] = {
        "format": TRACE_FORMAT,
        "name": "t",
        "hosts": [
            {"machine_id": f"m-{i}", "offer": {"gpu_name": gpu, "gpu_ram_gb": 24, "dph": 0.2}, "truth": t}
            for i, t in enumerate(truths)
        ],
    }
    if gpu_models is not None:
        data["gpu_models"] = gpu_models
    return parse_trace(data)


def test_a_healthy_consumer_card_measures_its_models_fraction_of_the_datasheet() -> None:
    """`gpu_models` sets what a healthy card reaches; a host's factor is relative to that."""
    t = trace({}, {"tflops_factor": 0.6}, gpu_models={"NVIDIA GeForce RTX 3090": {"healthy_fraction": 0.68}})
    healthy, throttled = (preflight_report(h.truth)["tflops_bf16"] for h in t.hosts)
    assert healthy == pytest.approx(0.68 * DATASHEET_PEAK_TFLOPS_BF16["RTX 3090"], rel=1e-3)
    assert throttled == pytest.approx(0.6 * healthy, rel=1e-3)


def test_a_model_the_trace_does_not_list_is_healthy_at_its_datasheet() -> None:
    """Without `gpu_models` (every trace before it) a healthy card reports its datasheet peak, as before."""
    t = trace({}, gpu_models={"RTX 3090": {"healthy_fraction": 0.68}}, gpu="RTX 4090")
    assert preflight_report(t.hosts[0].truth)["tflops_bf16"] == pytest.approx(DATASHEET_PEAK_TFLOPS_BF16["RTX 4090"])
    assert trace({}).hosts[0].truth.healthy_fraction == 1.0


@pytest.mark.parametrize(
    ("models", "where"),
    [
        ({"RTX 3090": {"healthy_fraction": 0}}, "gpu_models.RTX 3090.healthy_fraction"),
        ({"RTX 3090": {"fraction": 0.7}}, "gpu_models.RTX 3090.fraction"),
        ({"RTX 3090": 0.7}, "gpu_models.RTX 3090"),
    ],
)
def test_a_bad_gpu_models_entry_is_refused_naming_it(models: dict[str, Any], where: str) -> None:
    """A malformed `gpu_models` entry is a TraceError naming the field and the fix."""
    with pytest.raises(TraceError, match=f"{where}.*Fix:"):
        trace({}, gpu_models=models)


def test_each_machine_reports_its_own_stable_hardware_identity() -> None:
    """The GPU UUID and machine-id derive from the machine id; a trace may give them (one host, two listings)."""
    t = trace({}, {}, {"gpu_uuid": "GPU-shared", "host_machine_id": "abc"})
    first, second, third = (preflight_report(h.truth) for h in t.hosts)
    assert (first["gpu_uuid"], first["host_machine_id"]) == sim_hardware_ids("m-0")
    assert first["gpu_uuid"] != second["gpu_uuid"] and first["gpu_uuid"].startswith("GPU-")
    assert (third["gpu_uuid"], third["host_machine_id"]) == ("GPU-shared", "abc")
    assert trace({}).hosts[0].truth.gpu_uuid == t.hosts[0].truth.gpu_uuid  # stable across loads


def test_the_sandbox_truth_makes_the_trainer_report_what_the_campaign_sees(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """trainer/preflight.py on a sim host (truth_file) reports the speed and identity preflight_report does."""
    t = trace({"tflops_factor": 0.55}, gpu_models={"RTX 3090": {"healthy_fraction": 0.7}})
    truth = t.hosts[0].truth
    path = tmp_path / "truth.json"
    path.write_text(json.dumps(truth_file(truth, instance_id="i-1", machine_id="m-0", created_at_s=0.0)))
    monkeypatch.setenv("TUNEHARNESS_SIM_TRUTH", str(path))
    on_host, campaign = run_preflight(), preflight_report(truth)
    assert on_host["tflops_bf16"] == pytest.approx(campaign["tflops_bf16"])
    for key in ("gpu_name", "vram_gb", "gpu_uuid", "host_machine_id"):
        assert on_host[key] == campaign[key]
