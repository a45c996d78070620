"""The one interpreter of the policy's actions, for both drivers.

`drive(job, observation, effects, cfg)` folds observations into one job with
`app.policy.provisioning.decide` and applies every action it returns through `Effects`; an
action's own result (a create's outcome, an adoption) is folded in next. `tend(...)` applies the
fleet's hold decisions (`app.policy.fleet`). What each action *does* is the driver's: the
real-time driver (`app.services.provisioning`) rents through the vendors with its budget
reservation and records the ledger; the campaign simulator (`providers.sim.campaign`) rents from
the simulated marketplace on a virtual clock. What to do, and in what order, is written here once.

No I/O of its own and no clock: the effects bring both.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, assert_never

from app.policy.fleet import Drop, HoldAction, Release, Renew
from app.policy.provisioning import (
    Action,
    Adopt,
    Create,
    Destroy,
    Finished,
    GaveUp,
    Hold,
    JobState,
    Observation,
    ProvisioningConfig,
    Record,
    Recovered,
    RecoveryProgress,
    RunPreflight,
    StartTraining,
    Stop,
    WakeAt,
    WantStandby,
    decide,
)

__all__ = ["Effects", "HoldEffects", "apply", "drive", "tend"]


class Effects(Protocol):
    """What a driver does for one job's actions. Methods that observe something return it as the
    next observation for the same job (None: nothing to fold in)."""

    def now(self) -> float: ...

    def jitter(self) -> float:
        """A uniform number in [0, 1) for the policy's backoff (the policy draws none itself)."""
        ...

    def decided(self, job: JobState) -> None:
        """The job's new state, before its actions are applied (the simulator publishes it at once;
        the real-time driver saves it once the whole step is applied)."""
        ...

    def create(self, job: JobState, act: Create) -> Observation: ...

    def adopt(self, job: JobState, act: Adopt) -> Observation | None: ...

    def destroy(self, job: JobState, act: Destroy) -> None: ...

    def stop(self, job: JobState, act: Stop) -> None: ...

    def record(self, job: JobState, act: Record) -> None: ...

    def run_preflight(self, job: JobState, act: RunPreflight) -> None: ...

    def start_training(self, job: JobState, act: StartTraining) -> None: ...

    def hold(self, job: JobState, act: Hold) -> None: ...

    def want_standby(self, job: JobState, act: WantStandby) -> None: ...

    def recovered(self, job: JobState, act: Recovered) -> None: ...

    def finished(self, job: JobState, act: Finished) -> None: ...

    def gave_up(self, job: JobState, act: GaveUp) -> None: ...

    def wake(self, job: JobState, act: WakeAt) -> None: ...


def apply(fx: Effects, job: JobState, act: Action) -> Observation | None:
    """Apply one action; return what it observed, if anything."""
    if isinstance(act, Create):
        return fx.create(job, act)
    if isinstance(act, Adopt):
        return fx.adopt(job, act)
    if isinstance(act, Destroy):
        fx.destroy(job, act)
    elif isinstance(act, Stop):
        fx.stop(job, act)
    elif isinstance(act, Record):
        fx.record(job, act)
    elif isinstance(act, RunPreflight):
        fx.run_preflight(job, act)
    elif isinstance(act, StartTraining):
        fx.start_training(job, act)
    elif isinstance(act, Hold):
        fx.hold(job, act)
    elif isinstance(act, WantStandby):
        fx.want_standby(job, act)
    elif isinstance(act, Recovered):
        fx.recovered(job, act)
    elif isinstance(act, Finished):
        fx.finished(job, act)
    elif isinstance(act, GaveUp):
        fx.gave_up(job, act)
    elif isinstance(act, WakeAt):
        fx.wake(job, act)
    else:  # a new Action type must get its effect here: mypy fails until it does
        assert_never(act)
    return None


def drive(job: JobState, first: Observation, fx: Effects, cfg: ProvisioningConfig) -> JobState:
    """Fold `first`, and whatever applying the actions observes, into the job; return its state."""
    pending: list[Observation] = [first]
    while pending:
        obs = pending.pop(0)
        # A progress look at a waiting recovery never backs off: it draws no jitter, so the random
        # stream (and every later backoff) is the same whether or not such looks happen.
        jitter_u = 0.5 if isinstance(obs, RecoveryProgress) else fx.jitter()
        job, actions = decide(job, obs, fx.now(), cfg=cfg, jitter_u=jitter_u)
        fx.decided(job)
        for act in actions:
            follow = apply(fx, job, act)
            if follow is not None:
                pending.append(follow)
    return job


class HoldEffects(Protocol):
    """What a driver does for the fleet's decisions about held hosts."""

    def release(self, act: Release) -> None: ...

    def renew(self, act: Renew) -> None: ...

    def drop(self, act: Drop) -> None: ...


def tend(fx: HoldEffects, decisions: Iterable[HoldAction | None]) -> None:
    """Apply the fleet's decisions about held hosts (a sweep's, or one hold's end)."""
    for act in decisions:
        if isinstance(act, Release):
            fx.release(act)
        elif isinstance(act, Renew):
            fx.renew(act)
        elif isinstance(act, Drop):
            fx.drop(act)
        elif act is not None:
            assert_never(act)
