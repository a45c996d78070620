"""The training supervisor's judgements: pure, stdlib only, no clock reads.

The real-time driver (`app.services.supervisor`) probes the job's host (status.json, the trainer's
process, the tail of train.log, the provider's view) and asks this module what the probe means;
lost hosts and hangs then go through the provisioning state machine
(`app.policy.provisioning.decide` with `TrainerStatus`), which stops the host, records the failure
and re-queues the job for a replacement.

    assess(probe, ...)        -> Verdict: training | slice_done | finished | dead | ssh_down | lost
    route_triage(state, ...)  -> same_host | replace | stop
    stop_job(job, ...)        -> the job given up: stop its host, tell the operator
    recovery_summary(...)     -> median and 90th percentile of recovery times

Our own stops are not losses. A host that the budget monitor, the reaper, the idle watchdog, the
reconciler or the operator stopped is `StoppedByUs(reason)`; `judge_our_stop` pauses the job
(nothing quarantined, nothing rented, no `host_lost`) until that reason is gone, then resumes it
on the same host (`Resume`). `at_cap` says which of a job's hosts the budget monitor pauses rather
than ends; `settling` keeps a resumed host out of the loss and stall judgements while it restarts
and catches up with the work it had done.

    judge_our_stop(stop, facts, now=...) -> Paused | Resume
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import IntEnum, StrEnum
from typing import Literal

from app.policy.provisioning import Action, GaveUp, JobState, Record, Stop

__all__ = [
    "MAX_OOM_HALVINGS",
    "CapMove",
    "FactsVerdict",
    "HostProbe",
    "Paused",
    "Remedy",
    "Resume",
    "ResumeFacts",
    "Route",
    "StopReason",
    "StoppedByUs",
    "SupervisorConfig",
    "TrainerExit",
    "Verdict",
    "assess",
    "at_cap",
    "budget_guard_due",
    "halve_micro_batch",
    "judge_our_stop",
    "percentile",
    "read_with_facts",
    "recovery_summary",
    "route_triage",
    "settling",
    "stop_job",
    "stop_reason_of",
]

VerdictKind = Literal["training", "slice_done", "finished", "dead", "ssh_down", "lost", "restarting"]
Route = Literal["same_host", "replace", "stop"]
CapMove = Literal["pause", "end"]


class TrainerExit(IntEnum):
    """The trainer's exit codes, as `slice.exit` reports them (trainer/exitcodes.py is the other
    side of this file protocol; a test checks that the two tables agree)."""

    FINISHED = 0  # max_steps reached, the adapter written
    FAILED = 1  # training failed; train.log's last line says why
    BAD_JOB = 2  # job.json or the data refused: retrying cannot help
    CAP = 3  # the slice's cap reached: resumable
    REFUSED = 4  # a serving box: never train on this host
    DISK_FULL = 5  # a checkpoint could not be written


class Remedy(StrEnum):
    """What triage says to do about a dead trainer (app.triage.rules.Remedy is the other side of
    this table; a test checks that the two agree)."""

    CONTINUE = "continue"
    COLLECT = "collect"
    SAME_HOST = "same_host"
    REPLACE_HOST = "replace_host"
    STOP_JOB = "stop_job"


_ROUTE_OF: dict[Remedy, Route] = {
    Remedy.CONTINUE: "same_host",
    Remedy.COLLECT: "same_host",
    Remedy.SAME_HOST: "same_host",
    Remedy.REPLACE_HOST: "replace",
    Remedy.STOP_JOB: "stop",
}

GONE_STATES = ("gone", "exited")
NOT_RUNNING_STATES = ("gone", "exited", "stopped", "unknown", "offline")


@dataclass(frozen=True, slots=True)
class SupervisorConfig:
    """Knobs of the supervisor, in seconds of the driver's clock (simulated seconds under the sim)."""

    monitor_s: float = 30.0  # poll period of a healthy job
    repoll_s: float = 10.0  # after one failed SSH poll, look again this soon (loss detected < 60 s)
    ssh_failures_for_loss: int = 2  # consecutive failed SSH polls that, with the provider's say-so, mean lost
    slice_s: float = 1800.0  # the trainer's --max-seconds per slice
    slice_steps: int | None = None  # also cap each slice at this many steps (--slice-steps; tests, operators)
    max_same_host_restarts: int = 2  # trainer deaths resumed on the same host before replacing it
    paused_poll_s: float = 60.0  # a paused job: look this often whether its reason is gone
    restart_grace_s: float = 900.0  # a host we restarted to resume may take this long to answer SSH


