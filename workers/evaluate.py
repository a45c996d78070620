"""Celery shell of the evaluate stage: `evaluate_job`, once per gated job.

Thin and idempotent: it takes the job's id and calls `gate.jobs.JobEvaluator.evaluate`, which
builds the trial from the seed adapters, judges it and sets the job `done` (promoted/refused).
The supervisor enqueues it when the last seed run's adapter is pulled; a redelivered or duplicated
task finds the job done (or the trial written) and records nothing new. It runs on the control
plane's CPU (tiny models); the evaluate queue's limits are 1800 s soft, 1900 s hard.
"""

from __future__ import annotations

from typing import Any

from celery.exceptions import SoftTimeLimitExceeded

from app import bootstrap
from app.ledger import Event
from workers.tasks import task

__all__ = ["evaluate_job"]


@task("evaluate", "evaluate_job")
def evaluate_job(self: Any, job_id: str) -> dict[str, Any]:
    """Evaluate a gated job's seed adapters on its eval sets and let the deploy gate decide."""
    try:
        return bootstrap.job_evaluator().evaluate(job_id).as_dict()
    except SoftTimeLimitExceeded:
        # a retry would run past the limit again: the job fails, the operator reads why
        why = "evaluation ran past the evaluate queue's 1800 s limit"
        bootstrap.ledger().append(
            Event(kind="evaluation_failed", job=job_id, reason=why, idempotency_key=f"{job_id}:evaluation_failed")
        )
        bootstrap.jobs().set_phase(job_id, "failed", detail=f"{why}. Fix: fewer eval rows or a smaller gate.timeout_s")
        return {"job": job_id, "result": "failed", "detail": why}
