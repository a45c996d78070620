"""Money guardrails as pure decisions: idle watchdog, reaper, reconciler, budget thresholds.

The periodic sweeps in `workers.guardrails` gather observations, call these functions and apply
what they return. Automation only ever stops here; destroying is the operator's.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "BUDGET_CHECKPOINT_WAIT_S",
    "LABEL_PREFIX",
    "Adopt",
    "BudgetLevel",
    "IdleVerdict",
    "Known",
    "Listed",
    "MarkLost",
    "StopOrphan",
    "as_step",
    "believable_checkpoint_step",
    "believable_step",
    "believable_util",
    "budget_level",
    "checkpoint_wait_over",
    "idle_verdict",
    "label_for",
    "parse_label",
    "past_kill_time",
    "reconcile",
]

LABEL_PREFIX = "th-"
_LABEL_RE = re.compile(r"^th-(?P<job>[A-Za-z0-9_.-]+?)-a(?P<attempt>\d+)-k(?P<kill_at>\d+)$")

IDLE_GRACE_S = 30 * 60.0
IDLE_THRESHOLD_PCT = 5.0
# At its cap, a budget stop waits for a safe checkpoint at most this long, then stops anyway.
BUDGET_CHECKPOINT_WAIT_S = 15 * 60.0
# A job in these phases is busy without using the GPU: never idle.
BUSY_WITHOUT_GPU = frozenset(
    {
        "provisioning",
        "pulling",
        "loading",
        "between_slices",
        "checkpointing",
        "preflight",
        "evaluating",
    }
)


def label_for(job: str, attempt: int, kill_at: float) -> str:
    """The label every instance carries: its job, attempt and kill-time (epoch seconds)."""
    return f"{LABEL_PREFIX}{job}-a{attempt}-k{int(kill_at)}"


def parse_label(label: str | None) -> tuple[str, int, int] | None:
    """(job, attempt, kill_at) from one of our labels; None for anyone else's instance."""
    if not label:
        return None
    m = _LABEL_RE.match(label)
    if m is None:
        return None
    return m["job"], int(m["attempt"]), int(m["kill_at"])


@dataclass(frozen=True, slots=True)
class IdleVerdict:
    idle_since: float | None  # when the idle spell began (None: not idle)
    stop: bool
    evidence: str


def believable_util(value: float | None) -> float | None:
    """A GPU utilisation as reported (by a vendor or a host), or None when it cannot be true:
    NaN, infinite, or outside [0, 100] is unknown, never busy."""
    if value is None or not math.isfinite(value) or not 0.0 <= value <= 100.0:
        return None
    return float(value)