@dataclass(frozen=True, slots=True)
class HostProbe:
    """One look at the host. `ssh_ok=False`: nothing below it could be read."""

    provider_state: str
    ssh_ok: bool
    alive: bool = False  # the trainer's process exists
    phase: str | None = None  # status.json phase
    step: int = 0
    exit_code: int | None = None  # the last slice's exit code, once it ended


@dataclass(frozen=True, slots=True)
class Verdict:
    kind: VerdictKind
    why: str


def assess(
    probe: HostProbe, *, ssh_failures: int, cfg: SupervisorConfig, restarting_for_s: float | None = None
) -> Verdict:
    """What one probe means. `ssh_failures` counts consecutive failed SSH polls, this one included.

    Host lost: the provider reports the instance gone outright, or SSH failed on
    `ssh_failures_for_loss` consecutive polls and the provider does not report it running.
    `restarting_for_s`: we restarted this host (stopped by us) that long ago to resume the job; until
    `restart_grace_s` has passed, a host not answering yet is restarting, not lost (gone is gone).
    """
    restarting = restarting_for_s is not None and restarting_for_s < cfg.restart_grace_s
    if restarting and probe.provider_state != "gone" and not probe.ssh_ok:
        return Verdict(
            "restarting", f"restarted {restarting_for_s:.0f}s ago to resume; provider reports {probe.provider_state}"
        )
    if probe.provider_state in GONE_STATES:
        return Verdict("lost", f"provider reports the instance {probe.provider_state}")
    if not probe.ssh_ok:
        if ssh_failures >= cfg.ssh_failures_for_loss and probe.provider_state in NOT_RUNNING_STATES:
            return Verdict(
                "lost",
                f"SSH failed on {ssh_failures} consecutive polls and the provider reports {probe.provider_state}",
            )
        return Verdict("ssh_down", f"SSH failed ({ssh_failures} in a row); provider reports {probe.provider_state}")
    if probe.alive:
        return Verdict("training", f"trainer alive at step {probe.step}")
    if probe.exit_code == TrainerExit.FINISHED and probe.phase == "finished":
        return Verdict("finished", f"trainer finished at step {probe.step}")
    if probe.exit_code == TrainerExit.CAP:
        return Verdict("slice_done", f"slice cap reached at step {probe.step}")
    code = "killed" if probe.exit_code is None else f"exit {probe.exit_code}"
    return Verdict("dead", f"trainer process gone ({code}, status phase {probe.phase}) while the host answers")


def route_triage(
    state: str,
    action: str,
    *,
    exit_code: int | None,
    same_host_restarts: int,
    cfg: SupervisorConfig,
    remedy: str | None = None,
) -> Route:
    """Where a dead trainer goes, from the exit code and triage's remedy (`Remedy`, a named
    constant both drivers pass); a caller with only the state and the action's wording gets the
    same routes from them.

    Exit 2 (job refused) and 4 (serving box) are not the host's fault and retrying cannot help,
    except that 4 means never train on this host: replace it. Exit 5 (disk full): replace. A host
    that died on the same host `max_same_host_restarts` times is replaced.
    """
    if exit_code == TrainerExit.BAD_JOB:
        return "stop"
    if exit_code in (TrainerExit.REFUSED, TrainerExit.DISK_FULL):
        return "replace"
    if remedy is not None:
        known = {m.value: m for m in Remedy}
        route = _ROUTE_OF[known[remedy]] if remedy in known else "replace"  # unknown: another machine
        if route == "same_host" and same_host_restarts >= cfg.max_same_host_restarts:
            return "replace"
        return route
    text = action.lower()
    if "stop the job" in text or state in ("diverged", "data_error"):
        return "stop"
    if state in ("oom", "stalled", "progressing", "completed") or "same host" in text:
        return "same_host" if same_host_restarts < cfg.max_same_host_restarts else "replace"
    return "replace"  # cuda_fault, a full disk, anything unknown: another machine


@dataclass(frozen=True, slots=True)
class FactsVerdict:
    """Triage's reading of a dead trainer's log, corrected by what the supervisor knows."""

    state: str
    remedy: str | None
    fact: str | None  # the fact that overrode the log's reading; None: the log's reading stands


SIGKILL_EXITS = (137, -9)  # a process killed by SIGKILL, as a shell (128 + 9) or Python (-9) reports it


