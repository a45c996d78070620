"""The operator's lifecycle verbs on one job's provisioning state: cancel and reopen (for resume).

Pure: decisions from the state, no I/O. The driver (`app.services.lifecycle`) applies them.

- `cancel_job`: the job ends where it stands. Its host is stopped whatever it held (a cancel
  never destroys: the operator may want the disk), nothing new is rented, and the state ends
  `failed` with a failure that names the cancel, so every later step of the job is a no-op
  (`decide` ignores a failed job).
- `reopen_job`: a cancelled or failed job provisions again from `queued`. What it learnt stays
  (machines excluded after failing it, checkpointed work, creates used: attempt numbers keep
  counting); what belonged to the ended run goes (its attempt, its failure, a recovery in flight,
  the offer-wait clock), so the resumed job is not taken for a recovery and hedged. The create cap
  counts from the reopening: a job that failed at its cap may rent again when the operator says so.
"""

from __future__ import annotations

from dataclasses import replace

from app.policy.provisioning import Action, GaveUp, JobState, Stop

__all__ = ["CANCELLED", "cancel_job", "is_cancelled", "reopen_job"]

CANCELLED = "cancelled"  # the Stop's reason and the failure's prefix


def cancel_job(job: JobState, *, reason: str) -> tuple[JobState, list[Action]]:
    """Cancel the job: stop its host (never destroy), end it; nothing is rented for it again."""
    acts: list[Action] = []
    att = job.attempt
    if att is not None:
        acts.append(Stop(job.job_id, att.instance_id, att.machine_id, CANCELLED, reason))
    ended = replace(job, phase="failed", attempt=None, failure=f"{CANCELLED}: {reason}")
    acts.append(GaveUp(job.job_id, ended.failure or CANCELLED))
    return ended, acts


def is_cancelled(job: JobState) -> bool:
    """Whether the state was ended by `cancel_job`."""
    return job.phase == "failed" and (job.failure or "").startswith(f"{CANCELLED}:")


def reopen_job(job: JobState) -> JobState:
    """The job queued again after a cancel or a failure, keeping what it learnt."""
    return replace(
        job,
        phase="queued",
        attempt=None,
        failure=None,
        failures_in_row=0,
        not_before=0.0,
        waiting_since=None,
        lost_at=None,
        lost_cause=None,
        lost_machine=None,
        progress_hedges=0,
        creates_before_reopen=job.creates,
    )
