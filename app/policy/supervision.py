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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import IntEnum, StrEnum
from typing import Literal

from app.policy.provisioning import Action, GaveUp, JobState, Record, Stop

__all__ = [
    "HostProbe",
    "Remedy",
    "Route",
    "SupervisorConfig",
    "TrainerExit",
    "Verdict",
    "assess",
    "percentile",
    "recovery_summary",
    "route_triage",
    "stop_job",
]

VerdictKind = Literal["training", "slice_done", "finished", "dead", "ssh_down", "lost"]
Route = Literal["same_host", "replace", "stop"]


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


def assess(probe: HostProbe, *, ssh_failures: int, cfg: SupervisorConfig) -> Verdict:
    """What one probe means. `ssh_failures` counts consecutive failed SSH polls, this one included.

    Host lost: the provider reports the instance gone outright, or SSH failed on
    `ssh_failures_for_loss` consecutive polls and the provider does not report it running.
    """
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
