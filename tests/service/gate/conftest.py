"""Trial directories for the gate's service tests."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

HELDOUT = [("h1", "oom"), ("h2", "nan"), ("h3", "ok"), ("h4", "ok")]
CANARY = [("c1", "oom")]
OOD = [("o1", "ok"), ("o2", "nan")]


def lines(rows: list[tuple[str, str, str, str]]) -> str:
    return "".join(json.dumps({"id": i, "slice": s, "expected": e, "predicted": p}) + "\n" for i, s, e, p in rows)


def predictions(wrong: set[str] = frozenset()) -> list[tuple[str, str, str, str]]:  # type: ignore[assignment]
    """Every example, predicted right except the ids in `wrong` (predicted 'x')."""
    out = []
    for slice_, items in (("heldout", HELDOUT), ("canary", CANARY), ("ood:forum", OOD)):
        for i, e in items:
            out.append((i, slice_, e, "x" if i in wrong else e))
    return out


MakeTrial = Callable[..., Path]


@pytest.fixture
def make_trial(tmp_path: Path) -> MakeTrial:
    """make_trial(name, seeds={"1": wrong_ids, ...}, baseline_wrong=..., incumbent_wrong=None, gate={...})."""

    def _make(
        name: str = "trial",
        *,
        seeds: dict[str, set[str]] | None = None,
        baseline_wrong: set[str] = frozenset({"h1", "h2"}),  # type: ignore[assignment]
        incumbent_wrong: set[str] | None = None,
        gate: dict[str, object] | None = None,
    ) -> Path:
        d = tmp_path / name
        d.mkdir()
        cfg = gate or {
            "metric": "accuracy",
            "ood": {"forum": {"floor": 0.5}},
            "model": "triage",
            "task": "train.log triage",
            "baseline_name": "rules",
            "min_canaries": 1,
        }
        (d / "gate.json").write_text(json.dumps(cfg))
        (d / "baseline.jsonl").write_text(lines(predictions(baseline_wrong)))
        if incumbent_wrong is not None:
            (d / "incumbent.jsonl").write_text(lines(predictions(incumbent_wrong)))
        for seed, wrong in (seeds if seeds is not None else {"1": set(), "2": {"h3"}}).items():
            (d / f"candidate-seed-{seed}.jsonl").write_text(lines(predictions(wrong)))
        return d

    return _make
