"""`tuneharness submit` against a real Redis: the job is recorded, its cap set, its id enqueued."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[3]


def test_submit_records_and_enqueues(th_env: dict[str, str], tmp_path: Path, redis_url: str) -> None:
    """Submit prints an id, `jobs --json` shows it queued, the budget has its cap, the provision queue holds it."""
    example = ROOT / "examples" / "job.yaml"
    job = tmp_path / "job.yaml"
    text = example.read_text().replace("base_model: models/tiny-causal", "base_model: model")
    text = text.replace("data/train.jsonl", str(ROOT / "examples" / "data" / "train.jsonl"))
    text = text.replace("data/eval.jsonl", str(ROOT / "examples" / "data" / "eval.jsonl"))
    job.write_text(text.split("\ngate:")[0] + "\n")  # without its gate: one job, one run (see test_submit_gated.py)
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
    assert job_id.startswith("job-")
    jobs = json.loads(cli("jobs", "--json").stdout)
    assert [(j["job_id"], j["phase"], j["budget_usd"]) for j in jobs] == [(job_id, "queued", 2.0)]
    caps = json.loads(cli("budget", "show", "--json").stdout)
    assert any(c["name"] == job_id and c["cap_usd"] == 2.0 for c in caps)
    assert r.llen("provision") == before + 1
    body = json.loads(r.lindex("provision", 0) or b"{}")
    assert body["headers"]["task"] == "tuneharness.provision.provision"
    assert job_id in json.dumps(body)
