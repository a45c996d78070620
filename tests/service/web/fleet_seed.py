"""A fleet for the web pages, made by the real services (the supervisor tests' harness: the sim
market on a virtual clock, fake hosts' files in a directory): a job that rented past a dud host,
trained, lost its host, recovered on another and trains there; the beat's reaper ran once."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from app.jobs import JobEvaluation, JobStore
from app.liveness import record_success
from app.services.lifecycle import Lifecycle
from app.services.supervisor import remote_job_root
from app.web.data import Source
from tests.service.jobs.test_lifecycle_cancel_resume import _training_job
from tests.service.provisioning.test_supervisor_service import JOB, Harness, _iso, _training

__all__ = ["HOSTILE", "JOB", "Fleet", "seed_fleet"]

HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>'


def _log(h: Harness, inst: str, steps: range) -> None:
    """train.log `step` lines on the host, in the trainer's format."""
    path = h.hosts[inst].root / remote_job_root(JOB) / "job" / "train.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for s in steps:
            f.write(
                f"{_iso(time.time())} step step={s} max_steps=20 loss={2.0 / s:.4f} lr=1e-3 grad_norm=1 "
                "tokens_per_s=1 samples_per_s=1 elapsed_s=1\n"
            )


@dataclass
class Fleet:
    h: Harness
    jobs: JobStore
    lost: str  # the instance lost while training
    current: str  # the instance the job trains on now

    def source(self) -> Source:
        return Source(
            engine=self.h.engine,
            now=self.h.clock.now,
            store=self.h.store,
            flower_url="http://127.0.0.1:5555",
            intervals_s={"reaper": 60.0, "idle-watchdog": 60.0},
        )

    def cancel(self, reason: str = HOSTILE) -> None:
        """The operator cancels the job (its train.log is pulled before the stop)."""
        self.h.clock.advance(300)
        Lifecycle(self.h.sup).cancel(JOB, reason=reason)


def seed_fleet(tmp: Path) -> Fleet:
    h = Harness(tmp)
    first, seq, jobs = _training_job(h)
    _log(h, first, range(1, 7))
    h.clock.advance(600)
    h.market.destroy(first)
    h.hosts[first].unreachable = True
    _, nxt, wake = h.poll(seq)
    assert nxt == "provision" and wake is not None
    h.clock.set(max(h.clock.now(), wake))
    second = h.provision(h.prov.step(JOB))
    seq = h.sup.arm(JOB, second)
    seq, _, _ = h.poll(seq)
    _training(h.hosts[second], 9)
    _log(h, second, range(6, 10))
    h.hosts[second].log = (
        f"{_iso(time.time())} step step=9 max_steps=20 loss=0.22 lr=1e-3 grad_norm=1 tokens_per_s=1 "
        "samples_per_s=1 elapsed_s=1"
    )
    h.poll(seq)
    jobs.set_phase(JOB, "training", detail=f"on {second}")
    jobs.record_evaluation(JobEvaluation(JOB, str(tmp / "trial"), "f" * 64, "refuse", ("worse_than_baseline",), 0.0))
    record_success(h.engine, "reaper", time.time())
    return Fleet(h, jobs, first, second)
