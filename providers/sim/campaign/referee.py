"""The campaign's receipt, from the simulated marketplace's own billing and truth.

Nothing here reads what the policy believed: a dead host is a create whose truth never delivers a
verified computing GPU matching its offer, and its cost is what the marketplace billed it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.policy.gpus import same_gpu
from providers.sim.market import SimReferee
from providers.sim.trace import HostTruth

__all__ = ["RECEIPT_FIELDS", "TrainerSpan", "is_dead_host", "p90", "receipt", "referee_receipt"]

RECEIPT_FIELDS = (
    "policy",
    "trace",
    "creates",
    "dead_hosts",
    "dead_host_cost_usd",
    "dead_host_mean_lifetime_s",
    "good_hosts_destroyed",
    "jobs_completed",
    "jobs_failed",
    "total_cost_usd",
    "train_gpu_seconds",
    "idle_gpu_seconds_billed",
    "recoveries",
    "recovery_median_s",
    "recovery_p90_s",
    "budget_usd",
    "budget_exceeded",
    "sim_seconds",
    "standby_hosts",
    "standby_cost_usd",
    "unfinished_jobs",
)


def is_dead_host(truth: HostTruth, *, offered_gpu: str, offered_ram_gb: float, pull_s: float) -> str | None:
    """The referee's rule: why a host never delivers a verified computing GPU matching its offer."""
    if truth.fatal_at_s is not None:
        return "fatal pull"
    if truth.freeze_at_s is not None:
        return "frozen pull"
    if truth.dies_at_s is not None and truth.dies_at_s < pull_s:
        return "vanished during boot"
    if not truth.computes:
        return "cannot compute"
    if not same_gpu(offered_gpu, truth.actual_gpu_name):
        return "wrong GPU"
    if truth.actual_gpu_ram_gb < 0.95 * offered_ram_gb:
        return "VRAM short"
    if truth.tflops_factor < 0.85:
        return "throttled"
    return None


def p90(sorted_values: Sequence[float]) -> float:
    """Nearest-rank 90th percentile."""
    k = max(0, math.ceil(0.9 * len(sorted_values)) - 1)
    return sorted_values[k]


@dataclass(frozen=True, slots=True)
class TrainerSpan:
    """What one trainer on one host did: wall seconds it trained, and seconds it sat assigned to the
    job without advancing (hung, or dead and not yet noticed), both billed."""

    trained_s: float
    idle_s: float


def receipt(
    referee: SimReferee,
    *,
    end: float,
    t0: float,
    policy: str,
    trace: str,
    destroyed_on_failure: Iterable[str],
    trainers: Iterable[TrainerSpan],
    recoveries: Sequence[Mapping[str, Any]],
    finished: int,
    unfinished: Mapping[str, str],
    real_jobs: Sequence[str],
    budget_usd: float | None,
    standby_hosts: int,
    standby_spans: Mapping[str, tuple[float, float | None]],
) -> dict[str, Any]:
    """The receipt's documented fields, in order (RECEIPT_FIELDS)."""
    bills = referee.bills(as_of_s=end)
    destroyed = set(destroyed_on_failure)
    dead_cost = 0.0
    dead_life: list[float] = []
    good_destroyed = 0
    for bill in bills:
        host = referee.host_of(bill.instance_id)
        why = is_dead_host(
            bill.truth,
            offered_gpu=host.offer.gpu_name,
            offered_ram_gb=host.offer.gpu_ram_gb,
            pull_s=referee.pull_seconds(bill.instance_id),
        )
        if why is not None:
            dead_cost += bill.total_usd
            dead_life.append((bill.ended_at if bill.ended_at is not None else end) - bill.created_at)
        elif bill.instance_id in destroyed:
            good_destroyed += 1
    spans = list(trainers)
    rec_s = sorted(float(r["resumed_at_s"]) - float(r["lost_at_s"]) for r in recoveries)
    total = sum(b.total_usd for b in bills)
    standby_usd = 0.0
    for iid, (start, stop) in standby_spans.items():
        standby_usd += referee.bill(iid, as_of_s=end if stop is None else stop).total_usd
        standby_usd -= referee.bill(iid, as_of_s=start).total_usd
    out = {
        "policy": policy,
        "trace": trace,
        "creates": len(bills),
        "dead_hosts": len(dead_life),
        "dead_host_cost_usd": round(dead_cost, 4),
        "dead_host_mean_lifetime_s": round(statistics.fmean(dead_life), 1) if dead_life else 0.0,
        "good_hosts_destroyed": good_destroyed,
        "jobs_completed": finished,
        "jobs_failed": len(unfinished),
        "total_cost_usd": round(total, 4),
        "train_gpu_seconds": round(sum(s.trained_s for s in spans), 1),
        "idle_gpu_seconds_billed": round(sum(s.idle_s for s in spans), 1),
        "recoveries": list(recoveries),
        "recovery_median_s": round(statistics.median(rec_s), 1) if rec_s else None,
        "recovery_p90_s": round(p90(rec_s), 1) if rec_s else None,
        "budget_usd": budget_usd,
        "budget_exceeded": budget_usd is not None and total > budget_usd + 1e-9,
        "sim_seconds": round(end - t0, 1),
        "standby_hosts": standby_hosts,
        "standby_cost_usd": round(standby_usd, 4),
        "unfinished_jobs": [{"job": j, "reason": unfinished[j]} for j in real_jobs if j in unfinished],
    }
    return out


def referee_receipt(referee: SimReferee, facts: Mapping[str, Any]) -> dict[str, Any]:
    """`receipt` from what a real-time control plane reports it did (`sim serve`'s
    POST /v1/referee/receipt): the marketplace's referee prices it, as in the campaign simulator."""
    spans = facts.get("standby_spans") or {}
    return receipt(
        referee,
        end=float(facts["end"]),
        t0=float(facts["t0"]),
        policy=str(facts.get("policy", "guarded")),
        trace=str(facts.get("trace", "")),
        destroyed_on_failure=[str(i) for i in facts.get("destroyed_on_failure", [])],
        trainers=[TrainerSpan(float(t), float(i)) for t, i in facts.get("trainers", [])],
        recoveries=list(facts.get("recoveries", [])),
        finished=int(facts.get("finished", 0)),
        unfinished={str(k): str(v) for k, v in (facts.get("unfinished") or {}).items()},
        real_jobs=[str(j) for j in facts.get("real_jobs", [])],
        budget_usd=None if facts.get("budget_usd") is None else float(facts["budget_usd"]),
        standby_hosts=int(facts.get("standby_hosts", 0)),
        standby_spans={str(k): (float(v[0]), None if v[1] is None else float(v[1])) for k, v in spans.items()},
    )
