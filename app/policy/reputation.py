"""Renter-side reputation and quarantine per machine: what happened to US on that machine.

The platform's reliability score measures uptime; we pay for delivery. A `MachineRecord` counts
what each rental of the machine delivered (booted, passed preflight, finished a slice) and every
failure with its reason. Quarantine follows from failures: a machine that failed boot or
preflight is not re-picked for `quarantine_s` (default 30 days); one that misreported its
hardware stays out until the operator lifts it; one that vanished or hung under our training
stays out for `run_quarantine_s` (default 1 day: re-renting it at once re-exposes the next job
to the same loss, and a recovery that lands on it loses its work again). Pure data and pure
functions: the store lives in `app.reputation`, the clock in the caller.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

__all__ = [
    "BOOT_FAILURES",
    "DEFAULT_QUARANTINE_S",
    "DEFAULT_RUN_QUARANTINE_S",
    "FAILURE_REASONS",
    "PERMANENT_FAILURES",
    "PREFLIGHT_FAILURES",
    "RUN_FAILURES",
    "FailureReason",
    "MachineRecord",
    "delivery_probability",
    "is_quarantined",
    "lift_quarantine",
    "quarantine_reason_for",
    "record_boot",
    "record_create",
    "record_failure",
    "record_preflight_passed",
    "record_slice_finished",
]

FailureReason = Literal[
    # boot watch
    "boot_fatal",
    "boot_frozen",
    "boot_deadline",
    "boot_vanished",
    # preflight judgement
    "no_compute",
    "gpu_mismatch",
    "vram_short",
    "throttled",
    "stack_missing",
    "ssh_unreachable",
    "timeout",
    # during training (supervisor)
    "lost",
    "hang",
    "train_failed",
]
BOOT_FAILURES: frozenset[str] = frozenset({"boot_fatal", "boot_frozen", "boot_deadline", "boot_vanished"})
PREFLIGHT_FAILURES: frozenset[str] = frozenset(
    {"no_compute", "gpu_mismatch", "vram_short", "throttled", "stack_missing", "ssh_unreachable", "timeout"}
)
RUN_FAILURES: frozenset[str] = frozenset({"lost", "hang", "train_failed"})
FAILURE_REASONS: frozenset[str] = BOOT_FAILURES | PREFLIGHT_FAILURES | RUN_FAILURES
# Misreported hardware: a host that lied about what it is stays out until an operator lifts it.
PERMANENT_FAILURES: frozenset[str] = frozenset({"gpu_mismatch", "vram_short"})
DEFAULT_QUARANTINE_S = 30 * 24 * 3600.0
# The host vanished or the training hung on it: out for a day (not for a "train_failed", which
# may be the job's own fault).
RUN_QUARANTINE_FAILURES: frozenset[str] = frozenset({"lost", "hang"})
DEFAULT_RUN_QUARANTINE_S = 24 * 3600.0


@dataclass(frozen=True, slots=True)
class MachineRecord:
    """Everything we have seen one machine do for us."""

    machine_id: str
    provider: str = ""
    creates: int = 0
    booted: int = 0
    preflight_passed: int = 0
    slices_finished: int = 0
    failures: tuple[tuple[str, float], ...] = ()  # (reason, when) oldest first
    quarantined_until: float | None = None  # epoch s; None = not quarantined
    quarantine_permanent: bool = False
    quarantine_reason: str | None = None
    last_seen_at: float | None = None

    @property
    def failure_count(self) -> int:
        return len(self.failures)

    @property
    def delivered(self) -> int:
        """Rentals that produced a verified, computing GPU (passed preflight)."""
        return self.preflight_passed


def record_create(rec: MachineRecord, *, now: float) -> MachineRecord:
    return replace(rec, creates=rec.creates + 1, last_seen_at=now)


def record_boot(rec: MachineRecord, *, now: float) -> MachineRecord:
    return replace(rec, booted=rec.booted + 1, last_seen_at=now)


def record_preflight_passed(rec: MachineRecord, *, now: float) -> MachineRecord:
    return replace(rec, preflight_passed=rec.preflight_passed + 1, last_seen_at=now)


def record_slice_finished(rec: MachineRecord, *, now: float) -> MachineRecord:
    return replace(rec, slices_finished=rec.slices_finished + 1, last_seen_at=now)


def quarantine_reason_for(reason: str) -> Literal["permanent", "window", "run_window", "none"]:
    """How a failure quarantines: misreported hardware forever, boot/preflight for a window, a
    host lost or hung under training for the shorter run window."""
    if reason in PERMANENT_FAILURES:
        return "permanent"
    if reason in BOOT_FAILURES or reason in PREFLIGHT_FAILURES:
        return "window"
    if reason in RUN_QUARANTINE_FAILURES:
        return "run_window"
    return "none"


def record_failure(
    rec: MachineRecord,
    *,
    reason: str,
    now: float,
    quarantine_s: float = DEFAULT_QUARANTINE_S,
    run_quarantine_s: float = DEFAULT_RUN_QUARANTINE_S,
) -> MachineRecord:
    """Count a failure and quarantine the machine as the reason demands.

    A host lost or hung under training (`lost`, `hang`) is kept out for `run_quarantine_s` (it
    did deliver once, so not for the boot/preflight window); `train_failed` lowers the
    reputation only.
    """
    if reason not in FAILURE_REASONS:
        raise ValueError(f"unknown failure reason {reason!r}; known: {sorted(FAILURE_REASONS)}")
    rec = replace(rec, failures=(*rec.failures, (reason, now)), last_seen_at=now)
    kind = quarantine_reason_for(reason)
    if kind == "permanent":
        return replace(rec, quarantine_permanent=True, quarantined_until=None, quarantine_reason=reason)
    if kind in ("window", "run_window") and not rec.quarantine_permanent:
        until = now + (quarantine_s if kind == "window" else run_quarantine_s)
        if rec.quarantined_until is None or until > rec.quarantined_until:
            return replace(rec, quarantined_until=until, quarantine_reason=reason)
    return rec


def is_quarantined(rec: MachineRecord | None, *, now: float) -> bool:
    if rec is None:
        return False
    if rec.quarantine_permanent:
        return True
    return rec.quarantined_until is not None and now < rec.quarantined_until


def lift_quarantine(rec: MachineRecord) -> MachineRecord:
    """The operator's decision: the machine may be rented again (its history stays)."""
    return replace(rec, quarantine_permanent=False, quarantined_until=None, quarantine_reason=None)


def delivery_probability(
    *,
    platform_reliability: float | None,
    delivered: int = 0,
    failed: int = 0,
    prior_strength: float = 8.0,
    unknown_reliability: float = 0.9,
) -> float:
    """The renter-side probability that a rental of this machine delivers a computing GPU.

    The mean of a Beta posterior: the platform's reliability `r` is the prior mean, worth
    `prior_strength` pseudo-rentals (Beta(r*n, (1-r)*n)); each of our own deliveries and
    failures on the machine is one observation. Our record quickly outweighs the platform's
    uptime score, which is the point: uptime is not delivery.
    """
    r = unknown_reliability if platform_reliability is None else platform_reliability
    r = min(max(r, 0.0), 1.0)
    alpha = r * prior_strength + max(delivered, 0)
    beta = (1.0 - r) * prior_strength + max(failed, 0)
    total = alpha + beta
    return alpha / total if total > 0 else 0.0
