"""The trainer on a simulated host, played from the host's truth.

`SimMarket` models the host, not the training on it. `SimTrainer` plays the trainer: its speed is
the host's `tflops_factor` (and the real card's, for a misreported GPU), a host whose CUDA is
broken fails 30 s in, one with less VRAM than it claimed runs out of memory after 90 s, a hang
stops progress at `hangs_at_s`, and `dies_at_s` loses the work since the last checkpoint. It
decides nothing: like the real trainer it leaves a status file, a process that lives or exited
with a code, and the tail of train.log, and the supervisor's own judgement
(`app.policy.supervision.assess`, triage, `route_triage`) reads them.

Work is measured in full-speed seconds of training.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from app.policy.supervision import TrainerExit

__all__ = [
    "CUDA_ERROR",
    "HEARTBEAT_S",
    "OOM_ERROR",
    "OOM_S",
    "TRAINER_CRASH_S",
    "TRAINER_START_S",
    "SimTrainer",
    "TrainerView",
]

# A trainer's start on a host before its first step: the interpreter, torch, transformers, peft,
# loading (and quantizing) the base model. The H200 runs measured 13-17 s for a 0.36 B model
# (docs/benchmarks.md); a few-billion-parameter model's load takes longer.
TRAINER_START_S = 30.0
TRAINER_CRASH_S = 30.0  # a trainer that cannot compute dies this long after it starts
OOM_S = 90.0  # a host with less VRAM than it claimed runs out of memory this long after start
HEARTBEAT_S = 10.0  # status.json rewrite period
CUDA_ERROR = "RuntimeError: CUDA error: CUDA driver version is insufficient for CUDA runtime version"
OOM_ERROR = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"


@dataclass(frozen=True, slots=True)
class TrainerView:
    """What the supervisor reads on the host: status.json, whether the process lives, its exit
    code, and the tail of train.log."""

    alive: bool
    phase: str  # status.json's phase: training, finished or failed
    work_s: float
    checkpoint_work_s: float
    heartbeat_at: float
    exit_code: int | None
    log_tail: str


@dataclass
class SimTrainer:
    instance_id: str
    started_at: float
    resume_work_s: float
    train_s: float
    checkpoint_every_s: float
    speed: float  # work seconds per second
    fails_at: float | None  # the trainer exits with an error
    fail_error: str | None
    hangs_at: float | None
    dies_at: float | None
    start_s: float = TRAINER_START_S  # from the process's start to its first step

    @property
    def training_from(self) -> float:
        """When the first step begins."""
        return self.started_at + self.start_s

    def _stall_at(self) -> float:
        times = [t for t in (self.fails_at, self.hangs_at, self.dies_at) if t is not None]
        return min(times) if times else math.inf

    def finish_at(self) -> float:
        need = max(self.train_s - self.resume_work_s, 0.0)
        t = self.training_from + need / self.speed if self.speed > 0 else math.inf
        return t if t <= self._stall_at() else math.inf

    def work_at(self, t: float) -> float:
        if t >= self.finish_at():
            return self.train_s
        until = min(t, self._stall_at(), self.finish_at())
        return min(self.train_s, self.resume_work_s + max(0.0, until - self.training_from) * self.speed)

    def training_seconds(self, until: float) -> float:
        """Wall seconds the GPU actually trained until `until`."""
        end = min(until, self._stall_at(), self.finish_at())
        return max(0.0, end - self.training_from)

    def checkpoint_at(self, t: float) -> float:
        w = self.work_at(t)
        if w >= self.train_s:
            return self.train_s
        return max(self.resume_work_s, math.floor(w / self.checkpoint_every_s) * self.checkpoint_every_s)

    def last_heartbeat(self, t: float) -> float:
        """When status.json was last rewritten, as of `t` (it stops when the host dies)."""
        until = min(t, self.dies_at) if self.dies_at is not None else t
        return math.floor(max(0.0, until - self.started_at) / HEARTBEAT_S) * HEARTBEAT_S + self.started_at

    def view(self, now: float) -> TrainerView:
        """The trainer's files and process as the supervisor would find them at `now`."""
        work, ckpt = self.work_at(now), self.checkpoint_at(now)
        if work >= self.train_s - 1e-9:
            return TrainerView(
                False,
                "finished",
                work,
                ckpt,
                now,
                int(TrainerExit.FINISHED),
                f"finished step={work:.0f} max_steps={self.train_s:.0f}",
            )
        if self.fails_at is not None and now >= self.fails_at:
            return TrainerView(
                False, "failed", work, ckpt, self.fails_at, int(TrainerExit.FAILED), self.fail_error or "trainer failed"
            )
        return TrainerView(True, "training", work, ckpt, now, None, f"step={work:.0f} max_steps={self.train_s:.0f}")
