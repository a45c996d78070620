"""tuneharness from Python: submit a job and look it up, as `tuneharness submit` / `jobs` do.

    from app.api import submit, get_job
    job_id = submit("examples/job.yaml")      # a path, or a JobSpec from app.jobs.load_job_file
    print(get_job(job_id).phase)

Submitting only enqueues: the job is written down (with its budget cap, if it has one), a ledger
event records it, and the provision queue gets its id. A job with a gate is written down with one
training run per seed (`<job>-seed-<N>`, each with budget_usd / seeds as its cap); the runs go
on the provision queue, and the job itself waits for their adapters to be judged. The fleet
(Celery workers) does the rest.
The broker must be reachable; when it is not, nothing is written and `ServiceUnavailable` says so.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from app.jobs import JobRecord, JobSpec, JobStore, load_job_file, seed_run_id

__all__ = ["get_job", "list_jobs", "submit"]

_log = logging.getLogger("tuneharness.api")


def submit(spec: JobSpec | str | Path, *, warn: Callable[[str], None] | None = None) -> str:
    """Validate (when given a path), record and enqueue a job; return its id.

    A provider the job allows that cannot be used here (its key is not set) is skipped with a
    warning (`warn`, else the log) while another remains; with none left the job is refused
    (`UserError`) and nothing is written.
    """
    from app import bootstrap
    from app.ledger import Event
    from app.vendorcheck import unusable

    if not isinstance(spec, JobSpec):
        spec = load_job_file(spec)
    skipped = unusable(spec.needs.providers, bootstrap.market)
    if skipped and len(skipped) == len(spec.needs.providers):
        from app.errors import UserError

        listed = "; ".join(f"{name}: {u.problem}" for name, u in skipped.items())
        fixes = " or ".join(u.fix for u in skipped.values())
        raise UserError(f"none of the job's providers can be used here ({listed}). Fix: {fixes}")
    bootstrap.require_broker()
    for name, u in skipped.items():
        (warn or _log.warning)(f"{name} skipped ({u.problem}); the job runs on the others. To use it: {u.fix}")
    store = bootstrap.jobs()
    job_id = store.add(spec)
    # A gated job trains one adapter per seed: one run per seed, each provisioned and supervised
    # on its own, with its share of the budget (their caps together are the job's budget).
    runs = [(seed_run_id(job_id, seed), spec.seed_run(seed, parent=job_id)) for seed in spec.seeds]
    for run_id, run_spec in runs:
        store.add(run_spec, job_id=run_id)
    for jid, s in runs or [(job_id, spec)]:
        if s.budget_usd is not None:
            bootstrap.budget().set_cap(
                jid, s.budget_usd, reason=f"job file {spec.source}" + (f" (seed run of {job_id})" if s.parent else "")
            )
    bootstrap.ledger().append(
        Event(
            kind="job_submitted",
            job=job_id,
            reason="submit",
            payload={
                "name": spec.name,
                "source": spec.source,
                "budget_usd": spec.budget_usd,
                "gpu": list(spec.needs.gpu),
                "providers": list(spec.needs.providers),
                "skipped_providers": {name: u.problem for name, u in skipped.items()},
                "runs": [r for r, _ in runs],
                "seeds": list(spec.seeds),
            },
            idempotency_key=f"{job_id}:submitted",
        )
    )
    if not runs:
        _enqueue_or_fail(store, [job_id])
        return job_id
    store.set_phase(job_id, "training", detail="one run per seed: " + ", ".join(r for r, _ in runs))
    _enqueue_or_fail(store, [r for r, _ in runs], parent=job_id)
    return job_id


def _enqueue_or_fail(store: JobStore, ids: list[str], *, parent: str | None = None) -> None:
    """Send each job's `provision`; if the broker refuses, every job not sent is marked failed (not
    left `queued` for ever, not started later behind the user's back) and the error is raised."""
    from app import bootstrap
    from app.errors import ServiceUnavailable

    for n, jid in enumerate(ids):
        try:
            bootstrap.enqueue_job(jid)
        except Exception as exc:
            why = f"not enqueued: the broker refused it ({type(exc).__name__}). Fix: start the broker, then resubmit"
            for left in ids[n:]:
                store.set_phase(left, "failed", detail=why)
            if parent is not None:
                store.set_phase(parent, "failed", detail=why)
            raise ServiceUnavailable(why) from exc


def get_job(job_id: str) -> JobRecord:
    """The job as recorded now; `UserError` if there is no such job."""
    from app import bootstrap
    from app.errors import UserError

    rec = bootstrap.jobs().get(job_id)
    if rec is None:
        raise UserError(f"no job {job_id!r}. Fix: pick an id from `tuneharness jobs`")
    return rec


def list_jobs() -> list[JobRecord]:
    from app import bootstrap

    return bootstrap.jobs().list()
