"""Receipts: what was spent, on what, and why, from our registry and the ledger.

These are the renter's own estimates from the rates in force at create time (GPU while running,
storage from create to destroy, traffic when a download was recorded); the vendor's invoice is
the final word, and the ledger keeps every rate used.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from app.ledger import Ledger
from app.rentals import Rental, Rentals, Transfer

__all__ = ["Receipt", "RentalCost", "build_receipt"]


@dataclass(frozen=True, slots=True)
class RentalCost:
    rental: str
    job: str
    provider: str
    instance_id: str | None
    machine_id: str | None
    state: str
    end_reason: str
    gpu_usd: float
    storage_usd: float
    traffic_usd: float
    idle_seconds_billed: float
    dead_host: bool  # never held the job's work and was destroyed or lost
    billing_per_hour_now: float

    @property
    def total_usd(self) -> float:
        return self.gpu_usd + self.storage_usd + self.traffic_usd


@dataclass
class Receipt:
    rentals: list[RentalCost] = field(default_factory=list)

    def _sum(self, key: str) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for r in self.rentals:
            out[str(getattr(r, key))] += r.total_usd
        return dict(sorted(out.items()))

    def as_dict(self) -> dict[str, Any]:
        running = [r for r in self.rentals if r.state == "active"]
        stopped = [r for r in self.rentals if r.state == "stopped"]
        return {
            "total_usd": round(sum(r.total_usd for r in self.rentals), 6),
            "gpu_usd": round(sum(r.gpu_usd for r in self.rentals), 6),
            "storage_usd": round(sum(r.storage_usd for r in self.rentals), 6),
            "traffic_usd": round(sum(r.traffic_usd for r in self.rentals), 6),
            "dead_host_cost_usd": round(sum(r.total_usd for r in self.rentals if r.dead_host), 6),
            "dead_hosts": sum(1 for r in self.rentals if r.dead_host),
            "idle_seconds_billed": round(sum(r.idle_seconds_billed for r in self.rentals), 3),
            "by_job": self._sum("job"),
            "by_provider": self._sum("provider"),
            "by_reason": self._sum("end_reason"),
            "running": [r.instance_id for r in running],
            "stopped": [r.instance_id for r in stopped],
            "billing_per_hour_now": round(sum(r.billing_per_hour_now for r in self.rentals), 6),
            "rentals": [{**asdict(r), "total_usd": r.total_usd} for r in self.rentals],
        }


def _cost(
    r: Rental,
    *,
    now: float,
    end_reason: str,
    traffic_usd: float,
    job: str | None = None,
    start: float | None = None,
    until: float | None = None,
    gpu_until: float | None = None,
) -> RentalCost:
    """One job's share of a rental: from `start` (its create, or when it was transferred to that
    job) to `until` (when it was transferred on; None: to its end or now). `gpu_until`: the GPU
    stopped billing then (a share that ends where the stopped host was started again)."""
    start = r.created_at if start is None else start
    last = until is None
    gpu_end = (
        min(until, r.stopped_at or r.ended_at or until) if until is not None else r.stopped_at or r.ended_at or now
    )
    if gpu_until is not None:
        gpu_end = min(gpu_end, gpu_until)
    life_end = min(until, r.ended_at or until) if until is not None else r.ended_at or now
    gpu_usd = (r.rate_usd_per_hour or 0.0) * max(0.0, gpu_end - start) / 3600.0
    storage_per_h = (r.storage_per_gb_month or 0.0) * r.disk_gb / 720.0
    storage_usd = storage_per_h * max(0.0, life_end - start) / 3600.0
    idle = 0.0
    if last and end_reason == "idle" and r.idle_since is not None and r.stopped_at is not None:
        idle = max(0.0, r.stopped_at - max(start, r.idle_since))
    per_hour = 0.0
    if last and r.state == "active":
        per_hour = (r.rate_usd_per_hour or 0.0) + storage_per_h
    elif last and r.state == "stopped":
        per_hour = storage_per_h
    return RentalCost(
        rental=r.id,
        job=job or r.job,
        provider=r.provider,
        instance_id=r.instance_id,
        machine_id=r.machine_id,
        state=r.state if last else "transferred",
        end_reason=end_reason,
        gpu_usd=gpu_usd,
        storage_usd=storage_usd,
        traffic_usd=traffic_usd,
        idle_seconds_billed=idle,
        dead_host=last and not r.held_work and r.state in ("destroyed", "lost"),
        billing_per_hour_now=per_hour,
    )


def _shares(r: Rental, transfers: list[Transfer]) -> list[tuple[str, float, float | None]]:
    """(job, from, until) for each job that held the rental, in order (one entry if never transferred)."""
    if not transfers:
        return [(r.job, r.created_at, None)]
    out: list[tuple[str, float, float | None]] = []
    start = r.created_at
    for t in transfers:
        out.append((t.from_job, start, t.at))
        start = t.at
    out.append((transfers[-1].to_job, start, None))
    return out


def build_receipt(
    rentals: Rentals, ledger: Ledger, *, now: float, since: float = 0.0, job: str | None = None
) -> Receipt:
    """Spend per rental and job, with the reason it stopped or ended (from the ledger). A rental
    transferred to another job (a held host adopted) is split at the transfer: each job pays for
    its own share. A stopped host started again (`Rentals.restart`) is split the same way at the
    restart, its first share billing GPU only until its stop."""
    reasons: dict[str, str] = {}
    traffic: dict[tuple[str, str | None], float] = defaultdict(float)
    restarted: dict[tuple[str, float], float] = {}  # (instance, restart time) -> when it had stopped
    kinds = ["instance_stopped", "instance_destroyed", "instance_lost", "traffic_billed", "instance_started"]
    for e in ledger.rows(kind=kinds):
        if e.instance is None:
            continue
        if e.kind == "instance_started":
            reasons.pop(e.instance, None)  # running again: its last stop no longer says why it ended
            if e.payload.get("stopped_at") is not None and e.payload.get("at") is not None:
                restarted[(e.instance, float(e.payload["at"]))] = float(e.payload["stopped_at"])
        elif e.kind == "traffic_billed":
            traffic[(e.instance, e.job)] += e.amount_usd or 0.0
        else:
            reasons[e.instance] = e.reason or e.kind
    moved: dict[str, list[Transfer]] = defaultdict(list)
    for t in rentals.transfers():
        moved[t.rental_id].append(t)
    out = Receipt()
    for r in rentals.all():
        if (r.ended_at or now) < since:
            continue
        shares = _shares(r, moved.get(r.id, []))
        for i, (who, start, until) in enumerate(shares):
            if job is not None and who != job:
                continue
            gpu_until = None if until is None else restarted.get((r.instance_id or "", until))
            if until is None:
                reason = reasons.get(r.instance_id or "", "running" if r.state == "active" else r.state)
            elif gpu_until is not None:
                reason = "stopped, then started again"
            else:
                reason = f"transferred to {shares[i + 1][0]}"
            out.rentals.append(
                _cost(
                    r,
                    now=now,
                    end_reason=reason,
                    job=who,
                    start=start,
                    until=until,
                    gpu_until=gpu_until,
                    traffic_usd=traffic.get((r.instance_id or "", who), 0.0),
                )
            )
    return out
