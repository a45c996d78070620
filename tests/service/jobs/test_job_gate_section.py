"""The job file's `gate:` section: validated with the field and line, normalised, one run per seed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.db import init_db, make_engine
from app.jobs import JobFileError, JobStore, load_job_file, parse_job_text, seed_run_id
from tests.support.jobfiles import train_section

HEAD = (
    "name: gated\n"
    + train_section("none")
    + """\
needs:
  gpu: [RTX 3090]
budget_usd: 3.0
"""
)

GATE = """\
gate:
  config: gate.json
  eval: eval.jsonl
  baseline: predictions:baseline.jsonl
"""


@pytest.fixture
def jobdir(tmp_path: Path) -> Path:
    (tmp_path / "model").mkdir()
    (tmp_path / "train.jsonl").write_text('{"prompt": "a", "completion": "b"}\n')
    (tmp_path / "gate.json").write_text(json.dumps({"metric": "accuracy", "min_canaries": 1}))
    (tmp_path / "eval.jsonl").write_text(
        '{"id": "h1", "slice": "heldout", "prompt": "q", "expected": "b"}\n'
        '{"id": "c1", "slice": "canary", "prompt": "c", "expected": "d"}\n'
    )
    (tmp_path / "baseline.jsonl").write_text('{"id": "h1", "predicted": "b"}\n')
    return tmp_path


def bad(text: str, base: Path) -> JobFileError:
    with pytest.raises(JobFileError) as info:
        parse_job_text(text, source="job.yaml", base_dir=base)
    return info.value


def test_a_gate_section_is_normalised_with_two_default_seeds(jobdir: Path) -> None:
    """Paths become absolute, seeds default to [1, 2], the per-predictor timeout to 400 s."""
    (jobdir / "job.yaml").write_text(HEAD + GATE)
    spec = load_job_file(jobdir / "job.yaml")
    assert spec.gate is not None
    assert spec.gate["config"] == str((jobdir / "gate.json").resolve())
    assert spec.gate["eval"] == [str((jobdir / "eval.jsonl").resolve())]
    assert spec.gate["baseline"] == f"predictions:{(jobdir / 'baseline.jsonl').resolve()}"
    assert spec.seeds == (1, 2) and spec.gate["timeout_s"] == 400.0 and "incumbent" not in spec.gate


def test_inline_config_command_baseline_incumbent_and_seeds(jobdir: Path) -> None:
    """An inline gate.json, a command baseline (kept verbatim), an adapter incumbent and three seeds."""
    (jobdir / "prod").mkdir()
    text = (
        HEAD
        + """\
gate:
  config: {metric: macro_f1, min_margin: 0.05, model: triage, min_canaries: 1}
  eval: [eval.jsonl]
  baseline: command:python rules.py --strict
  incumbent: adapter:prod
  seeds: [3, 1, 7]
  timeout_s: 120
"""
    )
    spec = parse_job_text(text, source="job.yaml", base_dir=jobdir)
    assert spec.gate is not None
    assert spec.gate["config"] == {"metric": "macro_f1", "min_margin": 0.05, "model": "triage", "min_canaries": 1}
    assert spec.gate["baseline"] == "command:python rules.py --strict"
    assert spec.gate["incumbent"] == f"adapter:{(jobdir / 'prod').resolve()}"
    assert spec.seeds == (3, 1, 7) and spec.gate["timeout_s"] == 120.0


@pytest.mark.parametrize(
    ("section", "line", "field", "words"),
    [
        ("gate:\n  config: gate.json\n  eval: eval.jsonl\n", 17, "gate", "`baseline` is missing"),
        (
            "gate:\n  config: gate.json\n  eval: eval.jsonl\n  baseline: predictions:baseline.jsonl\n  seeds: [1]\n",
            21,
            "gate.seeds",
            "at least two",
        ),
        (
            "gate:\n  config: gate.json\n  eval: eval.jsonl\n  baseline: predictions:baseline.jsonl\n  seeds: [2, 2]\n",
            21,
            "gate.seeds",
            "repeats a seed",
        ),
        (
            "gate:\n  config: gate.json\n  eval: eval.jsonl\n  baseline: predictions:baseline.jsonl\n  seeds: [1, x]\n",
            21,
            "gate.seeds[1]",
            "whole number",
        ),
        (
            "gate:\n  config: gate.json\n  eval: eval.jsonl\n  baseline: rules.py\n",
            20,
            "gate.baseline",
            "not a predictor",
        ),
        (
            "gate:\n  config: gate.json\n  eval: eval.jsonl\n  baseline: adapter:model\n",
            20,
            "gate.baseline",
            "not an adapter",
        ),
        (
            "gate:\n  config: gate.json\n  eval: missing.jsonl\n  baseline: predictions:baseline.jsonl\n",
            19,
            "gate.eval",
            "does not exist",
        ),
        (
            "gate:\n  config: gate.json\n  eval: eval.jsonl\n  baseline: predictions:baseline.jsonl\n  seed: [1, 2]\n",
            21,
            "gate.seed",
            "unknown field",
        ),
        (
            "gate:\n  config: {metric: f1}\n  eval: eval.jsonl\n  baseline: predictions:baseline.jsonl\n",
            18,
            "gate.config.metric",
            "not one of accuracy, macro_f1",
        ),
        (
            "gate:\n  config: {metric: accuracy, min_marign: 0.1}\n  eval: eval.jsonl\n  baseline: command:x\n",
            18,
            "gate.config.min_marign",
            "unknown field",
        ),
        (
            "gate:\n  config: gate.json\n  eval: eval.jsonl\n  baseline: command:x\n  timeout_s: 5000\n",
            21,
            "gate.timeout_s",
            "at most 1700",
        ),
        ("gate: gate.json\n", 17, "gate", "must be a mapping"),
    ],
)
def test_a_bad_gate_section_names_the_field_and_line(
    jobdir: Path, section: str, line: int, field: str, words: str
) -> None:
    """Each mistake in the gate section is refused before anything is enqueued, naming line and field."""
    err = bad(HEAD + section, jobdir)
    assert err.line == line and err.field == field and words in err.problem, str(err)
    assert "Fix:" in str(err)


def test_a_bad_eval_row_names_the_eval_file_line(jobdir: Path) -> None:
    """An eval row without `expected` is named by the eval file's line, at submit, not at evaluation."""
    (jobdir / "eval.jsonl").write_text(
        '{"id": "h1", "slice": "heldout", "prompt": "q", "expected": "b"}\n'
        '{"id": "h2", "slice": "heldout", "prompt": "a"}\n'
    )
    err = bad(HEAD + GATE, jobdir)
    assert err.field == "gate.eval" and err.line == 19 and "eval.jsonl line 2" in err.problem


