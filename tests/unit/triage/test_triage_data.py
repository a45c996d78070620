"""The labelled data in data/triage/ and what the package ships of it: the shipped decision agrees
with the committed gate trial, the committed corpus is the seeded generator's, and a missing data
folder is one line naming the path and the fix."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from app.errors import UserError
from app.triage import corpus, report, training
from app.triage.specialist import DEFAULT_ADAPTER_DIR, promoted
from gate.trial import hash_files

SHIPPED_DECISION = DEFAULT_ADAPTER_DIR.parent / "decision.json"


def _trial_decision() -> dict:
    return json.loads((training.TRIAL_DIR / "decision.json").read_text(encoding="utf-8"))


def test_the_shipped_decision_agrees_with_the_gate_trial_in_the_repository() -> None:
    """app/triage/log_doctor/decision.json is what the install step writes from the trial's decision.json."""
    shipped = json.loads(SHIPPED_DECISION.read_text(encoding="utf-8"))
    assert shipped == training.shipped_decision(_trial_decision())
    assert promoted() == (shipped["decision"] == "promote")


def test_the_trial_the_decision_names_is_the_committed_one() -> None:
    """The hash recorded in both decisions is the hash of the trial files in data/triage/log_doctor_trial."""
    trial = _trial_decision()["trial"]
    assert hash_files(training.TRIAL_DIR, tuple(trial["files"])) == trial["hash"]
    assert json.loads(SHIPPED_DECISION.read_text(encoding="utf-8"))["trial_hash"] == trial["hash"]


def test_the_committed_corpus_is_the_seeded_generators_output() -> None:
    """data/triage/corpus/<split>.jsonl holds exactly `build(8)`, so a generator change shows in this test."""
    for split, rows in corpus.build(8).items():
        path = corpus.DATA_DIR / "corpus" / f"{split}.jsonl"
        committed = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        assert committed == rows, split


@pytest.fixture
def no_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    missing = tmp_path / "site-packages" / "data" / "triage"
    monkeypatch.setattr(corpus, "DATA_DIR", missing)
    return missing


def test_missing_data_is_one_line_naming_the_path_and_the_fix(no_data: Path) -> None:
    """Given no data folder, reading real rows raises a UserError (exit 2) whose one line names the file and the fix."""
    with pytest.raises(corpus.TriageDataMissing) as caught:
        corpus.real_rows("test")
    text = str(caught.value)
    assert isinstance(caught.value, UserError) and caught.value.exit_code == 2
    assert "\n" not in text
    assert str(no_data / "real" / "test.jsonl") in text and "Fix: " in text
    with pytest.raises(corpus.TriageDataMissing, match=r"handwritten\.txt"):
        corpus.handwritten()


def test_the_report_without_data_exits_2_with_one_line(no_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`python -m app.triage.report` without the data folder prints one line on stderr and exits 2."""
    assert report.main(["--check"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "triage data missing" in err and "Fix: " in err


def test_training_without_data_stops_before_anything_runs(no_data: Path, tmp_path: Path) -> None:
    """`train_and_judge` without the data folder raises TriageDataMissing and writes nothing."""
    out = tmp_path / "out"
    with pytest.raises(corpus.TriageDataMissing):
        training.train_and_judge(training.TrainingPlan(out_dir=out), echo=lambda _line: None)
    assert not out.exists()


def test_installing_a_promoted_candidate_ships_its_decision_beside_the_adapter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`install_specialist` puts the better seed's adapter, metrics and decision in the package and
    the trial in the repository."""
    out = tmp_path / "out"
    for seed in (1, 2):
        adapter = out / f"job-seed-{seed}" / "adapter"
        adapter.mkdir(parents=True)
        (adapter / "trainer_meta.json").write_text(json.dumps({"seed": seed}))
        (out / f"job-seed-{seed}" / "job.json").write_text(json.dumps({"seed": seed, "base_model": "/models/minilm"}))
    shutil.copytree(training.TRIAL_DIR, out / "trial")
    monkeypatch.setattr(training, "SHIP_DIR", tmp_path / "package" / "log_doctor")
    monkeypatch.setattr(training, "TRIAL_DIR", tmp_path / "repo" / "log_doctor_trial")
    summary = {
        "seeds": {
            "1": {"chain": {"heldout": 0.95}, "specialist_alone": {"heldout": 0.8}},
            "2": {"chain": {"heldout": 0.96}, "specialist_alone": {"heldout": 0.7}},
        },
        "baseline": {"heldout": 0.9},
        "decision": "promote",
        "reasons": [],
    }

    ship = training.install_specialist(training.TrainingPlan(out_dir=out), summary)

    assert json.loads((ship / "adapter" / "trainer_meta.json").read_text()) == {"seed": 2}
    assert json.loads((ship / "metrics.json").read_text())["shipped_seed"] == 2
    decision = json.loads((ship / "decision.json").read_text())
    assert decision == training.shipped_decision(_trial_decision()) and promoted(ship)
    assert sorted(p.name for p in training.TRIAL_DIR.iterdir()) == sorted(p.name for p in (out / "trial").iterdir())


def test_the_ab_comparison_counts_each_kind_of_change_and_lists_no_test_row() -> None:
    """`report.compare` counts rows to right, to wrong and between states per set, naming changed rows
    except test ones."""

    def row(id_: str, set_: str, label: str, rules: str, chain: str) -> dict:
        return {
            "id": id_,
            "set": set_,
            "label": label,
            "rules": rules,
            "rules_guess": rules,
            "rule": "r",
            "chain": chain,
            "stage": "rules",
            "needs_operator": False,
        }

    before = [
        row("a", "real-dev", "oom", "stalled", "oom"),
        row("b", "real-test", "oom", "oom", "oom"),
        row("c", "eval", "oom", "oom", "oom"),
    ]
    after = [
        row("a", "real-dev", "oom", "oom", "oom"),
        row("b", "real-test", "oom", "stalled", "stalled"),
        row("c", "eval", "oom", "oom", "oom"),
    ]
    lines = report.compare(before, after)
    assert lines[0] == "rows in both files: 3 (before 3, after 3)"
    assert "real-dev     rules to right 1; to wrong 0; right either way 0; wrong either way 0" in lines
    assert "real-test    chain to right 0; to wrong 1; right either way 0; wrong either way 0" in lines
    assert not any(" b:" in line for line in lines)
    assert any(line.startswith("  real-dev rules a: label oom") for line in lines)
    assert report.compare(before, before)[1:] == ["no verdict changed"]
