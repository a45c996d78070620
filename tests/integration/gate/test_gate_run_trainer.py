"""`tuneharness gate run` evaluates real adapters through the trainer's own model-loading code."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.slow


def _env(home: Path) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("TUNEHARNESS_")}
    e.update(TUNEHARNESS_HOME=str(home), PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return e


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny causal LM and one trained LoRA adapter (copied as the second seed's, to keep this fast)."""
    root = tmp_path_factory.mktemp("gate-trainer")
    env = _env(root / "home")
    tiny = root / "tiny"
    subprocess.run(
        [sys.executable, "-m", "trainer", "make-tiny-model", str(tiny)],
        env=env,
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=300,
    )
    job = root / "job"
    subprocess.run(
        [sys.executable, "-c", (
            "import sys; from pathlib import Path; from trainer.testing import write_causal_job; "
            "write_causal_job(Path(sys.argv[1]), base_model=Path(sys.argv[2]), max_steps=2, checkpoint_every=2)"
        ), str(job), str(tiny)],
        env=env, cwd=REPO, check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "trainer", "run", "--job-dir", str(job)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    second = root / "adapter-seed-2"
    shutil.copytree(job / "adapter", second)
    return {"base": tiny, "1": job / "adapter", "2": second}


@pytest.mark.long
def test_gate_run_with_trainer_adapters_writes_and_judges_a_trial(adapters: dict[str, Path], tmp_path: Path) -> None:
    """Both seeds are predicted by `python -m trainer predict`; the trial is complete and judged."""
    rows = [
        {"id": "h1", "slice": "heldout", "prompt": "red cat ->", "expected": " cat red"},
        {"id": "h2", "slice": "heldout", "prompt": "blue dog ->", "expected": " dog blue"},
        {"id": "c1", "slice": "canary", "prompt": "alpha beta ->", "expected": " beta alpha"},
        {"id": "o1", "slice": "ood:chat", "prompt": "omega gamma delta ->", "expected": " delta gamma omega"},
    ]
    ev = tmp_path / "eval.jsonl"
    ev.write_text("".join(json.dumps(r) + "\n" for r in rows))
    baseline = tmp_path / "baseline.py"
    baseline.write_text(
        "import json, sys\n"
        "for line in sys.stdin:\n"
        "    r = json.loads(line)\n"
        "    words = r['prompt'].replace(' ->', '').split()\n"
        "    print(json.dumps({'id': r['id'], 'predicted': ' ' + ' '.join(reversed(words))}))\n"
    )
    cfg = tmp_path / "gate.json"
    cfg.write_text(
        json.dumps(
            {
                "metric": "accuracy",
                "model": "reverser",
                "task": "reverse words",
                "baseline_name": "rules",
                "min_canaries": 1,
            }
        )
    )
    out = tmp_path / "trial"
    p = subprocess.run(
        [sys.executable, "-m", "app.cli.main", "gate", "run", "--out", str(out), "--config", str(cfg),
         "--eval", str(ev), "--base-model", str(adapters["base"]),
         "--baseline", f"command:{sys.executable} {baseline}",
         "--candidate", f"1=adapter:{adapters['1']}", "--candidate", f"2=adapter:{adapters['2']}", "--json"],
        env=_env(tmp_path / "home"), cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    # A two-step tiny random model cannot beat a perfect rule: refused, and only for that.
    assert p.returncode == 1, p.stderr[-2000:]
    result = json.loads(p.stdout)
    assert [r["code"] for r in result["reasons"]] == ["not_above_baseline", "canary_failed"]
    assert result["scores"]["baseline"]["heldout"] == 1.0
    for seed in ("1", "2"):
        lines = [json.loads(x) for x in (out / f"candidate-seed-{seed}.jsonl").read_text().splitlines()]
        assert sorted(r["id"] for r in lines) == ["c1", "h1", "h2", "o1"]
        assert all(isinstance(r["predicted"], str) for r in lines)
    # The trainer is deterministic: both copies of the same adapter predict the same strings.
    assert (out / "candidate-seed-1.jsonl").read_text() == (out / "candidate-seed-2.jsonl").read_text()
    assert json.loads((out / "decision.json").read_text())["decision"] == "refuse"