def read_with_facts(
    state: str, remedy: str | None, *, exit_code: int | None, step: int, max_steps: int | None
) -> FactsVerdict:
    """Triage reads the log tail; the supervisor also knows the exit code and how far status.json
    got. A run whose step reached `max_steps` is `completed`, whatever its tail looks like: the
    same host relaunched ends at once with the adapter written. A trainer killed by SIGKILL whose
    log reads healthy (the kernel's OOM killer leaves no line) is `oom`. Exit codes that mean the
    job or the host refused keep their own routes (`route_triage`)."""
    if exit_code in (TrainerExit.BAD_JOB, TrainerExit.REFUSED, TrainerExit.DISK_FULL):
        return FactsVerdict(state, remedy, None)
    if max_steps is not None and max_steps > 0 and step >= max_steps:
        fact = f"status.json reached step {step} of {max_steps}: the run ended at its last step"
        return FactsVerdict("completed", Remedy.COLLECT.value, fact)
    if exit_code in SIGKILL_EXITS and state in ("progressing", "unknown"):
        fact = f"killed by SIGKILL (exit {exit_code}) with a healthy log: the kernel's OOM killer leaves no line"
        return FactsVerdict("oom", Remedy.SAME_HOST.value, fact)
    return FactsVerdict(state, remedy, None)


MAX_OOM_HALVINGS = 2  # an oom halves the micro-batch at most this often; then the job stops


def halve_micro_batch(batch_size: int, grad_accum: int, *, halvings: int) -> tuple[int, int] | str:
    """After an out-of-memory death: half the micro-batch and twice the gradient accumulation, so
    the effective batch (and with it the data order, a function of samples per step) is the same;
    or, when that cannot be done, why the job stops instead. `halvings`: how often it was done."""
    if halvings >= MAX_OOM_HALVINGS:
        return (
            f"out of memory again after halving the micro-batch {halvings} times "
            f"(now {batch_size} x {grad_accum} accumulation). Fix: a card with more memory (needs.min_vram_gb), "
            "a shorter max_seq_len or a smaller model"
        )
    if batch_size < 2 or batch_size % 2:
        return (
            f"out of memory with a micro-batch of {batch_size}, which cannot be halved evenly. "
            "Fix: an even batch_size, a card with more memory (needs.min_vram_gb) or a shorter max_seq_len"
        )
    return batch_size // 2, grad_accum * 2


def stop_job(job: JobState, *, reason: str, evidence: str) -> tuple[JobState, list[Action]]:
    """Give the job up while it trains: stop its host (never destroy), record, tell the operator."""
    acts: list[Action] = []
    att = job.attempt
    if att is not None:
        acts.append(Stop(job.job_id, att.instance_id, att.machine_id, reason, evidence))
        acts.append(Record(att.machine_id, att.provider, "failure", "train_failed", f"{reason}: {evidence}"))
    failed = replace(job, phase="failed", attempt=None, failure=f"{reason}: {evidence}")
    acts.append(GaveUp(job.job_id, failed.failure or reason))
    return failed, acts


# -- our own stops ----------------------------------------------------------------------------
class StopReason(StrEnum):
    """Why we stopped a host: the `stopped_by` field of the stop's ledger event, written by whoever
    stopped it (the sweeps in app.services.guardrails, the operator's `tuneharness stop`)."""

    BUDGET = "budget"  # the budget monitor, at a cap
    KILL_TIME = "kill_time"  # the reaper, past the rental's kill-time
    IDLE = "idle"  # the idle watchdog: the GPU idle past the grace period
    OPERATOR = "operator"  # tuneharness stop
    RECONCILER = "reconciler"  # a crashed create's instance, adopted and stopped
    OTHER = "other"  # a stop we recorded without saying which (an older ledger)


def stop_reason_of(recorded: object) -> StopReason:
    """The named reason a stop event carries in `stopped_by`; OTHER when it carries none we know."""
    known = {m.value: m for m in StopReason}
    return known.get(recorded, StopReason.OTHER) if isinstance(recorded, str) else StopReason.OTHER


@dataclass(frozen=True, slots=True)
class StoppedByUs:
    """Our registry says we stopped the job's host (not the vendor), and why."""

    reason: StopReason
    stopped_at: float
    evidence: str = ""


@dataclass(frozen=True, slots=True)
class ResumeFacts:
    """What the driver looked up to know whether a stop's reason is gone."""

    budget_room: bool  # every cap over the job has room for its host running again
    kill_at: float  # the rental's kill-time (an operator may have extended it)
    operator_resumed: bool = False  # the operator asked for the job to go on


