"""Reading a trial directory: every malformed input is refused naming the file and line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gate.trial import MalformedTrial, load_trial

GATE = {"metric": "accuracy"}


def row(i: str, expected: str = "ok", predicted: str = "ok", slice_: str = "heldout") -> dict[str, str]:
    return {"id": i, "slice": slice_, "expected": expected, "predicted": predicted}


def write_trial(d: Path, *, gate: object = GATE, files: dict[str, list[object]] | None = None) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "gate.json").write_text(gate if isinstance(gate, str) else json.dumps(gate))
    good = [row("a"), row("b", "nan", "nan")]
    base = [row("a"), row("b", "nan", "ok")]
    default = {"baseline.jsonl": base, "candidate-seed-1.jsonl": good, "candidate-seed-2.jsonl": good}
    for name, lines in {**default, **(files or {})}.items():
        text = "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines)
        (d / name).write_text(text)
    return d


def refused(d: Path) -> str:
    with pytest.raises(MalformedTrial) as info:
        load_trial(d)
    return str(info.value)


def test_a_well_formed_trial_loads_with_a_stable_hash(tmp_path: Path) -> None:
    """A good trial loads; its hash covers the judged files only and is stable."""
    d = write_trial(tmp_path / "t")
    first = load_trial(d)
    (d / "README.md").write_text("notes are not judged")
    (d / "decision.json").write_text("{}")
    again = load_trial(d)
    assert first.trial_hash == again.trial_hash and len(first.trial_hash) == 64
    assert first.files == ("baseline.jsonl", "candidate-seed-1.jsonl", "candidate-seed-2.jsonl", "gate.json")
    assert sorted(first.trial.candidates) == ["1", "2"]
    assert first.meta.model == "t"


def test_hash_changes_when_any_judged_byte_changes(tmp_path: Path) -> None:
    """Editing one prediction changes the trial's hash."""
    d = write_trial(tmp_path / "t")
    before = load_trial(d).trial_hash
    write_trial(d, files={"candidate-seed-2.jsonl": [row("a"), row("b", "nan", "ok")]})
    assert load_trial(d).trial_hash != before


def test_bad_json_line_names_file_and_line(tmp_path: Path) -> None:
    """A broken JSON line is refused with file:line."""
    d = write_trial(tmp_path / "t", files={"candidate-seed-2.jsonl": [row("a"), "{not json"]})
    msg = refused(d)
    assert "candidate-seed-2.jsonl:2" in msg and "bad JSON" in msg


def test_row_that_is_not_an_object(tmp_path: Path) -> None:
    """A JSON line that is a list is refused."""
    assert "baseline.jsonl:1" in refused(write_trial(tmp_path / "t", files={"baseline.jsonl": ["[1, 2]"]}))


@pytest.mark.parametrize("field", ["id", "slice", "expected", "predicted"])
def test_missing_field_names_the_field_file_and_line(tmp_path: Path, field: str) -> None:
    """Each of the four fields is required."""
    r = row("c")
    del r[field]
    msg = refused(write_trial(tmp_path / "t", files={"candidate-seed-1.jsonl": [row("a"), row("b", "nan", "nan"), r]}))
    assert "candidate-seed-1.jsonl:3" in msg and repr(field) in msg


def test_field_of_the_wrong_type(tmp_path: Path) -> None:
    """A numeric prediction is refused: labels are strings."""
    bad = {**row("a"), "predicted": 3}
    assert "field 'predicted' must be a string" in refused(write_trial(tmp_path / "t", files={"baseline.jsonl": [bad]}))


@pytest.mark.parametrize("slice_", ["test", "ood", "ood:", "OOD:x", "held-out"])
def test_unknown_slice_form(tmp_path: Path, slice_: str) -> None:
    """Only heldout, canary and ood:<name> are slices."""
    msg = refused(write_trial(tmp_path / "t", files={"baseline.jsonl": [row("a", slice_=slice_)]}))
    assert "baseline.jsonl:1" in msg and "unknown slice" in msg


def test_same_id_different_expected_across_files(tmp_path: Path) -> None:
    """An id that expects different labels in two files is refused naming both places."""
    d = write_trial(tmp_path / "t", files={"candidate-seed-2.jsonl": [row("a", "oom", "oom"), row("b", "nan", "nan")]})
    msg = refused(d)
    assert "'a'" in msg and "candidate-seed-2.jsonl:1" in msg and "baseline.jsonl:1" in msg


def test_same_id_different_slice_across_files(tmp_path: Path) -> None:
    """An id that is held-out in one file and a canary in another is refused."""
    d = write_trial(
        tmp_path / "t", files={"candidate-seed-2.jsonl": [row("a", slice_="canary"), row("b", "nan", "nan")]}
    )
    assert "slice" in refused(d)


def test_duplicate_id_within_a_file(tmp_path: Path) -> None:
    """One row per id per file: a second row for the same id is refused."""
    d = write_trial(
        tmp_path / "t", files={"candidate-seed-1.jsonl": [row("a"), row("b", "nan", "nan"), row("a", "ok", "nan")]}
    )
    msg = refused(d)
    assert "candidate-seed-1.jsonl:3" in msg and "already on line 1" in msg


def test_unreadable_file(tmp_path: Path) -> None:
    """A prediction file that cannot be read (here: not UTF-8) is refused naming it."""
    d = write_trial(tmp_path / "t")
    (d / "candidate-seed-2.jsonl").write_bytes(b'{"id": "a"}\n\xff\xfe\n')
    assert "candidate-seed-2.jsonl:2" in refused(d)


