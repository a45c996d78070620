"""`tuneharness submit --dry-run`: what would be rented now, at what cost, kill-time and reservations,
with nothing written; and `tuneharness extend`'s refusals of bad input."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from providers.sim.trace import TRACE_FORMAT
from tests.support.jobfiles import train_section

ROOT = Path(__file__).resolve().parents[3]
TABLES = ("jobs", "ledger_events", "budget_reservations", "rentals", "provisioning_state")

TRACE = {
    "format": TRACE_FORMAT,
    "name": "dry-run",
    "workload": {"image_gb": 2, "model_gb": 1},
    "hosts": [
        {
            "machine_id": f"m-{i}",
            "offer": {
                "gpu_name": "RTX 3090",
                "gpu_ram_gb": 24,
                "dph": dph,
                "storage_per_gb_month": 0.15,
                "inet_down_mbps": 800,
                "reliability": rel,
                "datacenter": dc,
            },
        }
        for i, (dph, rel, dc) in enumerate([(0.10, 0.90, False), (0.20, 0.995, True), (0.30, 0.995, False)])
    ],
}


def job_text(extra: str = "", budget: str = "budget_usd: 4.0\n") -> str:
    needs = "needs:\n  gpu: [RTX 3090]\n  providers: [sim]\n  disk_gb: 20\n  download_gb: 3\n  train_hours: 1\n"
    return "name: dry\n" + train_section() + needs + extra + budget


@pytest.fixture
def jobdir(tmp_path: Path) -> Path:
    (tmp_path / "model").mkdir()
    (tmp_path / "train.jsonl").write_text('{"prompt": "a", "completion": "b"}\n')
    (tmp_path / "trace.json").write_text(json.dumps(TRACE))
    (tmp_path / "job.yaml").write_text(job_text())
    return tmp_path


def cli(home: Path, trace: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNEHARNESS_")}
    env.update(
        TUNEHARNESS_HOME=str(home),
        TUNEHARNESS_BROKER_URL="redis://127.0.0.1:1/0",  # nothing listens: a dry run needs no broker
        TUNEHARNESS_SIM_TRACE=str(trace),
        PYTHONPATH=str(ROOT),
        COLUMNS="200",
    )
    return subprocess.run(
        [sys.executable, "-m", "app.cli.main", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def counts(home: Path) -> dict[str, int]:
    db = home / "tuneharness.db"
    if not db.exists():
        return dict.fromkeys(TABLES, 0)
    with sqlite3.connect(db) as conn:
        have = {r[0] for r in conn.execute("select name from sqlite_master where type='table'")}
        return {t: conn.execute(f"select count(*) from {t}").fetchone()[0] if t in have else 0 for t in TABLES}


def plan(home: Path, jobdir: Path, name: str = "job.yaml") -> dict[str, Any]:
    out = cli(home, jobdir / "trace.json", "submit", str(jobdir / name), "--dry-run", "--json")
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def test_a_dry_run_shows_the_ranked_offers_and_writes_nothing(jobdir: Path, tmp_path: Path) -> None:
    """With a day cap set and no broker, the dry run ranks the sim offers cheapest-delivered first,
    prices each all-in, gives its kill-time and its reservations on the job and day caps, and leaves
    no job row, ledger event, reservation, rental or provisioning state behind."""
    home = tmp_path / "home"
    assert cli(home, jobdir / "trace.json", "budget", "set", "day", "--cap-usd", "10").returncode == 0
    before = counts(home)
    p = plan(home, jobdir)
    assert counts(home) == before
    assert p["dry_run"] is True and p["runs"] == 1 and p["budget_per_run_usd"] == 4.0 and p["offers_found"] == 3
    first = p["offers"][0]
    assert first["provider"] == "sim" and first["machine_id"] == "m-0"  # the soft floor only weighs in
    assert [o["rank"] for o in p["offers"]] == [1, 2, 3]
    assert first["all_in_usd_per_hour"] == pytest.approx(0.10 + 0.15 * 20 / 720, abs=1e-6)
    assert 0 < first["expected_attempt_usd"] <= first["expected_per_delivered_job_usd"]
    assert 1.0 < first["kill_after_hours"] < 6.0  # derived from a 1 h job, not the old fixed 6 h
    reserves = {r["cap"]: r for r in first["reservations"]}
    assert set(reserves) == {"job", "day"} and reserves["day"]["left_before"] == 10.0
    assert reserves["job"]["amount"] == reserves["day"]["amount"] > first["expected_attempt_usd"]
    text = cli(home, jobdir / "trace.json", "submit", str(jobdir / "job.yaml"), "--dry-run")
    assert (
        text.returncode == 0 and "nothing created, reserved or enqueued" in text.stdout and "sim:m-0#1" in text.stdout
    )
    assert counts(home) == before


def test_the_job_files_choices_shape_the_dry_run(jobdir: Path, tmp_path: Path) -> None:
    """A hard reliability floor drops the 0.90 host, datacenter_only keeps only the datacenter host,
    and kill_after_hours is the kill-time shown."""
    (jobdir / "hard.yaml").write_text(job_text("  min_reliability: 0.98\n"))
    (jobdir / "dc.yaml").write_text(job_text("  datacenter_only: true\n  kill_after_hours: 2.5\n"))
    home = tmp_path / "home"
    assert [o["machine_id"] for o in plan(home, jobdir, "hard.yaml")["offers"]] == ["m-1", "m-2"]
    dc = plan(home, jobdir, "dc.yaml")
    assert dc["offers_found"] == 1 and [o["machine_id"] for o in dc["offers"]] == ["m-1"]
    assert dc["offers"][0]["kill_after_hours"] == 2.5


def test_without_any_cap_the_dry_run_says_every_create_would_be_refused(jobdir: Path, tmp_path: Path) -> None:
    """No budget_usd and no default cap: the offers are shown, with a note naming the fix."""
    (jobdir / "nocap.yaml").write_text(job_text(budget=""))
    p = plan(tmp_path / "home", jobdir, "nocap.yaml")
    assert p["offers"] and all(o["reservations"] == [] for o in p["offers"])
    assert any("every create would be refused" in n and "budget set default" in n for n in p["notes"])


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("submit", "{dir}/missing.yaml", "--dry-run"), "cannot be read"),
        (("submit", "{dir}/job.yaml", "--dry-run", "--check"), "--check and --dry-run"),
        (("submit", "{dir}/job.yaml", "--dry-run", "--top", "0"), "--top"),
        (("extend", "job-nope", "--hours", "2"), "no job 'job-nope'"),
        (("extend", "job-nope", "--hours", "0"), "--hours 0 is not in"),
        (("extend", "job-nope", "--hours", "nan"), "--hours nan is not in"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(jobdir: Path, tmp_path: Path, args: tuple[str, ...], words: str) -> None:
    """Each mistake is one line on stderr naming the problem, exit code 2, and nothing is written."""
    home = tmp_path / "home"
    out = cli(home, jobdir / "trace.json", *(a.format(dir=jobdir) for a in args))
    assert out.returncode == 2, out
    assert words in out.stderr and out.stderr.strip().count("\n") == 0 and "Traceback" not in out.stderr
    assert counts(home) == dict.fromkeys(TABLES, 0)
