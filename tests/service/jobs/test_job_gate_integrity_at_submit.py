"""The gate's integrity checks run at submit, not after hours of training: too few canaries and eval
rows also found in the training data are refused with the field, the line and the rows named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.jobs import JobFileError, load_job_file
from tests.support.jobfiles import train_section

HEAD = "name: gated\n" + train_section("none") + "needs:\n  gpu: [RTX 3090]\nbudget_usd: 3.0\n"
GATE = "gate:\n  config: gate.json\n  eval: eval.jsonl\n  baseline: predictions:baseline.jsonl\n"


def _rows(heldout: int, canaries: int, *, prompt: str = "held out {i}") -> str:
    rows = [{"id": f"h{i}", "slice": "heldout", "prompt": prompt.format(i=i), "expected": "y"} for i in range(heldout)]
    rows += [{"id": f"c{i}", "slice": "canary", "prompt": f"canary {i}", "expected": "z"} for i in range(canaries)]
    return "".join(json.dumps(r) + "\n" for r in rows)


@pytest.fixture
def jobdir(tmp_path: Path) -> Path:
    (tmp_path / "model").mkdir()
    (tmp_path / "train.jsonl").write_text(
        '{"prompt": "train one", "completion": "b"}\n'
        '{"messages": [{"role": "user", "content": "asked   in a chat"}, {"role": "assistant", "content": "x"}]}\n'
    )
    (tmp_path / "gate.json").write_text(json.dumps({"metric": "accuracy"}))
    (tmp_path / "eval.jsonl").write_text(_rows(3, 10))
    (tmp_path / "baseline.jsonl").write_text('{"id": "h0", "predicted": "y"}\n')
    (tmp_path / "job.yaml").write_text(HEAD + GATE)
    return tmp_path


def _refusal(jobdir: Path) -> JobFileError:
    with pytest.raises(JobFileError) as info:
        load_job_file(jobdir / "job.yaml")
    return info.value


def test_ten_distinct_canaries_pass_by_default(jobdir: Path) -> None:
    assert load_job_file(jobdir / "job.yaml").gate is not None


def test_nine_canaries_are_refused_naming_the_count_and_the_way_out(jobdir: Path) -> None:
    (jobdir / "eval.jsonl").write_text(_rows(3, 9))
    err = _refusal(jobdir)
    assert err.field == "gate.eval" and err.line == 19
    assert "9 canary row(s); the gate needs at least 10" in err.problem and "min_canaries" in str(err)


def test_a_canary_id_repeated_counts_once(jobdir: Path) -> None:
    (jobdir / "eval.jsonl").write_text(
        _rows(1, 9) + '{"id": "c0", "slice": "canary", "prompt": "again", "expected": "z"}\n'
    )
    assert "9 canary row(s)" in _refusal(jobdir).problem


def test_min_canaries_lowered_on_purpose_in_gate_json_or_inline(jobdir: Path) -> None:
    (jobdir / "eval.jsonl").write_text(_rows(3, 2))
    (jobdir / "gate.json").write_text(json.dumps({"metric": "accuracy", "min_canaries": 2}))
    assert load_job_file(jobdir / "job.yaml").gate is not None
    (jobdir / "job.yaml").write_text(
        HEAD + GATE.replace("config: gate.json", "config: {metric: accuracy, min_canaries: 3}")
    )
    assert "2 canary row(s); the gate needs at least 3" in _refusal(jobdir).problem


@pytest.mark.parametrize("value", [-1, 1.5, ".nan", "ten"])
def test_a_min_canaries_that_is_not_a_whole_number_is_refused(jobdir: Path, value: object) -> None:
    inline = GATE.replace("config: gate.json", f"config: {{metric: accuracy, min_canaries: {value}}}")
    (jobdir / "job.yaml").write_text(HEAD + inline)
    assert _refusal(jobdir).field == "gate.config.min_canaries"


def test_eval_rows_found_in_the_training_data_are_refused_by_content_naming_rows_and_lines(jobdir: Path) -> None:
    """Spacing does not hide a copy; a chat message's user turn counts as a training input."""
    (jobdir / "eval.jsonl").write_text(
        _rows(2, 10) + '{"id": "leak1", "slice": "heldout", "prompt": "train  one", "expected": "b"}\n'
        '{"id": "leak2", "slice": "ood:chat", "prompt": "asked in a chat", "expected": "x"}\n'
    )
    err = _refusal(jobdir)
    assert err.field == "gate.eval" and "2 eval row(s) also appear in the training data" in err.problem
    assert f"leak1 (= {jobdir / 'train.jsonl'}:1)" in err.problem and "leak2 (=" in err.problem
    assert "train.jsonl:2" in err.problem and "remove them from the eval set" in str(err)


def test_check_false_skips_the_file_checks(jobdir: Path) -> None:
    """A stored job (already checked at submit) is re-read without opening its files."""
    from app.jobs import parse_job_text

    (jobdir / "eval.jsonl").write_text(_rows(1, 0))
    spec = parse_job_text(HEAD + GATE, source="job.yaml", base_dir=jobdir, check_files=False)
    assert spec.gate is not None
