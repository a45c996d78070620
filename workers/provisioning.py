"""Celery shells of the provisioning policy: `provision`, `watch_boot`, `preflight`, and beat's
`sweep_holds` (held hosts and standby pools, one task per sweep).

Thin and idempotent: each takes ids, calls `app.services.provisioning.ProvisioningService`, and
re-enqueues itself with a countdown (never sleeps in a task). A redelivered task is harmless: the
service's state is versioned and creates go through the rental protocol, keyed per attempt.
"""

from __future__ import annotations

from typing import Any

from app import bootstrap
from app.jobs import spec_from_dict
from app.market import MarketError, ProviderBusy
from app.services.provisioning import Step
from workers.celery_app import app
from workers.config import MAX_COUNTDOWN_S
from workers.tasks import task

__all__ = ["preflight", "provision", "schedule", "sweep_holds", "watch_boot"]


def _countdown_s(wake_at: float) -> float:
    """Wall seconds until `wake_at` on the service's clock (scaled under the simulator)."""
    clock = bootstrap.provisioning().clock
    return min(float(MAX_COUNTDOWN_S), clock.wall_seconds(max(0.0, wake_at - clock.now())))


def schedule(step: Step) -> dict[str, Any]:
    # Standby jobs this step started (a hedge, a pool top-up) go through the same tasks at once;
    # other jobs it moved (a recovery that adopted a standby host) are scheduled like any step.
    for standby_id in step.spawned:
        watch_boot.apply_async(args=[standby_id])
    for other in step.also:
        schedule(other)
    if step.preflight_instance is not None:
        preflight.apply_async(args=[step.job_id, step.preflight_instance])
    elif step.wake_at is not None and step.handed_over is None:
        watch_boot.apply_async(args=[step.job_id], countdown=_countdown_s(step.wake_at))
    if step.standby:  # not in the job table: nothing to hand over or to mark
        return {"job": step.job_id, "phase": step.phase, "wake_at": step.wake_at, "standby": True}
    if step.handed_over is not None:
        bootstrap.jobs().set_phase(step.job_id, "training", detail=f"on {step.handed_over}")
        # the supervisor takes over: push the bundle, start the trainer, monitor (one chain per job)
        seq = bootstrap.supervisor().arm(step.job_id, step.handed_over)
        app.send_task("tuneharness.monitor.monitor_training", args=[step.job_id, seq], queue="monitor")
    elif step.phase == "failed":
        bootstrap.jobs().set_phase(step.job_id, "failed", detail=step.failure or "")
        bootstrap.jobs().run_failed(step.job_id, detail=step.failure or "provisioning failed")
    return {
        "job": step.job_id,
        "phase": step.phase,
        "wake_at": step.wake_at,
        "preflight": step.preflight_instance,
        "handed_over": step.handed_over,
    }


@task("provision", "provision")
def provision(self: Any, job_id: str) -> dict[str, Any]:
    """Start provisioning a submitted job: rank offers, rent the best one (budget reserved first)."""
    rec = bootstrap.jobs().get(job_id)
    if rec is None:
        return {"job": job_id, "phase": "unknown"}
    spec = spec_from_dict(rec.spec)
    bootstrap.jobs().set_phase(job_id, "provisioning", detail="ranking offers")
    try:
        step = bootstrap.provisioning().start(
            job_id, req=spec.needs.requirements(), shape=spec.shape(), standby_hosts=spec.needs.standby_hosts
        )
    except ProviderBusy as exc:
        raise self.retry(exc=exc, countdown=30) from None
    return schedule(step)


@task("provision", "watch_boot")
def watch_boot(self: Any, job_id: str) -> dict[str, Any]:
    """One look at the job: a queued job picks an offer, a booting one has its status line read."""
    try:
        step = bootstrap.provisioning().step(job_id)
    except (ProviderBusy, MarketError) as exc:
        raise self.retry(exc=exc, countdown=15) from None
    return schedule(step)


@task("ssh", "preflight")
def preflight(self: Any, job_id: str, instance_id: str) -> dict[str, Any]:
    """Run the compute preflight over SSH on the job's new host and judge it."""
    return schedule(bootstrap.provisioning().preflight(job_id, instance_id))


@task("maintenance", "sweep_holds")
def sweep_holds(self: Any) -> dict[str, Any]:
    """Release expired holds (stop what held work, destroy what never did), drop vanished ones,
    keep every running job's standby pool full and release the pools of jobs that ended."""
    import time

    from app.liveness import record_success

    svc = bootstrap.provisioning()
    report = svc.sweep_holds()
    for step in report.steps:
        schedule(step)
    record_success(svc.engine, "held-hosts", time.time())
    return {
        "examined": report.examined,
        "released": report.released,
        "renewed": report.renewed,
        "dropped": report.dropped,
        "errors": report.errors,
        "started": [s.job_id for s in report.steps],
    }
