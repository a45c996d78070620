"""A job file may name the bf16 TFLOP/s a healthy card of its GPU reaches (`needs.expected_tflops`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.jobs import JobFileError, parse_job_text, spec_from_dict
from tests.support.jobfiles import train_section


def job(extra: str = "") -> str:
    needs = "needs:\n  gpu: [RTX 3090]\n  providers: [sim]\n  disk_gb: 20\n"
    return "name: demo\n" + train_section() + needs + extra + "budget_usd: 3.0\n"


@pytest.fixture
def jobdir(tmp_path: Path) -> Path:
    (tmp_path / "model").mkdir()
    (tmp_path / "train.jsonl").write_text('{"prompt": "a", "completion": "b"}\n')
    return tmp_path


def test_the_figure_is_read_and_survives_the_job_tables_round_trip(jobdir: Path) -> None:
    """Set, it is a float on the spec and in the stored dict; unset, None (learned per model)."""
    spec = parse_job_text(job("  expected_tflops: 48\n"), base_dir=jobdir)
    assert spec.needs.expected_tflops == 48.0 and spec.to_dict()["needs"]["expected_tflops"] == 48.0
    assert spec_from_dict(spec.to_dict()).needs.expected_tflops == 48.0
    assert parse_job_text(job(), base_dir=jobdir).needs.expected_tflops is None
    old = parse_job_text(job(), base_dir=jobdir).to_dict()
    del old["needs"]["expected_tflops"]  # a job stored before the field existed
    assert spec_from_dict(old).needs.expected_tflops is None


@pytest.mark.parametrize("value", ["0", "-3", "fast", ".nan"])
def test_a_bad_figure_names_the_field_and_the_fix(jobdir: Path, value: str) -> None:
    """Zero, negative, text or NaN is refused with the field's name and a fix."""
    with pytest.raises(JobFileError, match=r"needs\.expected_tflops.*Fix:"):
        parse_job_text(job(f"  expected_tflops: {value}\n"), base_dir=jobdir)