def test_a_gate_json_with_an_unknown_key_is_refused(jobdir: Path) -> None:
    """A typo in the referenced gate.json (min_marign) fails at submit."""
    (jobdir / "gate.json").write_text(json.dumps({"metric": "accuracy", "min_marign": 0.1}))
    err = bad(HEAD + GATE, jobdir)
    assert err.field == "gate.config" and "min_marign" in err.problem


def test_seed_runs_override_the_seed_and_split_the_budget(jobdir: Path) -> None:
    """Each seed's run trains the same job with its seed, no gate, and budget_usd / seeds."""
    spec = parse_job_text(HEAD + GATE, source="job.yaml", base_dir=jobdir)
    run = spec.seed_run(2, parent="job-x")
    assert run.train["seed"] == 2 and spec.train["seed"] == 1
    assert run.gate is None and run.parent == "job-x" and run.budget_usd == pytest.approx(1.5)
    assert run.ship == spec.ship and run.seeds == ()


def test_the_last_seed_run_to_finish_hands_the_job_to_evaluation(jobdir: Path, tmp_path: Path) -> None:
    """Given a gated job with two runs, when both finish, then the second finish returns the job, now `evaluating`."""
    engine = make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    init_db(engine)
    store = JobStore(engine)
    spec = parse_job_text(HEAD + GATE, source="job.yaml", base_dir=jobdir)
    job = store.add(spec, job_id="job-g")
    for seed in spec.seeds:
        store.add(spec.seed_run(seed, parent=job), job_id=seed_run_id(job, seed))
    assert store.parent_of("job-g-seed-1") == "job-g" and store.parent_of("job-g") is None
    assert store.run_finished("job-g-seed-2", detail="adapter") is None
    assert store.get("job-g-seed-2").phase == "done"  # type: ignore[union-attr]
    assert store.run_finished("job-g-seed-1", detail="adapter") == "job-g"
    assert store.get("job-g").phase == "evaluating"  # type: ignore[union-attr]


def test_a_job_without_a_gate_is_done_when_its_adapter_is_pulled(jobdir: Path, tmp_path: Path) -> None:
    """No gate: the finished job is `done`, and nothing is handed to evaluation."""
    engine = make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    init_db(engine)
    store = JobStore(engine)
    store.add(parse_job_text(HEAD, source="job.yaml", base_dir=jobdir), job_id="job-plain")
    assert store.run_finished("job-plain", detail="adapter at jobs/job-plain/adapter") is None
    assert store.get("job-plain").phase == "done"  # type: ignore[union-attr]


def test_a_failed_seed_run_fails_its_job(jobdir: Path, tmp_path: Path) -> None:
    """The gate needs every seed: one failed run fails the gated job, naming the run."""
    engine = make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    init_db(engine)
    store = JobStore(engine)
    spec = parse_job_text(HEAD + GATE, source="job.yaml", base_dir=jobdir)
    store.add(spec, job_id="job-f")
    for seed in spec.seeds:
        store.add(spec.seed_run(seed, parent="job-f"), job_id=seed_run_id("job-f", seed))
    store.run_failed("job-f-seed-1", detail="trainer died: diverged")
    rec = store.get("job-f")
    assert rec is not None and rec.phase == "failed" and "job-f-seed-1" in rec.detail
