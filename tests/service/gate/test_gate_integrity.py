"""The gate's integrity: enough canaries, no eval row from the training data, predictors without our secrets."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from app.policy.gate_rules import judge
from gate.evaluate import EvalError, EvalRow, PredictorSpec, build_trial, predict
from gate.trial import MalformedTrial, load_trial, parse_gate_config

_DUMP_ENV = (
    "import json, os, sys\n"
    "for line in sys.stdin:\n"
    "    print(json.dumps({'id': json.loads(line)['id'], 'predicted': json.dumps(dict(os.environ))}))\n"
)


def test_a_command_predictor_sees_no_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Vendor keys, tokens, passwords and database URLs stay behind; PATH and HOME go through."""
    secrets = {
        "VAST_API_KEY": "vast-secret",
        "RUNPOD_API_KEY": "runpod-secret",
        "TUNEHARNESS_DB_URL": "postgresql://app:pw@db/tuneharness",
        "TUNEHARNESS_BROKER_URL": "redis://:pw@redis:6379/0",
        "TUNEHARNESS_ALERT_WEBHOOK_URL": "https://hooks.slack.com/services/T/B/x",
        "AWS_SECRET_ACCESS_KEY": "aws-secret",
        "HF_TOKEN": "hf_secret",
        "SOMETHING_PASSWORD": "pw",
        "PYTHONPATH": "https://user:pw@example.org/",  # an allowed name with a password in its value
    }
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    script = tmp_path / "dump_env.py"
    script.write_text(_DUMP_ENV, encoding="utf-8")
    rows = [EvalRow("h1", "heldout", "ok", "text", "a line")]
    got = predict(PredictorSpec("command", f"{sys.executable} {script}"), rows, what="baseline", base_model=None)
    env = json.loads(got["h1"])
    assert not set(secrets) & set(env), sorted(set(secrets) & set(env))
    assert not any(v in json.dumps(env) for v in secrets.values())
    assert "PATH" in env and env["HF_HUB_OFFLINE"] == "1"


def test_an_adapter_predictor_sees_no_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`python -m trainer predict` for an adapter from a host runs without our keys or database URL."""
    monkeypatch.setenv("VAST_API_KEY", "vast-secret")
    monkeypatch.setenv("TUNEHARNESS_DB_URL", "postgresql://app:pw@db/tuneharness")
    fake_python = tmp_path / "python"
    fake_python.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        "out = sys.argv[sys.argv.index('--output') + 1]\n"
        "open(out, 'w').write(json.dumps({'id': 'h1', 'predicted': json.dumps(dict(os.environ))}) + '\\n')\n",
        encoding="utf-8",
    )
    fake_python.chmod(0o755)
    (tmp_path / "adapter").mkdir()
    rows = [EvalRow("h1", "heldout", "ok", "prompt", "a line")]
    spec = PredictorSpec("adapter", str(tmp_path / "adapter"))
    got = predict(spec, rows, what="candidate", base_model=tmp_path, python=str(fake_python))
    env = json.loads(got["h1"])
    assert "VAST_API_KEY" not in env and "TUNEHARNESS_DB_URL" not in env and "PYTHONPATH" in env


def _trial(tmp_path: Path, *, canaries: int, gate: dict[str, object]) -> Path:
    d = tmp_path / f"trial-{canaries}-{len(gate)}"
    d.mkdir()
    rows = [("h1", "heldout", "ok"), ("h2", "heldout", "nan")] + [(f"c{i}", "canary", "oom") for i in range(canaries)]

    def write(name: str, wrong: set[str]) -> None:
        text = "".join(
            json.dumps({"id": i, "slice": s, "expected": e, "predicted": "x" if i in wrong else e}) + "\n"
            for i, s, e in rows
        )
        (d / name).write_text(text, encoding="utf-8")

    (d / "gate.json").write_text(json.dumps(gate), encoding="utf-8")
    write("baseline.jsonl", {"h1"})
    write("candidate-seed-1.jsonl", set())
    write("candidate-seed-2.jsonl", set())
    return d


def test_fewer_than_ten_canaries_are_refused_unless_the_gate_says_so(tmp_path: Path) -> None:
    """Three canaries refuse with canaries_too_few; ten promote; min_canaries 3 in gate.json promotes on purpose."""
    few = judge(load_trial(_trial(tmp_path, canaries=3, gate={"metric": "accuracy"})).trial)
    assert [f.code for f in few.reasons] == ["canaries_too_few"]
    assert "3 canary row(s)" in few.reasons[0].detail and "at least 10" in few.reasons[0].detail
    assert judge(load_trial(_trial(tmp_path, canaries=10, gate={"metric": "accuracy"})).trial).promoted
    lowered = {"metric": "accuracy", "min_canaries": 3}
    assert judge(load_trial(_trial(tmp_path, canaries=3, gate=lowered)).trial).promoted


@pytest.mark.parametrize("value", [1.5, -1, "3", True, float("nan")])
def test_min_canaries_must_be_a_whole_number(tmp_path: Path, value: object) -> None:
    """min_canaries that is not a whole number >= 0 is refused naming gate.json."""
    path = tmp_path / "gate.json"
    path.write_text(json.dumps({"metric": "accuracy", "min_canaries": value}), encoding="utf-8")
    with pytest.raises(MalformedTrial, match="min_canaries"):
        parse_gate_config(path, default_model="m")


def test_eval_rows_from_the_training_data_are_refused_by_name(tmp_path: Path) -> None:
    """Eval rows whose input is in the training file (spacing aside) are refused before any predictor
    runs, each named with the training line; no trial directory is written."""
    train = tmp_path / "train.jsonl"
    train.write_text(
        json.dumps({"prompt": "alpha  beta ->", "completion": " beta alpha"})
        + "\n"
        + json.dumps(
            {"messages": [{"role": "user", "content": "gamma delta ->"}, {"role": "assistant", "content": "x"}]}
        )
        + "\n"
        + json.dumps({"prompt": "unrelated ->", "completion": "y"})
        + "\n",
        encoding="utf-8",
    )
    evals = tmp_path / "eval.jsonl"
    evals.write_text(
        "".join(
            json.dumps(r) + "\n"
            for r in (
                {"id": "h1", "slice": "heldout", "prompt": "alpha beta ->", "expected": " beta alpha"},
                {"id": "h2", "slice": "heldout", "prompt": "new words ->", "expected": " words new"},
                {"id": "c1", "slice": "canary", "prompt": "gamma delta ->", "expected": " delta gamma"},
            )
        ),
        encoding="utf-8",
    )
    cfg = tmp_path / "gate.json"
    cfg.write_text(json.dumps({"metric": "accuracy", "min_canaries": 1}), encoding="utf-8")
    never_run = f"command:{sys.executable} -c 'raise SystemExit(9)'"
    out = tmp_path / "trial"
    with pytest.raises(EvalError) as caught:
        build_trial(
            out,
            config_path=cfg,
            eval_paths=[evals],
            baseline=never_run,
            candidates=[f"1={never_run}", f"2={never_run}"],
            train_paths=[train],
        )
    msg = str(caught.value)
    assert msg.startswith("2 eval row(s) also appear in the training data")
    assert f"h1 (= {train}:1)" in msg and f"c1 (= {train}:2)" in msg and "h2" not in msg
    assert not out.exists()
