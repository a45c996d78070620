"""Nothing fails silently: an error a worker meets on a job's behalf reaches that job.

Three outcomes, by what the error is (`classify`):

- operator-fixable (a missing or refused vendor key, a bad setting, no provider the job allows
  is usable): the job is `blocked` with the reason and the fix; `tuneharness resume JOB`
  continues it once the cause is fixed. Nothing redrives a blocked job behind the operator's back.
- internal (an exception no code expected): blocked the same way, the fix pointing at the
  worker's log, because redriving a bug only repeats it.
- transient (a vendor or broker or database that is down a while, a task's time limit): the job
  keeps its phase, a `task_error` ledger event says what happened, and the redrive sweep heals it.

Each blocked job gets a `job_blocked` ledger event and an alert; `tuneharness doctor` lists blocked
jobs. Messages are scrubbed (`app.logscrub`): an exception's text may quote a URL with a key in it.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.errors import UserError
from app.logscrub import scrub
from app.market import AuthFailed
from app.settings_catalogue import secret_names

if TYPE_CHECKING:
    from app.alerts import Notifier
    from app.jobs import JobStore
    from app.ledger import Ledger

__all__ = [
    "ErrorClass",
    "JobBlocked",
    "ProvidersUnusable",
    "block_job",
    "classify",
    "clean",
    "record_task_error",
]


class ErrorClass(enum.Enum):
    OPERATOR = "operator"  # the operator must fix something: the job is blocked
    INTERNAL = "internal"  # a bug: the job is blocked, the worker's log has the traceback
    TRANSIENT = "transient"  # waits itself out: the job keeps its phase, redrive heals it


class JobBlocked(UserError):
    """The job cannot go on until the operator fixes `reason` (the way: `fix`)."""

    def __init__(self, reason: str, fix: str) -> None:
        self.reason = reason
        self.fix = fix
        super().__init__(f"{reason}. Fix: {fix}")


class ProvidersUnusable(JobBlocked):
    """No marketplace the job allows can be used (each one's key missing or refused)."""

    def __init__(self, problems: dict[str, str]) -> None:
        self.problems = dict(problems)
        listed = "; ".join(f"{name}: {why}" for name, why in problems.items())
        super().__init__(
            f"none of the job's providers can be used ({listed})",
            "set the missing key or replace the refused one (see `tuneharness doctor`), "
            "or allow another provider in the job file; then `tuneharness resume JOB`",
        )


def clean(text: str, *, limit: int = 400) -> str:
    """`text` on one line, secrets redacted, at most `limit` characters."""
    secrets = [v for n in secret_names() if len(v := os.environ.get(n, "")) >= 8]
    one = " ".join(scrub(text, secrets=secrets).split())
    return one if len(one) <= limit else one[: limit - 3] + "..."


def classify(exc: BaseException, *, transient: tuple[type[BaseException], ...] = ()) -> ErrorClass:
    """What a job's error means for the job (see the module's docstring). `transient`: the error
    types the caller knows wait themselves out (its broker's, its database's, its time limit)."""
    if isinstance(exc, UserError | AuthFailed):
        return ErrorClass.OPERATOR
    if isinstance(exc, transient):
        return ErrorClass.TRANSIENT
    return ErrorClass.INTERNAL


@dataclass(frozen=True, slots=True)
class Blocked:
    reason: str
    fix: str

    @property
    def detail(self) -> str:
        return f"blocked: {self.reason}. Fix: {self.fix}"


def _blocked_for(exc: BaseException, *, task: str, job_id: str) -> Blocked:
    resume = f"`tuneharness resume {job_id}`"
    if isinstance(exc, JobBlocked):
        return Blocked(clean(exc.reason), clean(exc.fix.replace("`tuneharness resume JOB`", resume)))
    if isinstance(exc, UserError | AuthFailed):
        text = clean(str(exc))
        reason, _, fix = text.partition(". Fix: ")
        return Blocked(reason.rstrip("."), (fix.rstrip(".") or "fix what the reason says") + f"; then {resume}")
    return Blocked(
        clean(f"{task} raised {type(exc).__name__}: {exc}"),
        f"see the worker's log for the traceback; then {resume} tries again",
    )


def block_job(
    job_id: str,
    exc: BaseException,
    *,
    task: str,
    jobs: JobStore,
    ledger: Ledger,
    notifier: Notifier,
) -> tuple[str, ...]:
    """Mark the job (and a gated job's parent) blocked, write `job_blocked` and alert once per
    job and reason. Return the ids that moved (empty: the job had ended or was blocked already)."""
    from app.alerts import Alert
    from app.ledger import Event

    rec = jobs.get(job_id)
    if rec is None or rec.phase in ("done", "failed", "cancelled"):
        # the job ended meanwhile (a cancel, a failure decided elsewhere): written down, nothing to block
        record_task_error(job_id, exc, task=task, ledger=ledger, transient=False)
        return ()
    why = _blocked_for(exc, task=task, job_id=job_id)
    moved = jobs.block(job_id, detail=why.detail)
    ledger.append(
        Event(
            kind="job_blocked",
            job=job_id,
            reason=why.reason,
            payload={"task": task, "error": type(exc).__name__, "fix": why.fix, "moved": list(moved)},
            idempotency_key=f"{job_id}:blocked:{task}:{why.reason}",
        )
    )
    notifier.notify(
        Alert(
            "job_blocked",
            f"{why.reason}. Fix: {why.fix}",
            job=job_id,
            details={"task": task},
            key=f"job_blocked:{job_id}:{why.reason}",
        )
    )
    return moved


def record_task_error(job_id: str, exc: BaseException, *, task: str, ledger: Ledger, transient: bool = True) -> None:
    """An error on the job's behalf that changes no phase (a transient one: redrive heals it; or one
    met after the job ended), written down on the job."""
    from app.ledger import Event

    ledger.append(
        Event(
            kind="task_error",
            job=job_id,
            reason=clean(f"{task} raised {type(exc).__name__}: {exc}"),
            payload={"task": task, "error": type(exc).__name__, "transient": transient},
        )
    )
