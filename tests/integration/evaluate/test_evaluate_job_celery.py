"""Through a real Celery worker and Redis: `tuneharness.evaluate.evaluate_job` judges a gated job's
real seed adapters and the job ends `done`, its decision in `gate history` and `jobs`."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from app.artifacts import LocalArtifactStore
from app.db import init_db, make_engine
from app.jobs import JobStore, parse_job_text, seed_run_id
from app.ledger import Ledger
from tests.conftest import REPO, run_cli
from tests.support.adapters import store_adapter, train_tiny_adapters
from tests.support.services import CeleryWorker, wait_until

pytestmark = pytest.mark.slow

JOB = """\
name: words
train:
  base_model: {base}
  task: causal_lm
  train_file: train.jsonl
  max_steps: 2
  checkpoint_every: 2
  seed: 1
  learning_rate: 1.0e-2
  batch_size: 4
  max_seq_len: 32
  lora: {{r: 4, alpha: 8, target_modules: [q_proj, v_proj]}}
  quantization: none
needs:
  gpu: [RTX 3090]
gate:
  config: gate.json
  eval: eval.jsonl
  baseline: command:{python} rules.py
  seeds: [1, 2]
"""

# The rule knows the answer: the digit after `x`, as the model was trained to say it.
RULES = """\
import json, sys
for line in sys.stdin:
    row = json.loads(line)
    print(json.dumps({"id": row["id"], "predicted": " " + row["prompt"].split()[1]}))
"""


def test_evaluate_job_through_a_real_worker_ends_the_job_done_with_the_decision(
    th_env: dict[str, str], th_home: Path, tmp_path: Path
) -> None:
    """Given a gated job whose two seed adapters are in the store, when a worker runs evaluate_job, then
    the job is done and refused (the rules baseline is perfect), the trial is recorded and in gate history."""
    base, adapters = train_tiny_adapters(tmp_path / "trained", (1,), steps=2)
    second = tmp_path / "adapter-seed-2"
    shutil.copytree(adapters[1], second)  # one training, two seeds' files: keeps this test fast
    d = tmp_path / "job"
    d.mkdir()
    (d / "train.jsonl").write_text('{"prompt": "a", "completion": "b"}\n')
    (d / "rules.py").write_text(RULES)  # relative to the job file: commands run in its directory
    (d / "gate.json").write_text(
        json.dumps({"metric": "accuracy", "model": "words", "baseline_name": "rules", "min_canaries": 0})
    )
    rows = [
        {"id": f"h{i}", "slice": "heldout", "prompt": f"w{i} x{i % 3} ->", "expected": f" x{i % 3}"} for i in range(4)
    ]
    (d / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = parse_job_text(JOB.format(base=base, python=sys.executable), source=str(d / "job.yaml"), base_dir=d)

    engine = make_engine(f"sqlite:///{th_home / 'tuneharness.db'}")
    init_db(engine)
    jobs, store = JobStore(engine), LocalArtifactStore(th_home / "artifacts")
    job = jobs.add(spec, job_id="job-celery")
    for seed, adapter in ((1, adapters[1]), (2, second)):
        run = seed_run_id(job, seed)
        jobs.add(spec.seed_run(seed, parent=job), job_id=run)
        store_adapter(store, run, adapter)
        jobs.run_finished(run, detail="adapter pulled")
    assert jobs.get(job).phase == "evaluating"  # type: ignore[union-attr]

    worker = CeleryWorker.start(th_env, cwd=REPO, queues="evaluate", name="eval")
    try:
        from celery import Celery

        client = Celery("test", broker=th_env["TUNEHARNESS_BROKER_URL"])
        client.send_task("tuneharness.evaluate.evaluate_job", args=[job], queue="evaluate")
        client.send_task("tuneharness.evaluate.evaluate_job", args=[job], queue="evaluate")  # a duplicate
        assert wait_until(lambda: jobs.get(job).phase == "done", timeout_s=300, interval_s=0.5), worker.log.read_text()[
            -3000:
        ]  # type: ignore[union-attr]
    finally:
        worker.stop()

    rec = jobs.get(job)
    assert rec is not None and rec.detail.startswith("refused: not_above_baseline"), rec.detail
    listed = json.loads(run_cli(["jobs", "--json"], th_env).stdout)
    assert next(j for j in listed if j["job_id"] == job)["phase"] == "done"
    history = json.loads(run_cli(["gate", "history", "--json"], th_env).stdout)
    assert [(t["model"], t["decision"]) for t in history["trials"]] == [("words", "refuse")]
    assert history["trials"][0]["baseline_heldout"] == 1.0
    assert history["trials"][0]["trial_path"] == str(th_home / "trials" / job)
    assert [r.kind for r in Ledger(engine).rows(job=job)] == ["job_evaluated"]  # once, despite the duplicate
