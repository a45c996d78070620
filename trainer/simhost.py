"""What a simulated host does to the trainer: it hangs when its truth says so, and it trains at
the host's simulated speed when the marketplace sets one.

On a host of the simulated marketplace, `TUNEHARNESS_SIM_TRUTH` names a JSON file (docs/simulation.md)
whose `hangs_at_epoch_s` is the simulated instant at which the training process hangs, and whose
`clock` (`{"scale", "epoch_s"}`, or null for the wall clock) says how to read simulated time:
`epoch_s + scale * (time.time() - epoch_s)`. Once that instant has passed, `trainer run` stops
before its next step and never makes progress again, like a process stuck in an NCCL collective:
alive, `phase` still `training`, status.json's heartbeat still rewritten (its `updated_at`
advances) but `step` frozen, no new train.log lines, SIGTERM not honoured (a blocked collective
never returns to the interpreter); only SIGKILL ends it.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["SIM_TRUTH_ENV", "SimHang", "SimPace", "hang_forever", "load_hang", "load_pace"]

SIM_TRUTH_ENV = "TUNEHARNESS_SIM_TRUTH"


@dataclass(frozen=True, slots=True)
class SimHang:
    """When (in simulated seconds) the host hangs, and how to read its simulated clock."""

    hangs_at_epoch_s: float
    scale: float = 1.0
    epoch_s: float = 0.0

    def sim_now(self, wall_s: float) -> float:
        return self.epoch_s + self.scale * (wall_s - self.epoch_s)

    def hung(self, wall_s: float | None = None) -> bool:
        return self.sim_now(time.time() if wall_s is None else wall_s) >= self.hangs_at_epoch_s


def load_hang(env: Mapping[str, str] | None = None) -> SimHang | None:
    """The hang this simulated host will suffer, or None (not simulated, no hang, unreadable truth).

    An unreadable truth file is not the trainer's failure: preflight reports it; training goes on.
    """
    env = os.environ if env is None else env
    path = env.get(SIM_TRUTH_ENV)
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            truth = json.load(fh)
        at = truth.get("hangs_at_epoch_s")
        if at is None:
            return None
        clock = truth.get("clock") or {}
        scale, epoch = float(clock.get("scale", 1.0)), float(clock.get("epoch_s", 0.0))
        if scale <= 0:
            return None
        return SimHang(hangs_at_epoch_s=float(at), scale=scale, epoch_s=epoch)
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def hang_forever() -> None:
    """Block the calling thread for good; signal handlers may run, the caller never resumes."""
    stuck = threading.Event()
    while True:
        stuck.wait(3600.0)


@dataclass(frozen=True, slots=True)
class SimPace:
    """How fast this simulated host trains: `start_s` simulated seconds to start (imports, loading
    the model), then `step_s` simulated seconds per step at full speed, divided by its
    `tflops_factor`; `scale` converts simulated seconds to wall seconds. The CPU
    trains far faster than a step's simulated time, so the trainer waits out the rest: a job then
    takes, in simulated time, what the trace says it takes on that card."""

    step_s: float
    factor: float = 1.0
    scale: float = 1.0
    start_s: float = 0.0  # simulated seconds from the process's start to its first step

    def wait_start(self, *, since_wall: float) -> None:
        """Sleep until the host's start-up (imports, loading the model) has taken `start_s`."""
        left = since_wall + self.start_s / self.scale - time.time()
        if left > 0:
            time.sleep(left)

    def wait(self, *, steps: int, since_wall: float) -> None:
        """Sleep until `steps` steps' worth of simulated time has passed since `since_wall`."""
        due = steps * self.step_s / self.factor / self.scale
        left = since_wall + due - time.time()
        if left > 0:
            time.sleep(left)


def load_pace(env: Mapping[str, str] | None = None) -> SimPace | None:
    """The simulated host's training speed (its truth's `train_step_s`), or None: not simulated,
    no pace set (the trainer runs at its own speed), or an unreadable truth."""
    env = os.environ if env is None else env
    path = env.get(SIM_TRUTH_ENV)
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            truth = json.load(fh)
        step_s = truth.get("train_step_s")
        if step_s is None:
            return None
        clock = truth.get("clock") or {}
        scale = float(clock.get("scale", 1.0))
        factor = float(truth.get("tflops_factor") or 1.0)
        if not (step_s > 0 and scale > 0 and factor > 0):
            return None
        start_s = float(truth.get("train_start_s") or 0.0)
        return SimPace(step_s=float(step_s), factor=factor, scale=scale, start_s=max(0.0, start_s))
    except (OSError, ValueError, TypeError, AttributeError):
        return None
