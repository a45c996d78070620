"""The evaluate stage: a gated job's seed adapters -> a trial directory -> the gate's decision on the job."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.alerts import InMemoryNotifier
from app.artifacts import LocalArtifactStore
from app.db import init_db, make_engine
from app.jobs import JobStore, parse_job_text, seed_run_id
from app.ledger import Ledger
from gate.jobs import JobEvaluator
from gate.service import GateService
from tests.support.adapters import store_adapter, train_tiny_adapters

JOB = """\
name: {name}
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
budget_usd: 2.0
gate:
  config: {{metric: accuracy, task: tiny words, baseline_name: rules, min_canaries: 0}}
  eval: eval.jsonl
  baseline: predictions:baseline.jsonl
"""

PROMPTS = [f"w{i} x{i % 3} ->" for i in range(20, 26)]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, Path]]:
    """A tiny causal LM and two real adapters (seeds 1 and 2, two steps each) from `python -m trainer run`."""
    return train_tiny_adapters(tmp_path_factory.mktemp("adapters"), (1, 2), steps=2)


@dataclass
class Harness:
    root: Path
    jobs: JobStore
    ledger: Ledger
    notifier: InMemoryNotifier
    store: LocalArtifactStore
    evaluator: JobEvaluator

    def gated_job(
        self,
        name: str,
        *,
        base: Path,
        eval_rows: list[dict[str, str]],
        baseline: dict[str, str],
        adapters: dict[int, Path] | None,
    ) -> str:
        """Record a gated job whose seed runs are done (their adapters in the store): the job is `evaluating`."""
        d = self.root / name
        d.mkdir()
        (d / "train.jsonl").write_text('{"prompt": "a", "completion": "b"}\n')
        (d / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in eval_rows))
        (d / "baseline.jsonl").write_text(
            "".join(json.dumps({"id": i, "predicted": p}) + "\n" for i, p in baseline.items())
        )
        spec = parse_job_text(JOB.format(name=name, base=base), source=str(d / "job.yaml"), base_dir=d)
        job_id = self.jobs.add(spec, job_id=f"job-{name}")
        for seed in spec.seeds:
            run = seed_run_id(job_id, seed)
            self.jobs.add(spec.seed_run(seed, parent=job_id), job_id=run)
            if adapters is not None:
                store_adapter(self.store, run, adapters[seed])
            self.jobs.run_finished(run, detail="adapter pulled")
        if adapters is None:
            self.jobs.set_phase(job_id, "evaluating")
        return job_id

    def kinds(self, job: str | None = None) -> list[str]:
        return [r.kind for r in self.ledger.rows(job=job)]


@pytest.fixture
def h(tmp_path: Path) -> Harness:
    engine = make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    init_db(engine)
    ledger, notifier = Ledger(engine), InMemoryNotifier()
    store = LocalArtifactStore(tmp_path / "artifacts")
    jobs = JobStore(engine)
    evaluator = JobEvaluator(
        jobs=jobs,
        store=store,
        gate=GateService(ledger=ledger, notifier=notifier),
        ledger=ledger,
        work_dir=tmp_path / "home",
    )
    return Harness(tmp_path, jobs, ledger, notifier, store, evaluator)


def _rows(expected: list[str], slices: list[str] | None = None) -> list[dict[str, str]]:
    slices = slices or ["heldout"] * len(expected)
    return [
        {"id": f"r{i}", "slice": s, "prompt": p, "expected": e}
        for i, (p, e, s) in enumerate(zip(PROMPTS, expected, slices, strict=False))
    ]


@pytest.mark.slow
def test_a_perfect_baseline_refuses_the_tiny_adapters_and_the_job_is_done_refused(
    h: Harness, trained: tuple[Path, dict[int, Path]]
) -> None:
    """Given two real seed adapters and a baseline that is always right, the gate refuses: the job is
    `done` with detail `refused: not_above_baseline ...`, one `gate_decision`, one `gate_refused` alert."""
    base, adapters = trained
    rows = _rows([" x2", " x0", " x1", " x2"], ["heldout", "heldout", "heldout", "canary"])
    job = h.gated_job(
        "refused", base=base, eval_rows=rows, baseline={r["id"]: r["expected"] for r in rows}, adapters=adapters
    )
    assert h.jobs.get(job).phase == "evaluating"  # type: ignore[union-attr]

    out = h.evaluator.evaluate(job)

    assert out.result == "refuse" and out.recorded_now
    rec = h.jobs.get(job)
    assert rec is not None and rec.phase == "done" and rec.detail.startswith("refused: not_above_baseline")
    trial = h.evaluator.trial_dir(job)
    assert sorted(p.name for p in trial.iterdir()) == [
        "baseline.jsonl",
        "candidate-seed-1.jsonl",
        "candidate-seed-2.jsonl",
        "decision.json",
        "gate.json",
    ]
    assert json.loads((trial / "gate.json").read_text())["model"] == "refused"  # the job's name by default
    ev = h.jobs.evaluation(job)
    assert ev is not None and ev.decision == "refuse" and ev.trial_path == str(trial)
    assert "not_above_baseline" in ev.reasons
    assert h.kinds().count("gate_decision") == 1 and h.kinds(job) == ["job_evaluated"]
    assert [a.kind for a in h.notifier.alerts] == ["gate_refused"]

    # A redelivered task: nothing new anywhere.
    again = h.evaluator.evaluate(job)
    assert again.result == "refuse" and again.detail == "already evaluated"
    # A task that died after judging but before the job was marked done: re-judged from the same files.
    h.jobs.set_phase(job, "evaluating")
    rejudged = h.evaluator.evaluate(job)
    assert rejudged.result == "refuse" and not rejudged.recorded_now
    assert h.kinds().count("gate_decision") == 1 and h.kinds(job) == ["job_evaluated"]
    assert len({a.key for a in h.notifier.alerts}) == 1  # keyed: the outbox delivers it once


@pytest.mark.slow
def test_adapters_that_beat_the_baseline_on_every_seed_are_promoted(
    h: Harness, trained: tuple[Path, dict[int, Path]]
) -> None:
    """Held-out rows whose expected text is what both seeds say, against a baseline that is always
    wrong: the worst seed beats it, the job is `done` with detail `promoted`, no alert."""
    base, adapters = trained
    probe = h.gated_job(
        "probe",
        base=base,
        eval_rows=_rows(["?"] * len(PROMPTS)),
        baseline={f"r{i}": "?" for i in range(len(PROMPTS))},
        adapters=adapters,
    )
    h.evaluator.evaluate(probe)
    trial = h.evaluator.trial_dir(probe)
    said = [
        {r["id"]: r["predicted"] for r in map(json.loads, (trial / f"candidate-seed-{s}.jsonl").open())} for s in (1, 2)
    ]
    agreed = [(i, said[0][f"r{i}"]) for i in range(len(PROMPTS)) if said[0][f"r{i}"] == said[1][f"r{i}"]]
    assert agreed, f"the two 2-step adapters disagree on every prompt: {said}"
    rows = [{"id": f"r{i}", "slice": "heldout", "prompt": PROMPTS[i], "expected": text} for i, text in agreed]

    job = h.gated_job(
        "promoted", base=base, eval_rows=rows, baseline={r["id"]: r["expected"] + "!" for r in rows}, adapters=adapters
    )
    out = h.evaluator.evaluate(job)

    assert out.result == "promote", out.detail
    rec = h.jobs.get(job)
    assert rec is not None and rec.phase == "done" and rec.detail.startswith("promoted; trial ")
    assert {a.kind for a in h.notifier.alerts} == {"gate_refused"}  # the probe's refusal only
    assert len({a.key for a in h.notifier.alerts}) == 1
    assert GateService(ledger=h.ledger, notifier=h.notifier).history().production["promoted"].trial_path == str(
        h.evaluator.trial_dir(job)
    )


def test_a_missing_seed_adapter_fails_the_job_with_the_reason(h: Harness, tmp_path: Path) -> None:
    """No adapter in the store for a seed run: the job is `failed`, an `evaluation_failed` event says why."""
    (tmp_path / "model").mkdir()
    job = h.gated_job("lost", base=tmp_path / "model", eval_rows=_rows([" x2"]), baseline={"r0": " x2"}, adapters=None)
    out = h.evaluator.evaluate(job)
    rec = h.jobs.get(job)
    assert out.result == "failed" and rec is not None and rec.phase == "failed"
    assert "evaluation failed" in rec.detail and "jobs/job-lost-seed-1/adapter" in rec.detail
    assert h.kinds(job) == ["evaluation_failed"] and h.jobs.evaluation(job) is None


def test_a_job_that_is_not_evaluating_is_left_alone(h: Harness, tmp_path: Path) -> None:
    """A job still training (or unknown) is skipped: nothing is built, judged or recorded."""
    (tmp_path / "model").mkdir()
    job = h.gated_job("early", base=tmp_path / "model", eval_rows=_rows([" x2"]), baseline={"r0": " x2"}, adapters=None)
    h.jobs.set_phase(job, "training")
    assert h.evaluator.evaluate(job).result == "skipped"
    assert h.evaluator.evaluate("job-nope").result == "skipped"
    assert h.kinds() == [] and not h.evaluator.trial_dir(job).exists()
