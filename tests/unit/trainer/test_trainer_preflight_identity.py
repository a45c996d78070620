"""The preflight reads the hardware's own identity: the GPU's UUID and the host's /etc/machine-id."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from trainer import preflight
from trainer.preflight import run_preflight


def test_the_machine_id_is_read_from_its_file(tmp_path: Path) -> None:
    """/etc/machine-id's content, stripped; a missing or empty file reads as None."""
    f = tmp_path / "machine-id"
    f.write_text("4c4c4544004d3110\n")
    assert preflight._host_machine_id(str(f)) == "4c4c4544004d3110"
    f.write_text("\n")
    assert preflight._host_machine_id(str(f)) is None
    assert preflight._host_machine_id(str(tmp_path / "absent")) is None


def test_the_gpu_uuid_comes_from_torch_in_nvidia_smis_spelling(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's bare UUID gets nvidia-smi's `GPU-` prefix; without it, nvidia-smi is asked (absent: None)."""
    assert preflight._gpu_uuid(SimpleNamespace(uuid="8f3c9e2a-1b2c")) == "GPU-8f3c9e2a-1b2c"
    assert preflight._gpu_uuid(SimpleNamespace(uuid="GPU-8f3c9e2a-1b2c")) == "GPU-8f3c9e2a-1b2c"
    monkeypatch.setenv("PATH", "")  # no nvidia-smi to ask
    assert preflight._gpu_uuid(SimpleNamespace()) is None


def test_a_sim_host_reports_the_identity_its_truth_gives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a simulated host the identity is the truth's, so each simulated machine keeps its own."""
    truth = tmp_path / "truth.json"
    truth.write_text(
        json.dumps(
            {
                "computes": True,
                "actual_gpu_name": "RTX 3090",
                "actual_gpu_ram_gb": 24,
                "expected_tflops_bf16": 48.0,
                "gpu_uuid": "GPU-1",
                "host_machine_id": "abc",
            }
        )
    )
    monkeypatch.setenv("TUNEHARNESS_SIM_TRUTH", str(truth))
    result = run_preflight()
    assert (result["gpu_uuid"], result["host_machine_id"], result["tflops_bf16"]) == ("GPU-1", "abc", 48.0)
