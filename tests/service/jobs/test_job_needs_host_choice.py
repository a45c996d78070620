"""A job file's say over its hosts: the kill-time, a hard reliability floor, datacenter hosts only."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.jobs import JobFileError, parse_job_text, spec_from_dict
from tests.support.jobfiles import train_section

NEEDS = """\
needs:
  gpu: [RTX 3090]
  providers: [sim]
  disk_gb: 20
  train_hours: 2
"""


def job(extra: str = "") -> str:
    return "name: demo\n" + train_section() + NEEDS + extra + "budget_usd: 3.0\n"


@pytest.fixture
def jobdir(tmp_path: Path) -> Path:
    (tmp_path / "model").mkdir()
    (tmp_path / "train.jsonl").write_text('{"prompt": "a", "completion": "b"}\n')
    return tmp_path


def test_an_unset_file_keeps_todays_defaults(jobdir: Path) -> None:
    """Without the new fields: a soft 0.98 floor, every host, a kill-time derived from train_hours."""
    spec = parse_job_text(job(), base_dir=jobdir)
    req, shape = spec.needs.requirements(), spec.shape()
    assert req.min_reliability == 0.98 and req.reliability_floor_soft and not req.datacenter_only
    assert shape.kill_after_s is None and shape.train_s == 2 * 3600.0


def test_the_file_sets_a_hard_floor_datacenter_hosts_and_a_kill_time(jobdir: Path) -> None:
    """min_reliability written in the file is a hard filter; datacenter_only and kill_after_hours
    reach the policy's requirements and shape, and survive the job table's round trip."""
    text = job("  min_reliability: 0.97\n  datacenter_only: true\n  kill_after_hours: 5\n")
    spec = parse_job_text(text, base_dir=jobdir)
    req, shape = spec.needs.requirements(), spec.shape()
    assert req.min_reliability == 0.97 and not req.reliability_floor_soft and req.datacenter_only
    assert shape.kill_after_s == 5 * 3600.0
    again = spec_from_dict(spec.to_dict())
    assert again.needs.requirements() == req and again.shape() == shape
    assert spec.seed_run(1, parent="demo").shape().kill_after_s == 5 * 3600.0


def test_a_job_stored_before_these_fields_loads_with_todays_behaviour(jobdir: Path) -> None:
    """A stored job without the new keys (min_reliability 0.98 was always written) stays soft and derived."""
    d = parse_job_text(job(), base_dir=jobdir).to_dict()
    for key in ("kill_after_hours", "datacenter_only", "min_reliability_hard"):
        del d["needs"][key]
    spec = spec_from_dict(d)
    assert spec.needs.requirements().reliability_floor_soft and spec.shape().kill_after_s is None


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("  kill_after_hours: 0\n", "more than 0"),
        ("  kill_after_hours: -1\n", "at least 0"),
        ("  kill_after_hours: .nan\n", "needs.kill_after_hours"),
        ("  kill_after_hours: .inf\n", "needs.kill_after_hours"),
        ("  kill_after_hours: 1000\n", "at most 168"),
        ("  kill_after_hours: soon\n", "must be a number"),
        ("  kill_after_hours: 1\n", "shorter than train_hours 2"),
        ("  datacenter_only: yes please\n", "not true or false"),
        ("  datacenter_only: 1\n", "not true or false"),
    ],
)
def test_a_bad_value_names_its_line_and_field(jobdir: Path, line: str, words: str) -> None:
    """Each bad value is refused with the field, its line (19: the last of `needs`) and the fix."""
    with pytest.raises(JobFileError) as info:
        parse_job_text(job(line), source="job.yaml", base_dir=jobdir)
    msg = str(info.value)
    assert words in msg and "line 19" in msg and "Fix:" in msg
    assert ("needs.kill_after_hours" in msg) or ("needs.datacenter_only" in msg)
