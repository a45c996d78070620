"""The periodic money sweeps: idle watchdog, reaper, reconciler, budget monitor.

Each sweep covers every instance in one pass (batch work per tick, not a task per instance),
is idempotent, and is safe to run twice at once: state changes go through
`Rentals.transition`, so two racing sweeps produce one stop and one ledger event per instance.
Automation stops; it never destroys here. An alert that cannot be delivered never delays a stop:
alerts are recorded in the outbox after the money action. Each instance (each cap, each provider)
is handled on its own: one failure lands in the report's `errors` and the sweep goes on; `run_sweep`
alerts `sweep_failed` when a sweep raised or reported errors.

Every stop names who stopped the host in its ledger event (`stopped_by`, an
`app.policy.supervision.StopReason`), so the supervisor knows a training host we stopped from one
the vendor lost: ours pause the job, theirs are losses.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from sqlalchemy import Engine, select
from sqlmodel import Field, SQLModel

from app.alerts import Alert, Notifier
from app.budget import Budget, BudgetStatus
from app.db import read_connection, write_transaction
from app.ledger import Event
from app.market import Instance, Market, MarketError
from app.policy.guardrails import (
    BUDGET_CHECKPOINT_WAIT_S,
    Adopt,
    Known,
    Listed,
    MarkLost,
    StopOrphan,
    believable_util,
    checkpoint_wait_over,
    idle_verdict,
    past_kill_time,
    reconcile,
)
from app.policy.supervision import StopReason, at_cap
from app.ports import HostShell
from app.rentals import LABEL_PREFIX, Rental, Rentals

__all__ = [
    "OrphanSighting",
    "SweepReport",
    "budget_room",
    "run_sweep",
    "sweep_budgets",
    "sweep_idle",
    "sweep_reconcile",
    "sweep_ttl",
]

JobPhaseOf = Callable[[str], "str | None"]
SshUtil = Callable[[str, Instance], "float | None"]  # (the job whose key opens the host, instance)
StepAdvancedAt = Callable[[Rental], "float | None"]  # when the trainer's step last went up (None: unknown)
HeldUntil = Callable[[Rental], "float | None"]  # a held verified host's hold_until (None: not held)

NVIDIA_SMI = "nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits"


def gpu_util_over_ssh(shell: HostShell, *, timeout_s: float = 15.0) -> float | None:
    """The busiest GPU's utilisation from `nvidia-smi` on the host; None when it cannot be read."""
    try:
        result = shell.run(NVIDIA_SMI, timeout_s=timeout_s)
    except Exception:  # unreachable, timed out: the vendor's figure stands alone
        return None
    if result.exit_code != 0:
        return None
    values = []
    for line in result.stdout.splitlines():
        try:
            values.append(float(line.strip()))
        except ValueError:
            continue
    return max(values) if values else None


class OrphanSighting(SQLModel, table=True):
    """When a sweep first saw a labelled instance unknown to the registry."""

    __tablename__ = "orphan_sightings"

    provider: str = Field(primary_key=True)
    instance_id: str = Field(primary_key=True)
    first_seen_at: float


_SIGHT = OrphanSighting.__table__  # type: ignore[attr-defined]


@dataclass
class SweepReport:
    name: str
    examined: int = 0
    stopped: list[str] = field(default_factory=list)
    adopted: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _alert(notifier: Notifier | None, alert: Alert) -> None:
    if notifier is None:
        return
    try:
        notifier.notify(alert)
    except Exception:  # an alert must never break a sweep
        pass


def run_sweep(name: str, sweep: Callable[[], SweepReport], *, notifier: Notifier | None, now: float) -> SweepReport:
    """Run one sweep and alert (`sweep_failed`, once per sweep and hour) when it raised or reported
    errors: a sweep that fails every tick must not fail silently. A raised error is re-raised."""
    try:
        report = sweep()
    except Exception as exc:
        _alert(notifier, _sweep_failed(name, f"failed: {type(exc).__name__}: {exc}", now=now))
        raise
    if report.errors:
        more = f" (and {len(report.errors) - 1} more)" if len(report.errors) > 1 else ""
        _alert(notifier, _sweep_failed(name, f"{report.errors[0]}{more}", now=now))
    return report