def test_baseline_that_is_a_directory(tmp_path: Path) -> None:
    """A baseline.jsonl that is a directory is not a prediction file: refused as missing."""
    d = write_trial(tmp_path / "t")
    (d / "baseline.jsonl").unlink()
    (d / "baseline.jsonl").mkdir()
    assert "no baseline.jsonl" in refused(d)


def test_missing_gate_json_and_missing_baseline(tmp_path: Path) -> None:
    """gate.json and baseline.jsonl are required."""
    d = write_trial(tmp_path / "t")
    (d / "gate.json").unlink()
    assert "no gate.json" in refused(d)
    d2 = write_trial(tmp_path / "u")
    (d2 / "baseline.jsonl").unlink()
    assert "no baseline.jsonl" in refused(d2)


def test_not_a_directory(tmp_path: Path) -> None:
    """A path that is not a directory is refused."""
    assert "not a directory" in refused(tmp_path / "nope")


def test_misspelt_prediction_file_is_refused(tmp_path: Path) -> None:
    """A stray .jsonl (e.g. a misspelt incumbent) must not silently switch a rule off."""
    d = write_trial(tmp_path / "t", files={"incumbant.jsonl": [row("a")]})
    assert "incumbant.jsonl" in refused(d)


def test_baseline_without_heldout_rows_is_refused(tmp_path: Path) -> None:
    """The gate compares on held-out: a baseline with none cannot be judged against."""
    d = write_trial(tmp_path / "t", files={"baseline.jsonl": [row("c", slice_="canary")]})
    assert "no held-out rows" in refused(d)


@pytest.mark.parametrize(
    ("gate", "needle"),
    [
        ("{", "gate.json:1"),
        ('{\n"metric": "accuracy",\n}', "gate.json:3"),
        ("[]", "JSON object"),
        ({}, '"metric"'),
        ({"metric": "f1"}, '"metric"'),
        ({"metric": "accuracy", "min_margin": -0.1}, "min_margin"),
        ({"metric": "accuracy", "min_margin": "0.1"}, "min_margin"),
        ({"metric": "accuracy", "min_marign": 0.1}, "unknown key"),
        ({"metric": "accuracy", "ood": {"x": {"floor": 1.5}}}, "floor"),
        ({"metric": "accuracy", "ood": {"x": {"blocking": False}}}, "floor"),
        ({"metric": "accuracy", "ood": {"x": {"floor": 0.5, "blocking": "no"}}}, "blocking"),
        ({"metric": "accuracy", "ood": ["x"]}, '"ood"'),
        ({"metric": "accuracy", "critical_labels": ["oom"]}, "go together"),
        ({"metric": "accuracy", "max_missed": 0.1}, "go together"),
        ({"metric": "accuracy", "critical_labels": [], "max_missed": 0.1}, "critical_labels"),
        ({"metric": "accuracy", "critical_labels": ["oom"], "max_missed": 2}, "max_missed"),
        ({"metric": "accuracy", "model": ""}, "'model'"),
    ],
)
def test_bad_gate_json(tmp_path: Path, gate: object, needle: str) -> None:
    """Each bad gate.json is refused with a message naming gate.json and the problem."""
    msg = refused(write_trial(tmp_path / "t", gate=gate))
    assert "gate.json" in msg and needle in msg


def test_gate_json_values_are_exact_decimals(tmp_path: Path) -> None:
    """0.1 in gate.json is 1/10 exactly, and optional fields are read."""
    from fractions import Fraction

    gate = {
        "metric": "macro_f1",
        "min_margin": 0.1,
        "ood": {"forum": {"floor": 0.85, "blocking": False}},
        "critical_labels": ["oom"],
        "max_missed": 0.02,
        "model": "triage",
        "task": "log triage",
        "baseline_name": "rules",
    }
    t = load_trial(write_trial(tmp_path / "t", gate=gate))
    cfg = t.trial.config
    assert cfg.min_margin == Fraction(1, 10) and cfg.max_missed == Fraction(1, 50)
    assert cfg.ood["forum"].floor == Fraction(85, 100) and cfg.ood["forum"].blocking is False
    assert (t.meta.model, t.meta.task, t.meta.baseline_name) == ("triage", "log triage", "rules")


def test_reordered_lines_give_the_same_decision_and_a_new_hash(tmp_path: Path) -> None:
    """Reversing every file's lines leaves the verdict unchanged; the hash identifies the bytes."""
    from app.policy.gate_rules import judge

    files = {
        "baseline.jsonl": [row("a"), row("b", "nan", "ok"), row("c", "oom", "ok"), row("o", "ok", "nan", "ood:x")],
        "candidate-seed-1.jsonl": [
            row("a"),
            row("b", "nan", "nan"),
            row("c", "oom", "ok"),
            row("o", "ok", "ok", "ood:x"),
        ],
        "candidate-seed-2.jsonl": [
            row("a", "ok", "nan"),
            row("b", "nan", "nan"),
            row("c", "oom", "oom"),
            row("o", "ok", "nan", "ood:x"),
        ],
    }
    gate = {
        "metric": "macro_f1",
        "ood": {"x": {"floor": 0.5, "blocking": False}},
        "critical_labels": ["oom"],
        "max_missed": 0.5,
    }
    first = load_trial(write_trial(tmp_path / "a", gate=gate, files=files))
    second = load_trial(write_trial(tmp_path / "b", gate=gate, files={k: v[::-1] for k, v in files.items()}))
    assert judge(first.trial).as_dict() == judge(second.trial).as_dict()
    assert first.trial_hash != second.trial_hash
