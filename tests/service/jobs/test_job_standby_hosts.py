"""`needs.standby_hosts`: how many verified hosts a job keeps waiting for its recoveries."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.jobs import MAX_STANDBY_HOSTS, JobFileError, parse_job_text, spec_from_dict
from tests.support.jobfiles import train_section

JOB = (
    "name: demo\n"
    + train_section("nf4")
    + """\
needs:
  gpu: [RTX 3090]
  standby_hosts: VALUE
budget_usd: 3.0
"""
)


def _parse(value: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    return parse_job_text(JOB.replace("VALUE", value), source="job.yaml", base_dir=tmp_path, check_files=False)


def test_standby_hosts_defaults_to_none_and_survives_the_job_table(tmp_path: Path) -> None:
    """Absent: 0; given: kept through to_dict/spec_from_dict (what the provision task reads)."""
    assert (
        parse_job_text(
            JOB.replace("  standby_hosts: VALUE\n", ""), source="job.yaml", base_dir=tmp_path, check_files=False
        ).needs.standby_hosts
        == 0
    )
    spec = _parse("2", tmp_path)
    assert spec.needs.standby_hosts == 2
    assert spec_from_dict(spec.to_dict()).needs.standby_hosts == 2
    assert spec.seed_run(1, parent="demo").needs.standby_hosts == 2


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("-1", "at least 0"),
        ("1.5", "whole number"),
        ("yes", "whole number"),
        (str(MAX_STANDBY_HOSTS + 1), f"at most {MAX_STANDBY_HOSTS}"),
    ],
)
def test_a_bad_standby_hosts_names_the_field_and_line(tmp_path: Path, value: str, problem: str) -> None:
    """Negative, fractional, not a number, or more hosts than the cap: refused at submit, naming line 16."""
    with pytest.raises(JobFileError) as info:
        _parse(value, tmp_path)
    msg = str(info.value)
    assert "needs.standby_hosts" in msg and problem in msg and "line 16" in msg and "Fix:" in msg
