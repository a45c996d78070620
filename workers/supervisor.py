"""Celery shell of the training supervisor: `monitor_training`, one chain per running job.

Thin: it takes the job id and the chain's sequence number, calls
`app.services.supervisor.SupervisorService.poll`, and re-enqueues itself with a countdown (never
sleeping in a task). A lost host hands the job back to provisioning (`watch_boot`), which rents
a replacement and re-arms this chain on hand-over. A redelivered or duplicated task is harmless:
only the task holding the chain's current sequence number polls.
"""

from __future__ import annotations

from typing import Any

from app import bootstrap
from app.ports import Clock
from app.services.supervisor import MonitorStep
from workers.celery_app import app
from workers.config import MAX_COUNTDOWN_S
from workers.tasks import task

__all__ = ["monitor_training", "rearm_monitors", "transfer_to_host"]

# The transfer task's own limits: a model may take long to move. Under the visibility timeout
# (workers/config.py checks every registered task's limits at start-up); the service ends itself
# earlier (app.services.supervisor.TRANSFER_TASK_S) and the next task resumes.
TRANSFER_SOFT_TIME_LIMIT_S = 3300
TRANSFER_TIME_LIMIT_S = 3600


def _countdown_s(wake_at: float | None, clock: Clock) -> float:
    """Wall seconds until `wake_at` on the service's clock (scaled under the simulator)."""
    if wake_at is None:
        return 0.0
    return min(float(MAX_COUNTDOWN_S), clock.wall_seconds(max(0.0, wake_at - clock.now())))


def _schedule(step: MonitorStep, clock: Clock) -> dict[str, Any]:
    countdown = _countdown_s(step.wake_at, clock)
    if step.transfer is not None:
        transfer_to_host.apply_async(args=[step.job_id, step.transfer])
    if step.next == "monitor" and step.seq is not None:
        monitor_training.apply_async(args=[step.job_id, step.seq], countdown=countdown)
    elif step.next == "provision":
        from workers.provisioning import watch_boot

        watch_boot.apply_async(args=[step.job_id], countdown=countdown)
    elif step.next == "evaluate" and step.evaluate is not None:
        from workers.evaluate import evaluate_job

        evaluate_job.apply_async(args=[step.evaluate])
    return {"job": step.job_id, "next": step.next, "countdown_s": countdown, "detail": step.detail}


# No result is stored: nothing reads it, and at every poll of every job it is Redis traffic.
@task("monitor", "monitor_training", ignore_result=True)
def monitor_training(self: Any, job_id: str, seq: int) -> dict[str, Any]:
    """One look at a training job's host: heartbeat, checkpoints, slices, loss, hang, finish."""
    sup = bootstrap.supervisor()
    return _schedule(sup.poll(job_id, seq), sup.clock)


@app.task(
    name="tuneharness.ssh.transfer_to_host",
    bind=True,
    soft_time_limit=TRANSFER_SOFT_TIME_LIMIT_S,
    time_limit=TRANSFER_TIME_LIMIT_S,
)
def transfer_to_host(self: Any, job_id: str, instance_id: str) -> dict[str, Any]:
    """Move a job's files onto its new host (resumable, once per host); the monitor starts the slice,
    woken as soon as the files are there: every second until its next poll is billed idle."""
    sup = bootstrap.supervisor()
    t = sup.run_transfer(job_id, instance_id)
    if t is None:
        return {"job": job_id, "instance": instance_id, "state": "not run"}
    seq = sup.chain_seq(job_id) if t.state == "done" else None
    if seq is not None:
        monitor_training.apply_async(args=[job_id, seq])
    return {"job": job_id, "instance": instance_id, "state": t.state, "bytes_done": t.bytes_done}


@task("maintenance", "rearm_monitors")
def rearm_monitors(self: Any) -> list[str]:
    """Beat's backstop: a training job whose monitor chain died with a worker gets a new chain."""
    import time

    from app.liveness import record_success

    sup = bootstrap.supervisor()
    rearmed = []
    for job_id, instance_id in sup.orphaned():
        seq = sup.arm(job_id, instance_id)
        monitor_training.apply_async(args=[job_id, seq])
        rearmed.append(job_id)
    record_success(bootstrap.engine(), "rearm-monitors", time.time())
    return rearmed
