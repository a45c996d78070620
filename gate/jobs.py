"""The evaluate stage of a job: its seed adapters -> a trial directory -> the gate's decision.

`JobEvaluator.evaluate(job_id)` is what `tuneharness.evaluate.evaluate_job` calls once the last
seed run's adapter is in the ArtifactStore (the job is `evaluating`). It:

1. fetches each seed run's adapter (`jobs/<job>-seed-<N>/adapter`, verified against its manifest);
2. writes the effective gate.json (the job file's, with `model` defaulting to the job's name);
3. builds the trial with `gate.evaluate.build_trial` under `<work>/trials/<job>`: every candidate
   through `python -m trainer predict` on the job's base model (the trainer's own loading code,
   as a program), the baseline and incumbent as the job file says (commands run in the job file's
   directory); an eval row whose input is also in the job's `train_file` fails the evaluation;
4. judges it through `GateService` (`gate_decision` ledger event; `gate_refused` alert on refusal),
   writes `decision.json`, records the trial and decision on the job (`job_evaluations`, and a
   `job_evaluated` ledger event with the job's id), and sets the job `done` with detail
   `promoted ...` or `refused: <codes> ...`.

Idempotent: a job already `done` with a recorded evaluation returns that; a trial directory that
exists (written atomically, so complete) is judged again rather than rebuilt, which records nothing
new in the ledger (same hash). A job whose evaluation cannot run (a predictor fails, an adapter is
missing or corrupt, a malformed eval file) is `failed` with the reason, and an `evaluation_failed`
ledger event; a retry cannot help those.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.artifacts import ArtifactError, ArtifactStore, fetch_dir
from app.errors import UserError
from app.jobs import JobEvaluation, JobStore, seed_run_id, spec_from_dict
from app.ledger import Event, Ledger
from gate.evaluate import build_trial
from gate.service import GateService, Judgement

__all__ = ["EvaluationOutcome", "JobEvaluator"]

EVALUATE_SOFT_LIMIT_S = 1800.0  # the evaluate queue's soft limit (workers/config.py)


@dataclass(frozen=True, slots=True)
class EvaluationOutcome:
    """What one call did: `promote`/`refuse` (judged), `failed`, or `skipped` (nothing to do now)."""

    job_id: str
    result: str
    detail: str
    trial_path: str | None = None
    recorded_now: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "job": self.job_id,
            "result": self.result,
            "detail": self.detail,
            "trial": self.trial_path,
            "recorded_now": self.recorded_now,
        }


class JobEvaluator:
    def __init__(
        self,
        *,
        jobs: JobStore,
        store: ArtifactStore,
        gate: GateService,
        ledger: Ledger,
        work_dir: Path,
        python: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.jobs = jobs
        self.store = store
        self.gate = gate
        self.ledger = ledger
        self.work_dir = work_dir
        self.python = python
        self.clock = clock

    def trial_dir(self, job_id: str) -> Path:
        return self.work_dir / "trials" / job_id

    def evaluate(self, job_id: str) -> EvaluationOutcome:
        rec = self.jobs.get(job_id)
        if rec is None:
            return EvaluationOutcome(job_id, "skipped", "no such job")
        done = self.jobs.evaluation(job_id)
        if rec.phase == "done" and done is not None:
            return EvaluationOutcome(job_id, done.decision, "already evaluated", done.trial_path)
        if rec.phase != "evaluating":
            return EvaluationOutcome(job_id, "skipped", f"job is {rec.phase}, not evaluating")
        spec = spec_from_dict(rec.spec)
        if spec.gate is None:
            return EvaluationOutcome(job_id, "skipped", "job has no gate")
        try:
            trial = self._trial(job_id, spec.name, spec.base_dir, spec.train, spec.gate, spec.seeds)
            judgement = self.gate.judge(trial)
        except (UserError, ArtifactError) as exc:
            return self._failed(job_id, str(exc))
        judgement.write_decision()
        return self._record(job_id, judgement)

    # -- steps ---------------------------------------------------------------------------------
    def _trial(
        self,
        job_id: str,
        name: str,
        base_dir: str,
        train: Mapping[str, Any],
        gate: Mapping[str, Any],
        seeds: tuple[int, ...],
    ) -> Path:
        out = self.trial_dir(job_id)
        if out.is_dir() and (out / "gate.json").is_file():
            return out  # written atomically: complete; judge it again
        work = self.work_dir / "evaluate" / job_id
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        candidates = []
        for seed in seeds:
            run = seed_run_id(job_id, seed)
            adapter = fetch_dir(self.store, f"jobs/{run}/adapter", work / f"adapter-seed-{seed}")
            predict = train.get("predict") if train.get("kind") == "command" else None  # the user's own predictor
            if isinstance(predict, str):
                candidates.append(f"{seed}=command:{predict.replace('{adapter}', str(adapter))}")
            else:
                candidates.append(f"{seed}=adapter:{adapter}")
        config = gate["config"]
        if isinstance(config, Mapping):
            cfg = dict(config)
        else:
            try:
                cfg = json.loads(Path(str(config)).read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise UserError(
                    f"gate config {config}: cannot be read ({exc}). Fix: check the job file's gate.config"
                ) from None
            if not isinstance(cfg, dict):
                raise UserError(f"gate config {config}: not a JSON object. Fix: write gate.json as an object")
        cfg.setdefault("model", name)
        config_path = work / "gate.json"
        config_path.write_text(json.dumps(cfg, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        base = Path(base_dir)
        bm = Path(str(train.get("base_model") or "base_model"))
        base_model = bm if bm.is_absolute() else base / bm
        n_predictors = len(seeds) + 1 + (1 if gate.get("incumbent") else 0)
        # every predictor together must finish inside the evaluate queue's soft limit
        timeout_s = min(float(gate.get("timeout_s", 400.0)), (EVALUATE_SOFT_LIMIT_S - 60.0) / n_predictors)
        kwargs: dict[str, Any] = {"python": self.python} if self.python else {}
        tf = Path(str(train.get("train_file") or ""))  # a command job may name none
        train_file = tf if tf.is_absolute() else base / tf
        build_trial(
            out,
            config_path=config_path,
            eval_paths=[Path(str(p)) for p in gate["eval"]],
            baseline=str(gate["baseline"]),
            candidates=candidates,
            incumbent=str(gate["incumbent"]) if gate.get("incumbent") else None,
            base_model=base_model,
            timeout_s=timeout_s,
            cwd=base,
            train_paths=[train_file] if train.get("train_file") else [],
            **kwargs,
        )
        shutil.rmtree(work, ignore_errors=True)
        return out

    def _record(self, job_id: str, judgement: Judgement) -> EvaluationOutcome:
        verdict, loaded = judgement.verdict, judgement.loaded
        codes = tuple(r.code for r in verdict.reasons)
        self.jobs.record_evaluation(
            JobEvaluation(job_id, str(loaded.path), loaded.trial_hash, verdict.decision, codes, self.clock())
        )
        self.ledger.append(
            Event(
                kind="job_evaluated",
                job=job_id,
                reason=verdict.decision + (": " + ", ".join(codes) if codes else ""),
                payload={
                    "decision": verdict.decision,
                    "trial_path": str(loaded.path),
                    "trial_hash": loaded.trial_hash,
                    "model": loaded.meta.model,
                    "reasons": list(codes),
                    "gate_seq": judgement.ledger_seq,
                },
                idempotency_key=f"{job_id}:evaluated:{loaded.trial_hash}",
            )
        )
        word = "promoted" if verdict.promoted else "refused: " + ", ".join(codes)
        detail = f"{word}; trial {loaded.path}"
        self.jobs.set_phase(job_id, "done", detail=detail)
        return EvaluationOutcome(job_id, verdict.decision, detail, str(loaded.path), judgement.recorded_now)

    def _failed(self, job_id: str, why: str) -> EvaluationOutcome:
        self.ledger.append(
            Event(kind="evaluation_failed", job=job_id, reason=why[:500], idempotency_key=f"{job_id}:evaluation_failed")
        )
        self.jobs.set_phase(job_id, "failed", detail=f"evaluation failed: {why[:300]}")
        return EvaluationOutcome(job_id, "failed", why)
