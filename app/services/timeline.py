"""`tuneharness jobs show JOB`: one job's timeline on one screen, from the ledger and the rentals.

Reads only. A gated job's training runs are shown with it (each event names its run).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from app.errors import UserError
from app.jobs import JobStore
from app.ledger import Ledger
from app.rentals import Rentals
from app.services.receipts import build_receipt

__all__ = ["FAILURE_KINDS", "PHASE_KINDS", "job_timeline"]

# what moved the job from one phase to the next
PHASE_KINDS = (
    "job_submitted",
    "provisioning_started",
    "training_handed_over",
    "job_paused",
    "job_resumed",
    "job_cancelled",
    "job_resumed_by_operator",
    "provisioning_failed",
    "adapter_pulled",
    "task_poisoned",
    "job_blocked",
)
# a host or a trainer that failed, with the evidence the ledger kept
FAILURE_KINDS = ("host_failed", "host_lost", "trainer_died", "instance_lost")


def _evidence(payload: dict[str, Any]) -> str:
    """What the host or the trainer showed (a preflight's error, triage's log lines)."""
    value = payload.get("evidence")
    if isinstance(value, list):
        return "; ".join(map(str, value))[:300]
    return str(value or "")[:300]


def job_timeline(job_id: str, *, jobs: JobStore, ledger: Ledger, rentals: Rentals, now: float) -> dict[str, Any]:
    """The job's phases, hosts, failures (with evidence), recoveries, slices and money by cause."""
    rec = jobs.get(job_id)
    if rec is None:
        raise UserError(f"no job {job_id!r}. Fix: pick an id from `tuneharness jobs`")
    runs = [r for r in jobs.runs(job_id).values() if r is not None]
    ids = [job_id, *(r.job_id for r in runs)]
    rows = sorted((row for jid in ids for row in ledger.rows(job=jid)), key=lambda r: r.seq)
    phases, failures, recoveries = [], [], []
    slices: dict[str, int] = defaultdict(int)
    for r in rows:
        base = {"seq": r.seq, "at": r.at, "kind": r.kind, "run": r.job, "instance": r.instance, "machine": r.machine}
        if r.kind in PHASE_KINDS:
            phases.append({**base, "reason": r.reason})
        elif r.kind in FAILURE_KINDS:
            p = dict(r.payload)
            cause = p.get("cause") or p.get("triage_state")
            failures.append({**base, "reason": r.reason, "cause": cause, "evidence": _evidence(p)})
        elif r.kind == "recovery":
            p = dict(r.payload)
            recoveries.append(
                {
                    **base,
                    "cause": p.get("cause"),
                    "lost_machine": p.get("lost_machine"),
                    "recovery_s": p.get("recovery_s"),
                    "resume_step": p.get("resume_step"),
                    "lost_steps": p.get("lost_steps"),
                }
            )
        elif r.kind == "training_started":
            slices[str(r.instance)] += 1
    hosts = [
        {
            "run": h.job,
            "instance": h.instance_id,
            "machine": h.machine_id,
            "provider": h.provider,
            "state": h.state,
            "usd_per_hour": h.rate_usd_per_hour,
            "held_work": h.held_work,
            "slices": slices.get(str(h.instance_id), 0),
        }
        for jid in ids
        for h in rentals.all(job=jid)
        if h.instance_id is not None
    ]
    money: dict[str, float] = defaultdict(float)
    for c in build_receipt(rentals, ledger, now=now).rentals:
        if c.job in ids:
            money["dead hosts" if c.dead_host else c.end_reason] += c.total_usd
    return {
        "job": rec.to_dict(),
        "runs": [r.to_dict() for r in runs],
        "phases": phases,
        "hosts": hosts,
        "failures": failures,
        "recoveries": recoveries,
        "slices": sum(slices.values()),
        "money_by_cause_usd": {k: round(v, 6) for k, v in sorted(money.items())},
        "total_usd": round(sum(money.values()), 6),
    }
