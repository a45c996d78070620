"""tuneharness from Python: submit a job and look it up, as `tuneharness submit` / `jobs` do.

    from app.api import submit, get_job
    job_id = submit("examples/job.yaml")      # a path, or a JobSpec from app.jobs.load_job_file
    print(get_job(job_id).phase)

Submitting only enqueues: the job is written down (with its budget cap, if it has one), a ledger
event records it, and the provision queue gets its id. The fleet (Celery workers) does the rest.
The broker must be reachable; when it is not, nothing is written and `ServiceUnavailable` says so.
"""

from __future__ import annotations

from pathlib import Path

from app.jobs import JobRecord, JobSpec, load_job_file

__all__ = ["get_job", "list_jobs", "submit"]


def submit(spec: JobSpec | str | Path) -> str:
    """Validate (when given a path), record and enqueue a job; return its id."""
    from app import bootstrap
    from app.ledger import Event

    if not isinstance(spec, JobSpec):
        spec = load_job_file(spec)
    bootstrap.require_broker()
    job_id = bootstrap.jobs().add(spec)
    if spec.budget_usd is not None:
        bootstrap.budget().set_cap(job_id, spec.budget_usd, reason=f"job file {spec.source}")
    bootstrap.ledger().append(Event(
        kind="job_submitted", job=job_id, reason="submit",
        payload={"name": spec.name, "source": spec.source, "budget_usd": spec.budget_usd,
                 "gpu": list(spec.needs.gpu), "providers": list(spec.needs.providers)},
        idempotency_key=f"{job_id}:submitted",
    ))
    bootstrap.enqueue_job(job_id)
    return job_id


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