@dataclass(frozen=True, slots=True)
class Paused:
    """The job waits: nothing is rented, nothing is quarantined; `why` says what would end the wait."""

    reason: StopReason
    why: str


@dataclass(frozen=True, slots=True)
class Resume:
    """The reason is gone: start the stopped host again and go on from its newest checkpoint."""

    reason: StopReason
    why: str


_KILL_TIME_MARGIN_S = 600.0  # a resumed host must have at least this long before its kill-time
_WHO: dict[StopReason, str] = {
    StopReason.BUDGET: "the budget monitor",
    StopReason.KILL_TIME: "the reaper",
    StopReason.IDLE: "the idle watchdog",
    StopReason.OPERATOR: "the operator",
    StopReason.RECONCILER: "the reconciler",
    StopReason.OTHER: "us",
}


def judge_our_stop(stop: StoppedByUs, facts: ResumeFacts, *, now: float) -> Paused | Resume:
    """A training host we stopped pauses the job; what ends the pause depends on who stopped it.

    budget: the caps over the job have room again (the operator raised one) -> resume.
    kill_time: the rental's kill-time lies ahead again (it was extended) -> resume.
    idle: the GPU sat idle with nobody driving it; the job still needs it -> resume at once.
    operator, reconciler, other: only the operator resumes it.
    Whatever the reason, a host whose kill-time is (nearly) reached is not started again: the
    reaper would stop it at once; the job stays paused until it has a longer kill-time.
    """
    r = stop.reason
    decision = _judge(r, facts)
    if isinstance(decision, Resume) and facts.kill_at - now < _KILL_TIME_MARGIN_S:
        return Paused(
            r,
            f"paused: stopped by {_WHO[r]}; the host is at its kill-time: the job needs a longer kill-time to go on",
        )
    return decision


def _judge(r: StopReason, facts: ResumeFacts) -> Paused | Resume:
    if facts.operator_resumed:
        return Resume(r, "the operator resumed the job")
    if r is StopReason.BUDGET:
        if facts.budget_room:
            return Resume(r, "the budget has room again")
        return Paused(
            r,
            "paused: stopped by the budget monitor at its cap; resumes when the cap has room "
            "(tuneharness budget set NAME --cap-usd N)",
        )
    if r is StopReason.KILL_TIME:
        return Resume(r, "the kill-time was extended")
    if r is StopReason.IDLE:
        return Resume(r, "stopped idle with nobody driving it; the job still needs the GPU")
    return Paused(
        r, f"paused: host stopped by {_WHO[r]}; only the operator resumes it (no resume command yet: it stays paused)"
    )


def at_cap(*, job_phase: str | None, held_work: bool) -> CapMove:
    """At a budget cap, what becomes of one of a job's hosts: a training host that holds the job's
    work is paused (stopped, the job waits for room); anything else ends through the provisioning
    policy (`BudgetCapReached`)."""
    return "pause" if job_phase == "training" and held_work else "end"


def budget_guard_due(*, monitor_ok_age_s: float | None, poll_s: float, guard_s: float) -> bool:
    """Does a job's own poll hold its caps this time? The budget monitor's last pass, `monitor_ok_age_s`
    ago, stopped whatever could reach a cap within `guard_s` of it; while that still covers this job's
    next poll (`poll_s` from now) the poll has nothing to add. It holds them when the monitor never
    passed, or passed too long ago (a paused or lost beat, or a pass slower than its period)."""
    return monitor_ok_age_s is None or monitor_ok_age_s < 0 or monitor_ok_age_s + poll_s > guard_s


def settling(*, resumed: bool, step: int, paused_step: int, since_launch_s: float, stall_s: float) -> bool:
    """A job resumed after our stop has not yet caught up with the work it had done before it: its
    progress is not judged (the stall window would count the pause) until it does, or until a whole
    stall window has passed since the relaunch without it."""
    return resumed and step <= paused_step and since_launch_s < stall_s


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation; None for no values."""
    if not values:
        return None
    xs = sorted(values)
    if len(xs) == 1:
        return float(xs[0])
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return float(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo))


def recovery_summary(recovery_s: Sequence[float]) -> dict[str, float | int | None]:
    """`{"resumed", "median_s", "p90_s"}` over the recovery times given."""
    return {"resumed": len(recovery_s), "median_s": percentile(recovery_s, 50), "p90_s": percentile(recovery_s, 90)}
