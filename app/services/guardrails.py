"""The periodic money sweeps: idle watchdog, reaper, reconciler, budget monitor.

Each sweep covers every instance in one pass (batch work per tick, not a task per instance),
is idempotent, and is safe to run twice at once: state changes go through
`Rentals.transition`, so two racing sweeps produce one stop and one ledger event per instance.
Automation stops; it never destroys here. An alert that cannot be delivered never delays a stop:
alerts are recorded in the outbox after the money action.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from sqlalchemy import Engine, select
from sqlmodel import Field, SQLModel

from app.alerts import Alert, Notifier
from app.budget import Budget
from app.db import read_connection, write_transaction
from app.market import Instance, Market, MarketError
from app.policy.guardrails import (
    Adopt,
    Known,
    Listed,
    MarkLost,
    StopOrphan,
    idle_verdict,
    past_kill_time,
    reconcile,
)
from app.ports import HostShell
from app.rentals import LABEL_PREFIX, Rental, Rentals

__all__ = ["OrphanSighting", "SweepReport", "sweep_budgets", "sweep_idle", "sweep_reconcile", "sweep_ttl"]

JobPhaseOf = Callable[[str], "str | None"]
SshUtil = Callable[[Rental, Instance], "float | None"]
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
) -> SweepReport:
    """Stop every running instance whose GPU has been idle longer than the grace period.

    Utilisation is the vendor's figure and, where the host answers over SSH, `nvidia-smi`'s; the
    busier of the two counts (a vendor's stale zero must not stop a training GPU).

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
        until = held_until(r) if held_until is not None else None
        if until is not None and now < until:
            if r.idle_since is not None:
                rentals.note_utilisation(r.id, gpu_util=r.last_gpu_util, idle_since=None)
            continue
        try:
            inst = market.status(r.instance_id)
        except MarketError as exc:
            report.errors.append(f"{r.instance_id}: {exc}")
            continue
        if inst.state != "running":
            continue
        phase = job_phase(r.job) if job_phase else None
        samples = [u for u in (inst.gpu_util, ssh_util(r, inst) if ssh_util else None) if u is not None]
        util = max(samples) if samples else None
        verdict = idle_verdict(gpu_util_pct=util, job_phase=phase, idle_since=r.idle_since, now=now, grace_s=grace_s)
        rentals.note_utilisation(r.id, gpu_util=util, idle_since=verdict.idle_since)
        if not verdict.stop:
            continue
        if rentals.stop(
            r.id,
            market=market,
            reason="idle",
            kind="instance_stopped",
            now=now,
            evidence={"watchdog": "idle", "evidence": verdict.evidence},
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
    return report


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
                evidence={"watchdog": "ttl", "kill_at": r.kill_at},
            )
        except MarketError as exc:
            report.errors.append(f"{r.instance_id}: {exc}")
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
    """Join every provider's labelled instances with the registry: adopt, stop orphans, mark lost."""
    report = SweepReport("reconciler")
    for provider, market in sorted(markets.items()):
        try:
            listing = market.list_instances(LABEL_PREFIX)
            complete = True
        except MarketError as exc:
            report.errors.append(f"{provider}: listing failed, nothing stopped: {exc}")
            listing, complete = [], False
        known_rows = rentals.all(states=("intent", "active", "stopped"))
        known = [
            Known(r.id, r.label, r.instance_id, r.state, r.created_at) for r in known_rows if r.provider == provider
        ]
        listed = [
            Listed(
                i.instance_id, i.label, i.state, i.started_at, _first_seen(rentals.engine, provider, i.instance_id, now)
            )
            for i in listing
        ]
        report.examined += len(listed)
        for action in reconcile(
            known=known, listed=listed, listing_complete=complete, now=now, orphan_grace_s=orphan_grace_s
        ):
            if isinstance(action, Adopt):
                # A create crashed after the provider accepted it: record the instance, then
                # stop it, since nothing is driving it (the job restarts it when it resumes).
                rentals.adopt(action.rental_id, action.instance_id, now=now)
                report.adopted.append(action.instance_id)
                try:
                    if rentals.stop(
                        action.rental_id,
                        market=market,
                        reason="crashed create",
                        kind="instance_stopped",
                        now=now,
                        evidence={"evidence": action.evidence},
                    ):
                        report.stopped.append(action.instance_id)
                except MarketError as exc:
                    report.errors.append(f"{action.instance_id}: {exc}")
            elif isinstance(action, StopOrphan):
                try:
                    market.stop(action.instance_id)
                except MarketError as exc:
                    report.errors.append(f"{action.instance_id}: {exc}")
                    continue
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
            elif isinstance(action, MarkLost):
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
    return report


def _orphan_event(provider: str, action: StopOrphan, now: float):  # type: ignore[no-untyped-def]
    from app.ledger import Event

    return Event(
        kind="instance_stopped",
        instance=action.instance_id,
        provider=provider,
        reason="orphan",
        payload={"label": action.label, "evidence": action.evidence},
        idempotency_key=f"orphan_stopped:{provider}:{action.instance_id}",
    )


def _burn_per_s(r: Rental, *, unit: str) -> float:
    """What one rental adds to a cap every second from now on: GPU minutes, or dollars (GPU while
    running, storage while stopped or running)."""
    if unit == "gpu_minutes":
        return 1.0 / 60.0 if r.state == "active" else 0.0
    storage = (r.storage_per_gb_month or 0.0) * r.disk_gb / 720.0 / 3600.0
    return storage + ((r.rate_usd_per_hour or 0.0) / 3600.0 if r.state == "active" else 0.0)


def sweep_budgets(
    budget: Budget,
    *,
    notifier: Notifier | None = None,
    rentals: Rentals | None = None,
    markets: Mapping[str, Market] | None = None,
    now: float | None = None,
    checkpoint_safe: Callable[[str], bool] | None = None,
    end_job: Callable[[str, str, str], bool] | None = None,
) -> SweepReport:
    """Spend against every cap: warn at 80%, and at the cap end what spends under it.

    The level is the fleet policy's (`app.policy.fleet.budget_verdict`): what was billed plus
    what still bills for `budget_guard_s`, so the stop comes before the next sweep could overspend.
    At the cap, each job spending under it is ended through the provisioning policy (`end_job`:
    its host stopped, or destroyed if it never held work; its standby jobs too; nothing new rented;
    the job fails naming the cap); a rental with no provisioning job behind it (a finished job's
    held host) is stopped directly. A job whose host holds its work is ended only once its latest
    checkpoint is safe (pulled off the host); until then the stop waits for the next sweep.

    Spend is what was billed: settled reservations plus what live rentals have billed so far
    (GPU while running, storage while stopped), not what is merely reserved. New creates are
    refused by the reservation itself, naming the cap.
    """
    import time as _time

    from app.policy.fleet import budget_verdict
    from app.policy.provisioning import guarded_config

    cfg = guarded_config()
    report = SweepReport("budget_monitor")
    now = _time.time() if now is None else now
    live = rentals.all(states=("active", "stopped")) if rentals is not None else []
    for s in budget.status():
        report.examined += 1
        held = budget.held(s.name)
        mine = [r for r in live if rentals is not None and held & set(rentals.reservations_of(r.id))]
        if s.unit == "gpu_minutes":
            billed = (
                sum(max(0.0, (r.stopped_at or now) - rentals.billed_from(r)) / 60.0 for r in mine)
                if rentals is not None
                else 0.0
            )
        else:
            billed = sum(rentals.spent_usd(r, now=now) for r in mine) if rentals is not None else 0.0
        spent = s.spent_usd + billed
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
        for r in mine:
            market = markets.get(r.provider)
            if market is None or r.state != "active":
                continue
            if r.held_work and checkpoint_safe is not None and not checkpoint_safe(r.job):
                report.warnings.append(f"{s.name}:stop-waits-for-checkpoint:{r.job}")
                continue
            if r.job in ended:
                continue
            cap = f"budget {s.name} (${s.cap_usd:.2f})" if s.unit != "gpu_minutes" else f"budget {s.name}"
            if end_job is not None and end_job(r.job, cap, f"{spent:.4f} of {s.cap_usd:.4f} spent"):
                ended.add(r.job)
                report.stopped += [
                    x.instance_id
                    for x in mine
                    if x.job == r.job
                    and x.instance_id
                    and (now_ := rentals.get(x.id)) is not None
                    and now_.state != "active"
                ]
                continue
            try:
                if rentals.stop(
                    r.id,
                    market=market,
                    reason="budget_stop",
                    kind="instance_stopped",
                    now=now,
                    evidence={"budget": s.name, "spent": round(spent, 6), "cap": s.cap_usd},
                ):
                    report.stopped.append(r.instance_id or "")
            except MarketError as exc:
                report.errors.append(f"{r.instance_id}: {exc}")
    return report


def known_sightings(engine: Engine) -> dict[tuple[str, str], float]:
    with read_connection(engine) as conn:
        return {(r.provider, r.instance_id): r.first_seen_at for r in conn.execute(select(_SIGHT))}