def _sweep_failed(name: str, what: str, *, now: float) -> Alert:
    return Alert("sweep_failed", f"{name}: {what}", key=f"sweep_failed:{name}:{int(now // 3600)}")


def sweep_idle(
    rentals: Rentals,
    markets: Mapping[str, Market],
    *,
    now: float,
    notifier: Notifier | None = None,
    grace_s: float = 1800.0,
    job_phase: JobPhaseOf | None = None,
    ssh_util: SshUtil | None = None,
    held_until: HeldUntil | None = None,
    step_advanced_at: StepAdvancedAt | None = None,
) -> SweepReport:
    """Stop every running instance whose GPU has been idle longer than the grace period.

    Utilisation is the vendor's figure and, where the host answers over SSH, `nvidia-smi`'s; the
    busier of the two counts (a vendor's stale zero must not stop a training GPU); a figure
    outside [0, 100] or NaN is unknown. Utilisation is the host's word, though: where the trainer's
    step progress is known (`step_advanced_at`), a step that stood still for the grace period makes
    the host idle whatever utilisation it prints. Each instance is judged on its own: one that
    fails (a vendor error on its stop) is reported in `errors` and the others go on.

    A held verified host (`held_until`) is idle on purpose until its hold ends: it is left alone
    (its idle spell does not start) until then; after that the hold sweep releases it, and this
    watchdog counts its idleness again like any other host's.
    """
    report = SweepReport("idle_watchdog")
    for r in rentals.all(states=("active",)):
        market = markets.get(r.provider)
        if market is None or r.instance_id is None:
            continue
        report.examined += 1
        try:
            _idle_one(
                rentals,
                market,
                r,
                report,
                now=now,
                notifier=notifier,
                grace_s=grace_s,
                job_phase=job_phase,
                ssh_util=ssh_util,
                held_until=held_until,
                step_advanced_at=step_advanced_at,
            )
        except Exception as exc:  # one instance's failure never stops the sweep over the others
            report.errors.append(_error(r.instance_id, exc))
    return report


def _error(what: str | None, exc: BaseException) -> str:
    return f"{what}: {type(exc).__name__}: {exc}"


def _idle_one(
    rentals: Rentals,
    market: Market,
    r: Rental,
    report: SweepReport,
    *,
    now: float,
    notifier: Notifier | None,
    grace_s: float,
    job_phase: JobPhaseOf | None,
    ssh_util: SshUtil | None,
    held_until: HeldUntil | None,
    step_advanced_at: StepAdvancedAt | None,
) -> None:
    until = held_until(r) if held_until is not None else None
    if until is not None and now < until:
        if r.idle_since is not None:
            rentals.note_utilisation(r.id, gpu_util=r.last_gpu_util, idle_since=None)
        return
    assert r.instance_id is not None
    inst = market.status(r.instance_id)
    if inst.state != "running":
        return
    phase = job_phase(r.job) if job_phase else None
    # The host carries the key of the job it was launched for, also after a handover to another job.
    readings = (inst.gpu_util, ssh_util(r.opened_by, inst) if ssh_util else None)
    samples = [u for u in map(believable_util, readings) if u is not None]
    util = max(samples) if samples else None
    verdict = idle_verdict(
        gpu_util_pct=util,
        job_phase=phase,
        idle_since=r.idle_since,
        now=now,
        grace_s=grace_s,
        step_advanced_at=step_advanced_at(r) if step_advanced_at is not None else None,
    )
    rentals.note_utilisation(r.id, gpu_util=util, idle_since=verdict.idle_since)
    if not verdict.stop:
        return
    if rentals.stop(
        r.id,
        market=market,
        reason="idle",
        kind="instance_stopped",
        now=now,
        evidence={"watchdog": "idle", "evidence": verdict.evidence, "stopped_by": StopReason.IDLE.value},
    ):
        report.stopped.append(r.instance_id)
        _alert(
            notifier,
            Alert(
                "idle_stopped",
                f"stopped idle instance {r.instance_id}: {verdict.evidence}",
                job=r.job,
                key=f"idle_stopped:{r.id}:{int(now)}",
            ),
        )


