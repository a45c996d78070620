"""The evaluate stage of a gated `kind: command` job: each seed's output is judged through the
predictor command the job names (`{adapter}` replaced by that output's directory)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from app.alerts import InMemoryNotifier
from app.artifacts import LocalArtifactStore
from app.db import init_db, make_engine
from app.jobs import JobStore, parse_job_text, seed_run_id
from app.ledger import Ledger
from gate.jobs import JobEvaluator
from gate.service import GateService
from tests.support.adapters import store_adapter
from trainer.checkpoint import write_dir_atomically

PREDICT = """\
import json, sys
from pathlib import Path
answer = json.loads((Path(sys.argv[1]) / "answer.json").read_text())
for line in sys.stdin:
    if line.strip():
        row = json.loads(line)
        print(json.dumps({"id": row["id"], "predicted": answer.get(row["id"], " x9")}), flush=True)
"""

JOB = """\
name: byo-gated
train:
  kind: command
  script: sft.py
  train_file: train.jsonl
  predict: "{python} predict.py {{adapter}}"
needs:
  gpu: [RTX 3090]
budget_usd: 2.0
gate:
  config: {{metric: accuracy, task: tiny words, baseline_name: rules, min_canaries: 0}}
  eval: eval.jsonl
  baseline: predictions:baseline.jsonl
"""


def test_a_command_jobs_seeds_are_judged_through_its_own_predictor(tmp_path: Path) -> None:
    """Two seed outputs that answer every eval row right beat a baseline that is always wrong: the
    gate promotes, and each candidate's predictions came from the job's `predict` command."""
    engine = make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    init_db(engine)
    ledger = Ledger(engine)
    store = LocalArtifactStore(tmp_path / "artifacts")
    jobs = JobStore(engine)
    evaluator = JobEvaluator(
        jobs=jobs,
        store=store,
        gate=GateService(ledger=ledger, notifier=InMemoryNotifier()),
        ledger=ledger,
        work_dir=tmp_path / "home",
    )
    d = tmp_path / "project"
    d.mkdir()
    (d / "sft.py").write_text("print('trains')\n")
    (d / "predict.py").write_text(PREDICT)
    (d / "train.jsonl").write_text('{"prompt": "a", "completion": "b"}\n')
    rows = [{"id": f"r{i}", "slice": "heldout", "prompt": f"w{i} ->", "expected": f" x{i}"} for i in range(4)]
    (d / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "baseline.jsonl").write_text("".join(json.dumps({"id": r["id"], "predicted": " no"}) + "\n" for r in rows))
    spec = parse_job_text(JOB.format(python=sys.executable), source=str(d / "job.yaml"), base_dir=d)
    job_id = jobs.add(spec, job_id="job-byo")
    for seed in spec.seeds:
        run = seed_run_id(job_id, seed)
        jobs.add(spec.seed_run(seed, parent=job_id), job_id=run)
        out = tmp_path / f"output-{seed}"
        answers = json.dumps({r["id"]: r["expected"] for r in rows}).encode()
        write_dir_atomically(out, lambda tmp, a=answers: (tmp / "answer.json").write_bytes(a), marker={"step": 1})
        store_adapter(store, run, out)
        jobs.run_finished(run, detail="adapter pulled")

    result = evaluator.evaluate(job_id)

    assert result.result == "promote", result
    trial = evaluator.trial_dir(job_id)
    for seed in spec.seeds:
        preds = [json.loads(line) for line in (trial / f"candidate-seed-{seed}.jsonl").read_text().splitlines()]
        assert {p["id"]: p["predicted"] for p in preds} == {r["id"]: r["expected"] for r in rows}
