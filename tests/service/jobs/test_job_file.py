"""Job files: validated with errors that name the file, the line and the field."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.db import init_db, make_engine
from app.jobs import JobFileError, JobStore, load_job_file, parse_job_text
from tests.support.jobfiles import train_section

ROOT = Path(__file__).resolve().parents[3]

GOOD = (
    "name: demo\n"
    + train_section("nf4")
    + """\
needs:
  gpu: [RTX 3090, NVIDIA GeForce RTX 4090]
  min_vram_gb: 24
  max_usd_per_hour: 0.5
  providers: [vast, runpod]
  disk_gb: 40
budget_usd: 3.0
"""
)


@pytest.fixture
def jobdir(tmp_path: Path) -> Path:
    (tmp_path / "model").mkdir()
    (tmp_path / "train.jsonl").write_text('{"prompt": "a", "completion": "b"}\n')
    (tmp_path / "job.yaml").write_text(GOOD)
    return tmp_path


def bad(text: str, base: Path) -> JobFileError:
    with pytest.raises(JobFileError) as info:
        parse_job_text(text, source="job.yaml", base_dir=base)
    return info.value


def test_a_good_file_parses_into_requirements(jobdir: Path) -> None:
    """A valid job file yields the policy's requirements and the files to ship."""
    spec = load_job_file(jobdir / "job.yaml")
    req = spec.needs.requirements()
    assert req.gpu_names == ("RTX 3090", "NVIDIA GeForce RTX 4090") and req.min_gpu_ram_gb == 24
    assert req.max_dph == 0.5 and req.providers == ("vast", "runpod") and req.min_reliability == 0.98
    assert spec.budget_usd == 3.0 and spec.train["max_steps"] == 20
    assert {Path(p).name for p in spec.ship} == {"model", "train.jsonl"}


@pytest.mark.parametrize(
    ("old", "new", "line", "field", "words"),
    [
        ("  min_vram_gb: 24", "  min_vram_gb: lots", 16, "needs.min_vram_gb", "must be a number"),
        ("  max_steps: 20", "  max_steps: 2.5", 6, "train.max_steps", "whole number"),
        ("  task: causal_lm", "  task: regression", 4, "train.task", "not one of"),
        ("  providers: [vast, runpod]", "  providers: [vast, aws]", 18, "needs.providers[1]", "unknown provider"),
        ("  disk_gb: 40", "  disk_gb: 40\n  colour: blue", 20, "needs.colour", "unknown field"),
        ("budget_usd: 3.0", "budget_usd: -1", 20, "budget_usd", "at least 0"),
        ("  train_file: train.jsonl", "  train_file: missing.jsonl", 5, "train.train_file", "does not exist"),
        (
            "  lora: {r: 8, alpha: 16, target_modules: [q_proj, v_proj]}",
            "  lora: {r: 0, alpha: 16, target_modules: [q]}",
            12,
            "train.lora.r",
            "at least 1",
        ),
        (
            "  max_steps: 20",
            "  max_steps: 20\n  deterministic: yes please",
            7,
            "train.deterministic",
            "not true or false",
        ),
    ],
)
def test_errors_name_line_and_field(jobdir: Path, old: str, new: str, line: int, field: str, words: str) -> None:
    """Each mistake is reported with the file, its line, the field's path and a fix."""
    err = bad(GOOD.replace(old, new), jobdir)
    assert (err.line, err.field) == (line, field)
    assert words in str(err) and str(err).startswith(f"job.yaml line {line}: {field}:") and "Fix:" in str(err)


def test_missing_required_fields(jobdir: Path) -> None:
    """A missing section or trainer field is named."""
    assert bad(GOOD.replace("name: demo\n", ""), jobdir).field == "name"
    err = bad(GOOD.replace("  seed: 1\n", ""), jobdir)
    assert err.field == "train" and "`seed` is missing" in str(err)


def test_broken_yaml_names_the_line(jobdir: Path) -> None:
    """Syntax errors carry the line the parser stopped at."""
    err = bad(GOOD.replace("  seed: 1", "  seed: [1"), jobdir)
    assert err.line is not None and "not valid YAML" in str(err)


def test_job_store_round_trip(jobdir: Path, tmp_path: Path) -> None:
    """A job is stored queued with its spec, listed, and moves through phases."""
    engine = make_engine(f"sqlite:///{tmp_path / 'th.db'}")
    init_db(engine)
    store = JobStore(engine)
    jid = store.add(load_job_file(jobdir / "job.yaml"), now=100.0)
    rec = store.get(jid)
    assert rec is not None and rec.phase == "queued" and rec.spec["needs"]["min_vram_gb"] == 24
    store.set_phase(jid, "provisioning", detail="ranking offers", now=101.0)
    assert [(r.job_id, r.phase) for r in store.list()] == [(jid, "provisioning")]
    with pytest.raises(ValueError, match="unknown job phase"):
        store.set_phase(jid, "dreaming")


def cli(home: Path, *args: str, broker: str = "redis://127.0.0.1:1/0") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNEHARNESS_")}
    env.update(TUNEHARNESS_HOME=str(home), TUNEHARNESS_BROKER_URL=broker, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "app.cli.main", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_submit_without_a_broker_says_so_in_one_line_and_writes_nothing(jobdir: Path, tmp_path: Path) -> None:
    """With no broker, submit exits 2 with one line and records no job; `jobs` works regardless."""
    home = tmp_path / "home"
    # a provider that needs no key: the job itself is fine, only the broker is missing
    (jobdir / "job.yaml").write_text(GOOD.replace("providers: [vast, runpod]", "providers: [sim]"))
    out = cli(home, "submit", str(jobdir / "job.yaml"))
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "broker is unreachable" in out.stderr
    listed = cli(home, "jobs", "--json")
    assert listed.returncode == 0 and listed.stdout.strip() == "[]"


def test_submit_check_and_a_bad_file(jobdir: Path, tmp_path: Path) -> None:
    """--check validates without a broker; a bad file is one line naming its line and field."""
    home = tmp_path / "home"
    ok = cli(home, "submit", str(jobdir / "job.yaml"), "--check")
    assert ok.returncode == 0 and "ok (demo)" in ok.stdout
    (jobdir / "bad.yaml").write_text(GOOD.replace("  min_vram_gb: 24", "  min_vram_gb: lots"))
    out = cli(home, "submit", str(jobdir / "bad.yaml"))
    assert out.returncode == 2 and "line 16: needs.min_vram_gb" in out.stderr and out.stderr.count("\n") == 1