def sweep_ttl(
    rentals: Rentals,
    markets: Mapping[str, Market],
    *,
    now: float,
    notifier: Notifier | None = None,
) -> SweepReport:
    """Stop every instance past its kill-time (registry rows, and labelled instances we list)."""
    report = SweepReport("reaper")
    for r in rentals.all(states=("active",)):
        market = markets.get(r.provider)
        if market is None or r.instance_id is None:
            continue
        report.examined += 1
        if not past_kill_time(kill_at=r.kill_at, now=now):
            continue
        try:
            moved = rentals.stop(
                r.id,
                market=market,
                reason="ttl",
                kind="instance_stopped",
                now=now,
                evidence={"watchdog": "ttl", "kill_at": r.kill_at, "stopped_by": StopReason.KILL_TIME.value},
            )
        except Exception as exc:  # one instance's failure never stops the sweep over the others
            report.errors.append(_error(r.instance_id, exc))
            continue
        if moved:
            report.stopped.append(r.instance_id)
            _alert(
                notifier,
                Alert(
                    "ttl_stopped", f"stopped {r.instance_id}: past its kill-time", job=r.job, key=f"ttl_stopped:{r.id}"
                ),
            )
    return report


def _first_seen(engine: Engine, provider: str, instance_id: str, now: float) -> float:
    with write_transaction(engine, lock=f"tuneharness.sighting.{provider}") as conn:
        row = conn.execute(
            select(_SIGHT.c.first_seen_at).where(_SIGHT.c.provider == provider, _SIGHT.c.instance_id == instance_id)
        ).first()
        if row is not None:
            return float(row.first_seen_at)
        conn.execute(_SIGHT.insert().values(provider=provider, instance_id=instance_id, first_seen_at=now))
        return now


def sweep_reconcile(
    rentals: Rentals,
    markets: Mapping[str, Market],
    *,
    now: float,
    orphan_grace_s: float,
    notifier: Notifier | None = None,
) -> SweepReport:
    """Join every provider's labelled instances with the registry: adopt, stop orphans, mark lost.

    The registry is read before the listing, and a rental accepted at or after `now` (when this
    sweep began) is left out: a create recorded while the listing is taken is never mistaken for
    a lost host. A listing that failed or is incomplete decides nothing. Each provider and each
    action is isolated: one failure is reported and the others go on.
    """
    report = SweepReport("reconciler")
    for provider, market in sorted(markets.items()):
        try:
            _reconcile_provider(
                rentals, provider, market, report, now=now, orphan_grace_s=orphan_grace_s, notifier=notifier
            )
        except Exception as exc:  # one provider's failure never stops the others
            report.errors.append(_error(provider, exc))
    return report


def _reconcile_provider(
    rentals: Rentals,
    provider: str,
    market: Market,
    report: SweepReport,
    *,
    now: float,
    orphan_grace_s: float,
    notifier: Notifier | None,
) -> None:
    # The registry first: whatever is accepted after this read is not judged by this listing.
    known = [
        Known(r.id, r.label, r.instance_id, r.state, r.created_at)
        for r in rentals.all(states=("intent", "active", "stopped"))
        if r.provider == provider and (r.accepted_at is None or r.accepted_at < now)
    ]
    try:
        listing = market.list_instances(LABEL_PREFIX)
        complete = True
    except MarketError as exc:
        report.errors.append(f"{provider}: listing failed, nothing stopped: {exc}")
        listing, complete = [], False
    listed = [
        Listed(i.instance_id, i.label, i.state, i.started_at, _first_seen(rentals.engine, provider, i.instance_id, now))
        for i in listing
    ]
    report.examined += len(listed)
    for action in reconcile(
        known=known, listed=listed, listing_complete=complete, now=now, orphan_grace_s=orphan_grace_s
    ):
        try:
            _apply_reconcile(rentals, provider, market, action, report, now=now, notifier=notifier)
        except Exception as exc:  # one instance's failure never stops the others
            report.errors.append(_error(action.instance_id, exc))


