"""The job file's JSON Schema: generated from the models that validate job files, checked in, and
in agreement with the loader on good and bad files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from app.cli.schema_cmd import job_schema_text
from app.jobs import JobFileError, parse_job_text
from tests.service.foundation.test_bad_input import GATE as BAD_INPUT_GATE
from tests.service.foundation.test_bad_input import GOOD_JOB as BAD_INPUT_JOB
from tests.service.jobs.test_job_file import GOOD as JOB_FILE_GOOD
from tests.service.jobs.test_job_gate_section import GATE as GATE_SECTION
from tests.service.jobs.test_job_gate_section import HEAD as GATE_HEAD
from tests.support.jobfiles import sim_needs_section, train_section

ROOT = Path(__file__).resolve().parents[3]
SCHEMA_FILE = ROOT / "docs" / "job.schema.json"
REGENERATE = "tuneharness schema job --out docs/job.schema.json"
REV = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


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


def test_the_checked_in_schema_is_the_models_schema() -> None:
    """docs/job.schema.json is exactly what the models generate; a stale copy names the command that regenerates it."""
    assert SCHEMA_FILE.read_text(encoding="utf-8") == job_schema_text(), f"stale: run `{REGENERATE}`"


def test_every_field_carries_a_description_for_the_editor(validator: jsonschema.Draft202012Validator) -> None:
    """Every property of every section has a description, what an editor shows on hover."""
    schema: dict[str, Any] = validator.schema  # type: ignore[assignment]
    sections = [schema, *schema["$defs"].values()]
    missing = [
        f"{section.get('title')}.{name}"
        for section in sections
        for name, prop in section.get("properties", {}).items()
        if not prop.get("description")
    ]
    assert sections and not missing, missing


def test_the_example_says_where_its_schema_is() -> None:
    """examples/job.yaml names the schema for the YAML language server, by a path that exists."""
    first = (ROOT / "examples" / "job.yaml").read_text(encoding="utf-8").splitlines()[0]
    assert first == "# yaml-language-server: $schema=../docs/job.schema.json"
    assert (ROOT / "examples" / "../docs/job.schema.json").resolve() == SCHEMA_FILE


GOOD_FILES = {
    "example": (ROOT / "examples" / "job.yaml").read_text(encoding="utf-8"),
    "job-file": JOB_FILE_GOOD,
    "gate-section": GATE_HEAD + GATE_SECTION,
    "bad-input-base": BAD_INPUT_JOB + BAD_INPUT_GATE % "60",
    "sim-needs": "name: sim\n" + train_section() + sim_needs_section(standby_hosts=1),
    "hub-model-kind-and-inline-gate": (
        "name: hub\n"
        + train_section("nf4").replace(
            "  base_model: model", f"  kind: qlora\n  base_model: {{hf: Qwen/Q-0.5B, revision: {REV}}}"
        )
        + "needs: {gpu: RTX 3090, providers: vast, kill_after_hours: 2}\n"
        + "gate:\n  config: {metric: macro_f1, min_margin: 0.05, min_canaries: 1}\n  eval: [eval.jsonl]\n"
        + "  baseline: command:python rules.py\n  incumbent: adapter:model\n  seeds: [3, 1, 7]\n  timeout_s: 120\n"
    ),
}


@pytest.mark.parametrize("name", sorted(GOOD_FILES))
def test_the_job_files_the_tests_use_validate_against_the_schema(
    name: str, validator: jsonschema.Draft202012Validator, jobdir: Path
) -> None:
    """The shipped example and the tests' job files pass the published schema and the loader alike."""
    text = GOOD_FILES[name]
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(yaml.safe_load(text))]
    assert errors == []
    if name == "example":
        return  # its model is made by a command (test_job_example.py)
    spec = parse_job_text(text, source="job.yaml", base_dir=jobdir)
    assert "kind" not in spec.train  # ours, not the trainer's job.json


BASE = GATE_HEAD + GATE_SECTION

