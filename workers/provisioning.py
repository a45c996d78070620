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

__all__ = [
    "REDRIVE_GRACE_S",
    "STALE_INTENT_S",
    "preflight",
    "provision",
    "redrive",
    "schedule",
    "sweep_holds",
    "watch_boot",
]

# A job's wake-up this many wall seconds past with nothing stepping it has lost its task.
REDRIVE_GRACE_S = 600.0
# An intent this old (provisioning-clock seconds) with nothing listed under its label holds its
# reservation for nothing: no live step keeps an intent longer than `create_confirm_s`.
STALE_INTENT_S = 3600.0


def _countdown_s(wake_at: float) -> float:
    """Wall seconds until `wake_at` on the service's clock (scaled under the simulator)."""
    clock = bootstrap.provisioning().clock
    return min(float(MAX_COUNTDOWN_S), clock.wall_seconds(max(0.0, wake_at - clock.now())))


def _phase(job_id: str) -> str | None:
    """The job's phase in the job table (None: no such job). A `cancelled` job's chain ends quietly; a
    `blocked` one waits on the operator (`app.blocking`) until `tuneharness resume`."""
    rec = bootstrap.jobs().get(job_id)
    return None if rec is None else rec.phase


def schedule(step: Step) -> dict[str, Any]:
    if not step.standby and _phase(step.job_id) == "cancelled":
        # cancelled while this step ran (`tuneharness cancel`): its chain ends here, quietly
        return {"job": step.job_id, "phase": "cancelled"}
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
    if rec.phase in ("cancelled", "blocked"):  # nothing is rented for it (resume enqueues it again)
        return {"job": job_id, "phase": rec.phase}
    spec = spec_from_dict(rec.spec)
    bootstrap.jobs().set_phase(job_id, "provisioning", detail="ranking offers")
    try:
        step = bootstrap.provisioning().start(
            job_id, req=spec.needs.requirements(), shape=spec.shape(), standby_hosts=spec.needs.standby_hosts
        )
    except ProviderBusy as exc:
        # no retry count: a provider that is down for a while is waited out (the redrive sweep and
        # the policy's own deadlines bound the job, not Celery's default of three tries)
        raise self.retry(exc=exc, countdown=30, max_retries=None) from None
    return schedule(step)


@task("provision", "watch_boot")
def watch_boot(self: Any, job_id: str) -> dict[str, Any]:
    """One look at the job: a queued job picks an offer, a booting one has its status line read."""
    if _phase(job_id) == "blocked":
        return {"job": job_id, "phase": "blocked"}
    try:
        step = bootstrap.provisioning().step(job_id)
    except (ProviderBusy, MarketError) as exc:
        # a booting host bills while we cannot see it: keep looking, never give up after three tries
        raise self.retry(exc=exc, countdown=15, max_retries=None) from None
    return schedule(step)


# A vendor that cannot say where the host is (its status call fails) is asked again for this long;
# then the preflight is judged `timeout` (the host never held work: it is destroyed, not trained on).
PREFLIGHT_VENDOR_WAIT_S = 300.0


@task("ssh", "preflight")
def preflight(self: Any, job_id: str, instance_id: str, first_try_at: float | None = None) -> dict[str, Any]:
    """Run the compute preflight over SSH on the job's new host and judge it."""
    import time

    from app.policy.provisioning import PreflightResult

    first = first_try_at if first_try_at is not None else time.time()
    try:
        return schedule(bootstrap.provisioning().preflight(job_id, instance_id))
    except MarketError as exc:
        waited = time.time() - first
        if waited < PREFLIGHT_VENDOR_WAIT_S:
            raise self.retry(
                exc=exc, countdown=15, max_retries=None, args=[job_id, instance_id], kwargs={"first_try_at": first}
            ) from None
        verdict = PreflightResult(None, "timeout", f"the vendor could not be asked for {waited:.0f}s: {exc}")
        return schedule(bootstrap.provisioning().preflight(job_id, instance_id, result=verdict))


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


@task("maintenance", "redrive")
def redrive(self: Any) -> dict[str, Any]:
    """Beat's backstop for lost messages: a job whose wake-up is long past gets a new `watch_boot`,
    and a submitted job that never started provisioning gets its `provision` again."""
    import time

    from app.ledger import Event
    from app.liveness import record_success

    svc = bootstrap.provisioning()
    blocked = {r.job_id for r in bootstrap.jobs().blocked()}  # they wait on the operator, not on a lost task
    overdue = [j for j in svc.overdue(grace_wall_s=REDRIVE_GRACE_S) if j not in blocked]
    for job_id in overdue:
        watch_boot.apply_async(args=[job_id])
    now = time.time()
    stranded = [
        r.job_id
        for r in bootstrap.jobs().list()
        if r.phase == "queued" and now - r.created_at > REDRIVE_GRACE_S and svc.state(r.job_id) is None
    ]
    for job_id in stranded:
        provision.apply_async(args=[job_id])
    ledger = bootstrap.ledger()
    for job_id, what in [*((j, "watch_boot") for j in overdue), *((j, "provision") for j in stranded)]:
        ledger.append(
            Event(
                kind="job_redriven",
                job=job_id,
                reason=f"no task stepped it for over {REDRIVE_GRACE_S:.0f}s: {what} sent again",
                payload={"task": what},
                idempotency_key=f"redriven:{job_id}:{what}:{int(now // REDRIVE_GRACE_S)}",
            )
        )
    providers = {r.provider for r in svc.rentals.all(states=("intent",))}
    released = svc.rentals.release_stale_intents(
        {p: bootstrap.market(p) for p in sorted(providers)}, now=svc.clock.now(), older_than_s=STALE_INTENT_S
    )
    record_success(svc.engine, "redrive", now)
    return {"watch_boot": overdue, "provision": stranded, "released_intents": released}