def _apply_reconcile(
    rentals: Rentals,
    provider: str,
    market: Market,
    action: Adopt | StopOrphan | MarkLost,
    report: SweepReport,
    *,
    now: float,
    notifier: Notifier | None,
) -> None:
    if isinstance(action, Adopt):
        # A create crashed after the provider accepted it: record the instance, then stop it,
        # since nothing is driving it (the job restarts it when it resumes). If its own create
        # recorded it meanwhile, it is a healthy host: leave it alone.
        if not rentals.adopt(action.rental_id, action.instance_id, now=now):
            return
        report.adopted.append(action.instance_id)
        if rentals.stop(
            action.rental_id,
            market=market,
            reason="crashed create",
            kind="instance_stopped",
            now=now,
            evidence={"evidence": action.evidence, "stopped_by": StopReason.RECONCILER.value},
        ):
            report.stopped.append(action.instance_id)
    elif isinstance(action, StopOrphan):
        if rentals.by_instance(provider, action.instance_id) is not None:
            return  # recorded since the registry was read: not an orphan
        market.stop(action.instance_id)
        rentals.ledger.append(_orphan_event(provider, action, now))
        report.stopped.append(action.instance_id)
        _alert(
            notifier,
            Alert(
                "orphan_stopped",
                f"stopped orphan {action.instance_id} ({action.label})",
                key=f"orphan_stopped:{provider}:{action.instance_id}",
            ),
        )
    else:
        r = rentals.get(action.rental_id)
        if r is not None and rentals.transition(
            action.rental_id,
            to="lost",
            from_states=("active", "stopped"),
            kind="instance_lost",
            reason="provider no longer lists it",
            now=now,
            evidence={"evidence": action.evidence},
        ):
            report.lost.append(action.instance_id)
            rentals.settle(action.rental_id, now=now, reason="instance lost: billing ended")


def _orphan_event(provider: str, action: StopOrphan, now: float):  # type: ignore[no-untyped-def]
    from app.ledger import Event

    return Event(
        kind="instance_stopped",
        instance=action.instance_id,
        provider=provider,
        reason="orphan",
        payload={"label": action.label, "evidence": action.evidence, "stopped_by": StopReason.RECONCILER.value},
        idempotency_key=f"orphan_stopped:{provider}:{action.instance_id}",
    )


def _burn_per_s(r: Rental, *, unit: str) -> float:
    """What one rental adds to a cap every second from now on: GPU minutes, or dollars (GPU while
    running, storage while stopped or running)."""
    if unit == "gpu_minutes":
        return 1.0 / 60.0 if r.billing_gpu else 0.0
    storage = (r.storage_per_gb_month or 0.0) * r.disk_gb / 720.0 / 3600.0
    return storage + ((r.rate_usd_per_hour or 0.0) / 3600.0 if r.billing_gpu else 0.0)


@dataclass(frozen=True)
class _Billed:
    """What the live rentals have billed so far, read for all of them at once (three queries, not
    three per rental): since when each bills its current job, and its dollars up to `now`."""

    since: Mapping[str, float]
    usd: Mapping[str, float]

    @classmethod
    def read(cls, rentals: Rentals, live: list[Rental], *, now: float) -> _Billed:
        since = rentals.billed_from_many(live)
        return cls(since, rentals.spent_usd_many(live, now=now, billed_from=since))


def _spend(billed: _Billed | None, mine: list[Rental], *, unit: str, spent_usd: float, now: float) -> float:
    """What a cap has spent: settled reservations plus what its live rentals have billed so far."""
    if billed is None:
        return spent_usd
    if unit == "gpu_minutes":
        return spent_usd + sum(max(0.0, (r.stopped_at or now) - billed.since[r.id]) / 60.0 for r in mine)
    return spent_usd + sum(billed.usd[r.id] for r in mine)


def budget_room(budget: Budget, rentals: Rentals, rental: Rental, *, now: float) -> bool:
    """Has every cap over this (stopped) rental room for it running again? The same level the budget
    monitor stops at (`budget_verdict`), counted as if the host were billing its GPU again."""
    from app.policy.fleet import budget_verdict
    from app.policy.provisioning import guarded_config

    cfg = guarded_config()
    ours = set(rentals.reservations_of(rental.id))
    names = budget.caps_of(ours)
    if not names:
        return True
    held_by = budget.held_by(names)
    held_any = set().union(*held_by.values())
    live = rentals.billing(holding=held_any) if held_any else []
    reserved = {k: set(v) for k, v in rentals.reservations_of_many([r.id for r in live]).items()}
    billed: _Billed | None = None
    running = replace(rental, state="active")
    for s in budget.status(names):
        held = held_by.get(s.name, set())
        if not held & ours:
            continue
        mine = [r for r in live if held & reserved[r.id]]
        billed = billed or _Billed.read(rentals, live, now=now)
        spent = _spend(billed, mine, unit=s.unit, spent_usd=s.spent_usd, now=now)
        burn = sum(_burn_per_s(running if r.id == rental.id else r, unit=s.unit) for r in mine)
        if budget_verdict(spent_usd=spent, burn_usd_per_s=burn, cap_usd=s.cap_usd, cfg=cfg) == "stop":
            return False
    return True