def as_step(value: object) -> int | None:
    """A whole, non-negative step count from a host's report; None for anything else (NaN, -1, 2.5, "x")."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    if not math.isfinite(number) or number < 0 or number != int(number):
        return None
    return int(number)


def believable_step(*, reported: object, previous: int, max_steps: int | None) -> int:
    """The trainer's step as the control plane believes it: a host's report is taken only when it
    is a whole number that neither goes backwards nor passes the job's own `max_steps`; otherwise
    the previous step stands."""
    step = as_step(reported)
    if step is None or step < previous or (max_steps is not None and step > max_steps):
        return previous
    return step


def believable_checkpoint_step(*, reported: object, previous: int, step: int) -> int:
    """The newest complete checkpoint a host reports, believed only when it is a whole number that
    neither goes backwards nor lies ahead of the (believed) training step."""
    checkpoint = as_step(reported)
    if checkpoint is None or checkpoint < previous or checkpoint > step:
        return previous
    return checkpoint


def idle_verdict(
    *,
    gpu_util_pct: float | None,
    job_phase: str | None,
    idle_since: float | None,
    now: float,
    grace_s: float = IDLE_GRACE_S,
    threshold_pct: float = IDLE_THRESHOLD_PCT,
    step_advanced_at: float | None = None,
) -> IdleVerdict:
    """Is this running instance idle past the grace period? Unknown utilisation decides nothing.

    A training job's step progress outranks any utilisation figure, since a host can print 100%
    forever: when `step_advanced_at` (when the control plane last saw the trainer's step go up, on
    its own clock) is given and lies `grace_s` or more in the past, the host is idle whatever its
    GPU reports. Utilisation outside [0, 100] or NaN is unknown.
    """
    if job_phase in BUSY_WITHOUT_GPU:
        return IdleVerdict(None, False, f"job phase {job_phase}: busy without the GPU")
    if step_advanced_at is not None and now - step_advanced_at >= grace_s:
        stalled_s = now - step_advanced_at
        return IdleVerdict(
            step_advanced_at if idle_since is None else min(idle_since, step_advanced_at),
            True,
            f"training step not advanced for {stalled_s:.0f}s (grace {grace_s:.0f}s), whatever the GPU reports",
        )
    gpu_util_pct = believable_util(gpu_util_pct)
    if gpu_util_pct is None:
        return IdleVerdict(idle_since, False, "GPU utilisation unknown")
    if gpu_util_pct >= threshold_pct:
        return IdleVerdict(None, False, f"GPU {gpu_util_pct:.0f}% busy")
    since = now if idle_since is None else idle_since
    idle_s = now - since
    if idle_s >= grace_s:
        return IdleVerdict(since, True, f"GPU below {threshold_pct:.0f}% for {idle_s:.0f}s (grace {grace_s:.0f}s)")
    return IdleVerdict(since, False, f"GPU below {threshold_pct:.0f}% for {idle_s:.0f}s, within grace")


def checkpoint_wait_over(*, waiting_since: float, now: float, max_wait_s: float = BUDGET_CHECKPOINT_WAIT_S) -> bool:
    """Has a budget stop waited for a safe checkpoint long enough? Then it stops without one: no
    value a host reports can extend a money stop past this deadline."""
    return now - waiting_since >= max_wait_s


def past_kill_time(*, kill_at: float, now: float) -> bool:
    return now >= kill_at


@dataclass(frozen=True, slots=True)
class Known:
    """An instance as our registry knows it."""

    rental_id: str
    label: str
    instance_id: str | None  # None: a create intent not yet confirmed
    state: str  # intent, active, stopped, ...
    created_at: float


@dataclass(frozen=True, slots=True)
class Listed:
    """An instance as the provider lists it."""

    instance_id: str
    label: str | None
    state: str
    started_at: float | None
    first_seen_at: float  # when a sweep first saw it (for orphans without a start time)


@dataclass(frozen=True, slots=True)
class Adopt:
    rental_id: str
    instance_id: str
    evidence: str


@dataclass(frozen=True, slots=True)
class StopOrphan:
    instance_id: str
    label: str
    evidence: str


@dataclass(frozen=True, slots=True)
class MarkLost:
    rental_id: str
    instance_id: str
    evidence: str


ReconcileAction = Adopt | StopOrphan | MarkLost

_RUNNING_AT_PROVIDER = frozenset({"pending", "loading", "running", "unknown"})


def reconcile(
    *,
    known: Sequence[Known],
    listed: Sequence[Listed],
    listing_complete: bool,
    now: float,
    orphan_grace_s: float,
) -> list[ReconcileAction]:
    """Join the provider's labelled instances with our registry.

    - A labelled instance matching a create intent without an id: adopt it (a create crashed
      after the provider accepted it).
    - A labelled instance we do not know at all, older than the grace: stop it.
    - An instance we call active or stopped that the provider no longer lists: lost.
    A failed or partial listing decides nothing.
    """
    if not listing_complete:
        return []
    actions: list[ReconcileAction] = []
    by_instance = {k.instance_id: k for k in known if k.instance_id}
    intents = {k.label: k for k in known if k.instance_id is None and k.state == "intent"}
    listed_ids = set()
    for item in listed:
        listed_ids.add(item.instance_id)
        if item.state == "gone" or item.instance_id in by_instance:
            continue
        if parse_label(item.label) is None:
            continue  # not ours
        if item.label in intents:
            if now - intents[item.label].created_at < orphan_grace_s:
                continue  # a create still in flight: its own task records it
            actions.append(
                Adopt(
                    intents[item.label].rental_id,
                    item.instance_id,
                    f"label {item.label} matches a create intent without an instance id",
                )
            )
            continue
        if item.state not in _RUNNING_AT_PROVIDER:
            continue  # already stopped: bills storage only, the operator decides
        seen = item.started_at if item.started_at is not None else item.first_seen_at
        age = now - seen
        if age >= orphan_grace_s:
            actions.append(
                StopOrphan(
                    item.instance_id,
                    item.label or "",
                    f"labelled {item.label} but unknown to the ledger for {age:.0f}s",
                )
            )
    gone_ids = {i.instance_id for i in listed if i.state == "gone"}
    for k in known:
        if (
            k.instance_id
            and k.state in ("active", "stopped")
            and (k.instance_id not in listed_ids or k.instance_id in gone_ids)
        ):
            actions.append(MarkLost(k.rental_id, k.instance_id, "the provider no longer lists it"))
    return actions


BudgetLevel = Literal["ok", "warning", "stop"]


def budget_level(*, committed_usd: float, cap_usd: float, warn_fraction: float = 0.8) -> BudgetLevel:
    """ok below 80% of the cap, warning from 80%, stop at 100%."""
    if cap_usd <= 0:
        return "stop"
    share = committed_usd / cap_usd
    if share >= 1.0:
        return "stop"
    if share >= warn_fraction:
        return "warning"
    return "ok"
