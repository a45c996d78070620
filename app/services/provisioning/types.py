"""What a provisioning step tells its Celery shell, and what one step collects on the way."""

from __future__ import annotations

from dataclasses import dataclass, field

from app.errors import TuneharnessError

__all__ = ["HoldSweep", "Step", "StepBusy", "StepContext", "StepYields"]


@dataclass(frozen=True, slots=True)
class Step:
    """What the Celery shell does next: look again at `wake_at`, run a preflight, or nothing."""

    job_id: str
    phase: str
    wake_at: float | None = None
    preflight_instance: str | None = None
    handed_over: str | None = None  # instance id the job now trains on
    failure: str | None = None
    standby: bool = False  # a standby job: not in the job table, nothing to hand over
    spawned: tuple[str, ...] = ()  # standby jobs started by this step: step each one now
    also: tuple[Step, ...] = ()  # other jobs this step moved (a recovery adopting a standby host)


class StepBusy(TuneharnessError):
    """Another step of the job held its step lease for longer than the wait: nothing was applied."""


class StepYields(Exception):
    """Another step of the same job already did what this one is about to (it adopted a host for
    the same recovery): this step ends without side effects or a save, and that one decides."""


@dataclass
class StepContext:
    """What one step collected besides its own job's state."""

    wake_at: float | None = None
    preflight_instance: str | None = None
    handed_over: str | None = None
    spawned: list[str] = field(default_factory=list)
    also: list[Step] = field(default_factory=list)
    restep: bool = False  # an adoption fell through: look again at once
    ended: bool = False  # the job finished or gave up: release its standby pool
    holds: list[str] = field(default_factory=list)  # pools whose owner a held host is offered to


@dataclass
class HoldSweep:
    """One pass of `sweep_holds`."""

    examined: int = 0
    released: list[str] = field(default_factory=list)
    renewed: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)  # standby jobs started: the shell schedules them