@dataclass(frozen=True)
class _CapsOfJob:
    """One job's caps and the billing rentals they count: its own, and any other holding a
    reservation under one of those caps (a cap shared by several jobs)."""

    live: list[Rental]
    reserved: dict[str, set[str]]  # each live rental's reservations
    names: set[str]  # the caps the job's own live rentals reserve against
    held_by: dict[str, set[str]]  # each of those caps' held reservations


def _caps_of_job(budget: Budget, rentals: Rentals, job: str) -> _CapsOfJob:
    own = rentals.billing(job=job)
    reserved = {k: set(v) for k, v in rentals.reservations_of_many([r.id for r in own]).items()}
    names = budget.caps_of({rid for r in own for rid in reserved[r.id]})
    held_by = budget.held_by(names) if names else {}
    held = set().union(*held_by.values())
    if not held:
        return _CapsOfJob(own, reserved, names, held_by)
    mine = {r.id for r in own}
    others = [r for r in rentals.billing(holding=held) if r.id not in mine]
    if others:
        reserved.update({k: set(v) for k, v in rentals.reservations_of_many([r.id for r in others]).items()})
    return _CapsOfJob(own + others, reserved, names, held_by)


def sweep_budgets(
    budget: Budget,
    *,
    notifier: Notifier | None = None,
    rentals: Rentals | None = None,
    markets: Mapping[str, Market] | None = None,
    now: float | None = None,
    checkpoint_safe: Callable[[str], bool] | None = None,
    end_job: Callable[[str, str, str], bool] | None = None,
    job_phase: JobPhaseOf | None = None,
    checkpoint_wait_s: float = BUDGET_CHECKPOINT_WAIT_S,
    only_job: str | None = None,
) -> SweepReport:
    """Spend against every cap: warn at 80%, and at the cap end what spends under it.

    With `only_job`, a job's own monitor chain holds its caps (`SupervisorService.guard_budget`):
    only the caps its live rentals reserve against are read, each cap's level still counts every
    rental under it, and only that job's rentals are stopped. The budget monitor is a beat task;
    this keeps the caps when beat is paused or gone.

    The level is the fleet policy's (`app.policy.fleet.budget_verdict`): what was billed plus
    what still bills for `budget_guard_s`, so the stop comes before the next sweep could overspend.
    At the cap, each job spending under it is ended through the provisioning policy (`end_job`:
    its host stopped, or destroyed if it never held work; its standby jobs too; nothing new rented;
    the job fails naming the cap); a rental with no provisioning job behind it (a finished job's
    held host) is stopped directly. A job whose host holds its work is ended only once its latest
    checkpoint is safe (pulled off the host); until then the stop waits for the next sweep, but
    at most `checkpoint_wait_s` from the first sweep that waited (`budget_stop_waiting` in the
    ledger): then the host is stopped anyway, its stop event naming the expired wait, since a
    host's own reports can keep its checkpoint unsafe forever.

    A training job's host that holds its work (`job_phase` says training) is not ended but paused
    (`app.policy.supervision.at_cap`): the host is stopped with `stopped_by=budget`, and the job's
    supervisor pauses the job until the cap has room again, then restarts the host and goes on.

    Spend is what was billed: settled reservations plus what live rentals have billed so far
    (GPU while running, storage while stopped), not what is merely reserved. A create whose answer
    was lost counts as billing from its create, since the vendor may be running it unseen; at the
    cap it is looked for by its label, adopted and destroyed (it never held work). New creates are
    refused by the reservation itself, naming the cap.
    """
    import time as _time

    from app.policy.fleet import budget_verdict
    from app.policy.provisioning import guarded_config

    cfg = guarded_config()
    report = SweepReport("budget_monitor")
    now = _time.time() if now is None else now
    live: list[Rental] = []
    reserved: dict[str, set[str]] = {}
    names: set[str] | None = None
    held_by: dict[str, set[str]] | None = None
    if only_job is not None:
        if rentals is None:
            return report
        # One job's caps: only the rentals that can count under them, never the whole fleet (a job's
        # monitor asks at every poll, so a read of every rental here grows with the fleet squared).
        scope = _caps_of_job(budget, rentals, only_job)
        if not scope.names:
            return report
        live, reserved, names, held_by = scope.live, scope.reserved, scope.names, scope.held_by
    elif rentals is not None:
        live = rentals.billing()
        # Every live rental's reservations in one query, not one per rental nor per cap (caps x live).
        reserved = {k: set(v) for k, v in rentals.reservations_of_many([r.id for r in live]).items()}
    if rentals is not None and markets is not None:
        _end_unconfirmed_creates(budget, rentals, markets, live, report, only_job=only_job, now=now)
    # Each cap's level and holdings read for all caps at once, and each live rental's bill once per
    # pass: a constant number of queries whatever the number of caps and rentals.
    statuses = budget.status(names)
    if held_by is None:
        held_by = budget.held_of(statuses) if statuses else {}
    billed = _Billed.read(rentals, live, now=now) if rentals is not None else None
    for s in statuses:
        try:
            report.examined += 1
            held = held_by.get(s.name, set())
            mine = [r for r in live if held & reserved[r.id]]
            spent = _spend(billed, mine, unit=s.unit, spent_usd=s.spent_usd, now=now)
            burn = sum(_burn_per_s(r, unit=s.unit) for r in mine)
            level = budget_verdict(spent_usd=spent, burn_usd_per_s=burn, cap_usd=s.cap_usd, cfg=cfg)
            if level == "ok":
                continue
            report.warnings.append(f"{s.name}:{level}")
            kind = "budget_warning" if level == "warning" else "budget_stop"
            unit = "GPU min" if s.unit == "gpu_minutes" else "$"
            _alert(
                notifier,
                Alert(
                    kind,
                    f"budget {s.name}: {spent:.2f} of {s.cap_usd:.2f} {unit} spent",
                    key=f"{kind}:{s.name}:{s.cap_usd}:{int(now // 86400)}",
                ),
            )
            if level != "stop" or rentals is None or markets is None:
                continue
            ended: set[str] = set()
            for r in mine if only_job is None else [r for r in mine if r.job == only_job]:
                try:
                    _stop_at_cap(
                        rentals,
                        markets,
                        r,
                        mine,
                        s,
                        report,
                        ended,
                        spent=spent,
                        now=now,
                        checkpoint_safe=checkpoint_safe,
                        end_job=end_job,
                        job_phase=job_phase,
                        checkpoint_wait_s=checkpoint_wait_s,
                    )
                except Exception as exc:  # one instance's failure never stops the others
                    report.errors.append(_error(r.instance_id, exc))
        except Exception as exc:  # one cap's failure never stops the sweep over the others
            report.errors.append(_error(s.name, exc))
    return report


