"""Beat's money sweeps as Celery tasks: thin shells over app.services.guardrails.

Each records its last success (beat liveness) and never takes more than one pass per tick.
"""

from __future__ import annotations

import os
import time
from typing import Any

from app import bootstrap
from app.liveness import BUDGET_MONITOR_CLEAN, record_success
from app.market import Market
from app.policy.guardrails import BUDGET_CHECKPOINT_WAIT_S, IDLE_GRACE_S
from app.rentals import Rentals
from app.services import guardrails
from app.settings import seconds_setting
from workers.tasks import task

# The longest create latency we allow a provider (the create call's own timeout); the reconciler
# waits twice this before it stops a labelled instance the registry does not know.
LONGEST_CREATE_LATENCY_S = 120.0


def longest_create_latency_s() -> float:
    return seconds_setting("TUNEHARNESS_CREATE_LATENCY_S", LONGEST_CREATE_LATENCY_S)


def idle_grace_s() -> float:
    return seconds_setting("TUNEHARNESS_IDLE_GRACE_S", IDLE_GRACE_S)


def budget_checkpoint_wait_s() -> float:
    return seconds_setting("TUNEHARNESS_BUDGET_CHECKPOINT_WAIT_S", BUDGET_CHECKPOINT_WAIT_S)


def _markets(rentals: Rentals) -> dict[str, Market]:
    names = {r.provider for r in rentals.all(states=("intent", "active", "stopped"))}
    names |= {n for n in os.environ.get("TUNEHARNESS_PROVIDERS", "").split(",") if n}
    return {n: bootstrap.market(n) for n in sorted(names)}


def _rentals() -> Rentals:
    return Rentals(bootstrap.engine())


def _job_phase(job_id: str) -> str | None:
    record = bootstrap.jobs().get(job_id)
    return None if record is None else record.phase


def _ssh_util(key_job: str, inst: Any) -> float | None:
    """nvidia-smi over SSH with `key_job`'s key (the job the host was launched for), where the host
    answers; None otherwise."""
    if inst.ssh is None:
        return None
    try:
        shell = bootstrap.host_shell(inst, key_job)
    except Exception:
        return None
    try:
        return guardrails.gpu_util_over_ssh(shell)
    finally:
        shell.close()


def _summary(report: guardrails.SweepReport) -> dict[str, Any]:
    return {
        "examined": report.examined,
        "stopped": report.stopped,
        "adopted": report.adopted,
        "lost": report.lost,
        "errors": report.errors,
        "warnings": report.warnings,
    }


@task("maintenance", "idle_watchdog")
def idle_watchdog(self: Any) -> dict[str, Any]:
    """Stop instances idle past the grace period (never destroy)."""
    from app.services.pool import Pool
    from app.services.supervisor import step_advanced_at

    rentals = _rentals()
    held = Pool(rentals.engine).held_until()
    now, notifier = time.time(), bootstrap.notifier()
    report = guardrails.run_sweep(
        "idle_watchdog",
        lambda: guardrails.sweep_idle(
            rentals,
            _markets(rentals),
            now=now,
            notifier=notifier,
            grace_s=idle_grace_s(),
            job_phase=_job_phase,
            ssh_util=_ssh_util,
            held_until=lambda r: held.get((r.provider, r.instance_id or "")),
            step_advanced_at=lambda r: step_advanced_at(rentals.engine, r.job, r.instance_id or ""),
        ),
        notifier=notifier,
        now=now,
    )
    record_success(rentals.engine, "idle-watchdog", time.time())
    return _summary(report)


@task("maintenance", "reaper")
def reaper(self: Any) -> dict[str, Any]:
    """Stop instances past their kill-time."""
    rentals = _rentals()
    now, notifier = time.time(), bootstrap.notifier()
    report = guardrails.run_sweep(
        "reaper",
        lambda: guardrails.sweep_ttl(rentals, _markets(rentals), now=now, notifier=notifier),
        notifier=notifier,
        now=now,
    )
    record_success(rentals.engine, "reaper", time.time())
    return _summary(report)


@task("maintenance", "reconcile")
def reconcile(self: Any) -> dict[str, Any]:
    """Join provider listings with the registry: adopt, stop orphans, mark lost."""
    rentals = _rentals()
    now, notifier = time.time(), bootstrap.notifier()
    report = guardrails.run_sweep(
        "reconciler",
        lambda: guardrails.sweep_reconcile(
            rentals, _markets(rentals), now=now, orphan_grace_s=2 * longest_create_latency_s(), notifier=notifier
        ),
        notifier=notifier,
        now=now,
    )
    record_success(rentals.engine, "reconciler", time.time())
    return _summary(report)


@task("maintenance", "answer_price_increases")
def answer_price_increases(self: Any) -> dict[str, Any]:
    """Accept or reject every pending host price increase on our instances (against the job's max price)."""
    from app.services.price_increases import max_price_from, sweep_price_increases

    rentals = _rentals()
    report = sweep_price_increases(
        rentals, _markets(rentals), max_price_of=max_price_from(bootstrap.jobs()), notifier=bootstrap.notifier()
    )
    record_success(rentals.engine, "price-increases", time.time())
    return {
        "examined": report.examined,
        "accepted": report.accepted,
        "rejected": report.rejected,
        "stale": report.stale,
        "not_ours": report.not_ours,
        "errors": report.errors,
    }


@task("maintenance", "budget_monitor")
def budget_monitor(self: Any) -> dict[str, Any]:
    """Warn at 80% of a cap's spend; at the cap, pause the training jobs spending under it (their hosts
    stopped) and end the others (through the policy)."""
    from app.services.provisioning import Step
    from app.services.supervisor import checkpoint_safe
    from workers.provisioning import schedule

    rentals = _rentals()
    ended: list[Step] = []

    def end_job(job_id: str, cap: str, evidence: str) -> bool:
        steps = bootstrap.provisioning().end_at_cap(job_id, cap=cap, evidence=evidence)
        ended.extend(steps)
        return bool(steps)

    now, notifier = time.time(), bootstrap.notifier()
    report = guardrails.run_sweep(
        "budget_monitor",
        lambda: guardrails.sweep_budgets(
            rentals.budget,
            notifier=notifier,
            rentals=rentals,
            markets=_markets(rentals),
            now=now,
            checkpoint_safe=lambda job: checkpoint_safe(rentals.engine, job),
            end_job=end_job,
            job_phase=_job_phase,  # a training job's host is paused at the cap, not ended
            checkpoint_wait_s=budget_checkpoint_wait_s(),
        ),
        notifier=notifier,
        now=now,
    )
    for step in ended:
        schedule(step)
    record_success(bootstrap.engine(), "budget-monitor", time.time())
    if not report.errors:
        record_success(bootstrap.engine(), BUDGET_MONITOR_CLEAN, now)
    return _summary(report)
