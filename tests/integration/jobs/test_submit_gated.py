"""`tuneharness submit` of a job with a gate against a real Redis: one training run per seed is
recorded and enqueued."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[3]


def test_a_gated_job_is_submitted_as_one_run_per_seed(th_env: dict[str, str], tmp_path: Path, redis_url: str) -> None:
    """examples/job.yaml (gate, seeds [1, 2]): the job is `training`, each run `queued` with seed N and half the
    budget as its cap, and the provision queue gets the two runs' ids, not the job's."""
    job = tmp_path / "job.yaml"
    text = (ROOT / "examples" / "job.yaml").read_text().replace("base_model: models/tiny-causal", "base_model: model")
    for rel in ("data/train.jsonl", "data/eval.jsonl", "data/gate-eval.jsonl", "data/gate-baseline.jsonl", "gate.json"):
        text = text.replace(rel, str(ROOT / "examples" / rel))
    job.write_text(text)
    (tmp_path / "model").mkdir()
    r = redis.Redis.from_url(th_env["TUNEHARNESS_BROKER_URL"])
    before = r.llen("provision")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "app.cli.main", *args],
            cwd=ROOT,
            env=th_env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    out = cli("submit", str(job))
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip()
    runs = [f"{job_id}-seed-1", f"{job_id}-seed-2"]
    jobs = {j["job_id"]: j for j in json.loads(cli("jobs", "--json").stdout)}
    assert set(jobs) == {job_id, *runs}
    assert jobs[job_id]["phase"] == "training" and all(run in jobs[job_id]["detail"] for run in runs)
    assert [(jobs[run]["phase"], jobs[run]["budget_usd"]) for run in runs] == [("queued", 1.0), ("queued", 1.0)]
    caps = {c["name"]: c["cap_usd"] for c in json.loads(cli("budget", "show", "--json").stdout)}
    assert caps.get(runs[0]) == 1.0 and caps.get(runs[1]) == 1.0 and job_id not in caps
    assert r.llen("provision") == before + 2
    queued = [json.loads(raw) for raw in r.lrange("provision", 0, 1)]
    assert {run for b in queued for run in runs if run in json.dumps(b)} == set(runs)