def _stop_at_cap(
    rentals: Rentals,
    markets: Mapping[str, Market],
    r: Rental,
    mine: list[Rental],
    s: BudgetStatus,
    report: SweepReport,
    ended: set[str],
    *,
    spent: float,
    now: float,
    checkpoint_safe: Callable[[str], bool] | None,
    end_job: Callable[[str, str, str], bool] | None,
    job_phase: JobPhaseOf | None,
    checkpoint_wait_s: float,
) -> None:
    market = markets.get(r.provider)
    if market is not None and r.state == "intent":
        found: dict[str, object] = {"budget": s.name, "spent": round(spent, 6), "cap": s.cap_usd}
        return _end_unconfirmed(rentals, market, r, report, why=s.name, evidence=found, now=now)
    if market is None or r.state != "active" or r.job in ended:
        return
    forced = False
    if r.held_work and checkpoint_safe is not None and not checkpoint_safe(r.job):
        # The wait has a deadline no host value can extend: its start is written once, in the ledger.
        waiting = rentals.ledger.append(
            Event(
                kind="budget_stop_waiting",
                job=r.job,
                instance=r.instance_id,
                provider=r.provider,
                reason=f"budget {s.name} at its cap: the stop waits for the newest checkpoint",
                payload={"budget": s.name, "cap": s.cap_usd, "since": now, "max_wait_s": checkpoint_wait_s},
                idempotency_key=f"budget_stop_waiting:{s.name}:{s.cap_usd}:{r.id}",
            )
        )
        since = float(waiting.payload.get("since", now))
        if not checkpoint_wait_over(waiting_since=since, now=now, max_wait_s=checkpoint_wait_s):
            report.warnings.append(f"{s.name}:stop-waits-for-checkpoint:{r.job}")
            return
        forced = True
        report.warnings.append(f"{s.name}:checkpoint-wait-over:{r.job}")
    cap = f"budget {s.name} (${s.cap_usd:.2f})" if s.unit != "gpu_minutes" else f"budget {s.name}"
    move = at_cap(job_phase=job_phase(r.job) if job_phase else None, held_work=r.held_work)
    if move == "end" and end_job is not None and end_job(r.job, cap, f"{spent:.4f} of {s.cap_usd:.4f} spent"):
        ended.add(r.job)
        report.stopped += [
            x.instance_id
            for x in mine
            if x.job == r.job and x.instance_id and (now_ := rentals.get(x.id)) is not None and now_.state != "active"
        ]
        return
    evidence: dict[str, object] = {
        "budget": s.name,
        "spent": round(spent, 6),
        "cap": s.cap_usd,
        "stopped_by": StopReason.BUDGET.value,
    }
    if forced:
        evidence["checkpoint_wait_over_s"] = checkpoint_wait_s  # stopped without a safe checkpoint
    if rentals.stop(r.id, market=market, reason="budget_stop", kind="instance_stopped", now=now, evidence=evidence):
        report.stopped.append(r.instance_id or "")


