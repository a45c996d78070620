"""`train_and_judge` end to end with a real (one-step) training run: the shipped specialist is the
incumbent of the trial, a candidate the gate refuses is never installed, and `--reuse` refuses
adapters trained on other data or settings.

The trial scores every fifth row of each slice (real rows included, every slice kept): the whole
held-out, scored three times on MiniLM, would take minutes and test nothing a fifth of it does not."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from app.triage import training
from app.triage.specialist import DEFAULT_ADAPTER_DIR, minilm_base_dir, promoted

_ALL_EVAL_ROWS = training.eval_rows


def _every_fifth_of_each_slice(corpus: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    by_slice: dict[str, list[dict[str, Any]]] = {}
    for row in _ALL_EVAL_ROWS(corpus):
        by_slice.setdefault(training.slice_of(row), []).append(row)
    return [row for rows in by_slice.values() for row in rows[::5]]


@pytest.mark.slow
@pytest.mark.long
def test_a_weak_candidate_is_judged_against_the_shipped_incumbent_and_not_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if minilm_base_dir() is None or not promoted(DEFAULT_ADAPTER_DIR.parent):
        pytest.skip("needs the MiniLM package and the promoted shipped specialist")
    ship = tmp_path / "ship"
    monkeypatch.setattr(training, "SHIP_DIR", ship)  # never touch the package's own adapter
    monkeypatch.setattr(training, "TRIAL_DIR", tmp_path / "trial-ship")  # nor the committed trial
    monkeypatch.setattr(training, "eval_rows", _every_fifth_of_each_slice)
    plan = training.TrainingPlan(
        out_dir=tmp_path / "out", max_steps=1, max_seq_len=16, quantization="none", learning_rate=1e-4
    )
    lines: list[str] = []
    summary = training.train_and_judge(plan, install=True, echo=lines.append)

    trial = tmp_path / "out" / "trial"
    assert (trial / "incumbent.jsonl").is_file()
    assert summary["incumbent"]["heldout"] > summary["baseline"]["heldout"]
    assert summary["decision"] == "refuse"
    codes = {r["code"] for r in summary["reasons"]}
    assert "below_incumbent" in codes
    assert "installed" not in summary and not ship.exists() and not (tmp_path / "trial-ship").exists()
    assert any(line.startswith("not installed: the gate said refuse") for line in lines)
    decision = json.loads((trial / "decision.json").read_text())
    assert decision["scores"]["incumbent"] is not None

    # --reuse keeps those adapters only for the same rows and job: other data is refused at once.
    with pytest.raises(training.TrainingFailed, match=r"--reuse: .*other training rows.*Fix: drop --reuse"):
        training.train_and_judge(replace(plan, reuse=True, real_dev_weight=1), echo=lines.append)
    with pytest.raises(training.TrainingFailed, match=r"other job settings"):
        training.train_and_judge(replace(plan, reuse=True, learning_rate=3e-3), echo=lines.append)
