"""The shipped example job: it rents only on the simulated marketplace unless the renter edits it,
passes --check once its model exists, and before that names the one command that makes it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from app.jobs import JobFileError, load_job_file

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def example(tmp_path: Path) -> Path:
    for item in ("job.yaml", "gate.json", "data"):
        src = ROOT / "examples" / item
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / item)
    return tmp_path / "job.yaml"


def test_without_its_model_the_fix_is_the_command_that_makes_it(example: Path) -> None:
    with pytest.raises(JobFileError) as info:
        load_job_file(example)
    err = info.value
    assert err.field == "train.base_model"
    assert f"python -m trainer make-tiny-model {example.parent / 'models' / 'tiny-causal'}" in str(err)


def test_with_its_model_it_passes_and_rents_only_on_the_simulated_marketplace(example: Path) -> None:
    (example.parent / "models" / "tiny-causal").mkdir(parents=True)
    spec = load_job_file(example)
    assert spec.needs.providers == ("sim",) and spec.gate is not None