def _end_unconfirmed_creates(
    budget: Budget,
    rentals: Rentals,
    markets: Mapping[str, Market],
    live: list[Rental],
    report: SweepReport,
    *,
    only_job: str | None,
    now: float,
) -> None:
    """Each create whose answer was lost is ended before it can bill past its own reservation
    (`app.policy.fleet.unconfirmed_create_verdict`), whatever the level of the caps above it."""
    from app.policy.fleet import unconfirmed_create_verdict
    from app.policy.provisioning import guarded_config

    cfg = guarded_config()
    for r in live:
        market = markets.get(r.provider)
        if r.state != "intent" or market is None or r.reservation_id is None or only_job not in (None, r.job):
            continue
        try:
            reserved = budget.held_usd(r.reservation_id)
            if reserved is None:
                continue
            billed = rentals.spent_usd(r, now=now)
            verdict = unconfirmed_create_verdict(
                billed_usd=billed, burn_usd_per_s=_burn_per_s(r, unit="usd"), reserved_usd=reserved, cfg=cfg
            )
            if verdict == "end":
                seen: dict[str, object] = {"billed": round(billed, 6), "reserved": round(reserved, 6)}
                _end_unconfirmed(rentals, market, r, report, why="reservation", evidence=seen, now=now)
        except Exception as exc:  # one instance's failure never stops the others
            report.errors.append(_error(r.id, exc))


def _end_unconfirmed(
    rentals: Rentals,
    market: Market,
    r: Rental,
    report: SweepReport,
    *,
    why: str,
    evidence: dict[str, object],
    now: float,
) -> None:
    """A create whose answer was lost, at its cap or its reservation: look for its label; what the
    vendor rented is adopted and destroyed (it never held work, so automation may). Not listed:
    nothing to stop yet, the next pass looks again. A failed listing raises, and the sweep reports it."""
    found = [i for i in market.list_instances(r.label) if i.label == r.label and i.state != "gone"]
    if not found:
        report.warnings.append(f"{why}:unconfirmed-create-not-listed:{r.id}")
        return
    if rentals.adopt(r.id, found[0].instance_id, now=now) is None:
        return  # its own create recorded it meanwhile: the next pass ends it like any host under the cap
    evidence = {**evidence, "stopped_by": StopReason.BUDGET.value}
    if rentals.destroy(r.id, market=market, by="automation", reason="budget_stop", now=now, evidence=evidence):
        report.stopped.append(found[0].instance_id)


def known_sightings(engine: Engine) -> dict[tuple[str, str], float]:
    with read_connection(engine) as conn:
        return {(r.provider, r.instance_id): r.first_seen_at for r in conn.execute(select(_SIGHT))}