# (id, old text, new text, the loader's field): each file is wrong in one way
BAD_FILES = [
    ("unknown-key", "  seed: 1\n", "  seed: 1\n  epochs: 3\n", "train.epochs"),
    ("fraction-for-count", "  max_steps: 20", "  max_steps: 2.5", "train.max_steps"),
    ("text-for-number", "  max_steps: 20", "  max_steps: twenty", "train.max_steps"),
    ("bool-for-number", "  batch_size: 4", "  batch_size: true", "train.batch_size"),
    ("unknown-choice", "  task: causal_lm", "  task: regression", "train.task"),
    ("unknown-provider", "  gpu: [RTX 3090]\n", "  gpu: [RTX 3090]\n  providers: [aws]\n", "needs.providers[0]"),
    ("missing-required", "  seed: 1\n", "", "train"),
    ("missing-top-level", "name: gated\n", "", "name"),
    ("negative-budget", "budget_usd: 3.0", "budget_usd: -1", "budget_usd"),
    ("too-many-standby", "  gpu: [RTX 3090]\n", "  gpu: [RTX 3090]\n  standby_hosts: 9\n", "needs.standby_hosts"),
    ("not-a-predictor", "baseline: predictions:baseline.jsonl", "baseline: rules.py", "gate.baseline"),
    ("adapter-baseline", "baseline: predictions:baseline.jsonl", "baseline: adapter:model", "gate.baseline"),
    ("one-seed", "  baseline: predictions:baseline.jsonl\n", "  baseline: predictions:x\n  seeds: [1]\n", "gate.seeds"),
    ("unknown-metric", "  config: gate.json", "  config: {metric: f1}", "gate.config.metric"),
    (
        "hub-branch",
        "  base_model: model",
        "  base_model: {hf: Qwen/Q-0.5B, revision: main}",
        "train.base_model.revision",
    ),
    ("gate-not-a-mapping", GATE_SECTION, "gate: gate.json\n", "gate"),
    ("blank-name", "name: gated", "name: '  '", "name"),
    ("null-value", "  max_steps: 20", "  max_steps:", "train.max_steps"),
    ("unknown-train-kind", "  base_model: model", "  kind: keras\n  base_model: model", "train.kind"),
]


@pytest.mark.parametrize(("old", "new", "field"), [c[1:] for c in BAD_FILES], ids=[c[0] for c in BAD_FILES])
def test_a_bad_file_is_refused_by_the_schema_and_by_the_loader(
    old: str, new: str, field: str, validator: jsonschema.Draft202012Validator, jobdir: Path
) -> None:
    """The schema an editor checks with and the loader refuse the same mistakes; the loader in one line."""
    assert old in BASE
    text = BASE.replace(old, new)
    assert list(validator.iter_errors(yaml.safe_load(text))), "the schema accepted it"
    with pytest.raises(JobFileError) as info:
        parse_job_text(text, source="job.yaml", base_dir=jobdir)
    msg = str(info.value)
    assert info.value.field == field, msg
    assert msg.startswith("job.yaml") and f": {field}: " in msg and "Fix: " in msg and "\n" not in msg
    assert "pydantic" not in msg and "validation error" not in msg.lower()


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNEHARNESS_")}
    env.update(TUNEHARNESS_HOME=str(cwd / "home"), PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "app.cli.main", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_cli_prints_and_writes_the_schema(tmp_path: Path) -> None:
    """`tuneharness schema job` prints the checked-in text; --out writes it; an unwritable path is one line, exit 2."""
    printed = _cli("schema", "job", "--json", cwd=tmp_path)
    assert printed.returncode == 0 and printed.stdout == SCHEMA_FILE.read_text(encoding="utf-8"), printed.stderr
    written = _cli("schema", "job", "--out", str(tmp_path / "job.schema.json"), cwd=tmp_path)
    assert written.returncode == 0 and (tmp_path / "job.schema.json").read_bytes() == SCHEMA_FILE.read_bytes()
    refused = _cli("schema", "job", "--out", str(tmp_path / "no" / "such" / "dir.json"), cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "Fix:" in refused.stderr
    assert "Traceback" not in refused.stderr and not list((tmp_path / "no").parent.glob("no*"))


def test_a_model_rule_and_an_unknown_kind_read_as_one_line(jobdir: Path) -> None:
    """A rule a section's model raises itself and a `kind:` no model has are named by field and line, not dumped."""
    head = "name: byo\ntrain:\n  kind: command\n"
    with pytest.raises(JobFileError) as info:
        parse_job_text(head + "needs: {gpu: RTX 3090}\n", source="job.yaml", base_dir=jobdir)
    assert (info.value.line, info.value.field) == (2, "train") and "exactly one of" in info.value.problem
    with pytest.raises(JobFileError) as info:
        parse_job_text(head.replace("command", "keras") + "needs: {}\n", source="job.yaml", base_dir=jobdir)
    assert (info.value.line, info.value.field) == (3, "train.kind") and "'keras' is not one of qlora" in str(info.value)
