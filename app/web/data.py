"""What the web pages show, as plain data, read from the database through the existing readers.

Nothing here writes: the fleet comes from `status_cmd.collect`, money from `build_receipt` and the
budget caps, reliability from the ledger's `host_lost` and `recovery` events, a job from
`job_timeline`, its loss curve from the pulled train.log copies (`joblogs.log_key`) and its gate
decision from the job table. Money figures are our estimates from the rates in force, as in the
receipt; the vendor's invoice is the final word.
"""

from __future__ import annotations

import re
import tempfile
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from app.artifacts import ArtifactError, ArtifactStore
from app.errors import UserError

__all__ = [
    "CAUSES",
    "Source",
    "default_source",
    "fleet",
    "job_page",
    "live",
    "loss_points",
    "money",
    "reliability",
]

# the stacked layers of the spend chart, bottom to top
CAUSES = ("training", "dead hosts", "idle", "storage", "traffic", "standby")
SERIES_POINTS = 60
WINDOWS_DAYS = (7, 30)
_STEP_LINE = re.compile(r"^\S+Z step (.*)$")
_FIELD = re.compile(r'(\w+)=("[^"]*"|\S+)')


@dataclass(frozen=True)
class Source:
    """Where the pages read from: the database, the billing clock, the artifact store (pulled
    train.logs), Flower's address and the beat tasks' intervals (for liveness)."""

    engine: Engine
    now: Callable[[], float]
    store: ArtifactStore | None = None
    flower_url: str = ""
    intervals_s: Mapping[str, float] = field(default_factory=dict)


def default_source() -> Source:
    """The source every command uses: bootstrap's database and artifact store, the provisioning
    clock (the shared simulator's when TUNEHARNESS_SIM_URL is set), the running stack's Flower."""
    import os
    import time

    from app import bootstrap
    from app.artifacts import open_store
    from beat_schedule import BEAT_SCHEDULE

    s = bootstrap.settings()
    stack = bootstrap.running_stack()
    flower = (
        stack.flower_url if stack is not None and stack.flower_url else f"http://{s.flower_address}:{s.flower_port}"
    )

    def now() -> float:
        if os.environ.get("TUNEHARNESS_SIM_URL"):
            try:
                clock = bootstrap.sim_clock()
                if clock is not None:
                    return float(clock.now())
            except Exception:  # the sim server is down: the pages still answer, on the wall clock
                pass
        return time.time()

    try:
        store: ArtifactStore | None = open_store(bootstrap.artifacts_location(s))
    except (ArtifactError, UserError, ImportError):
        store = None
    return Source(
        engine=bootstrap.engine(s),
        now=now,
        store=store,
        flower_url=flower,
        intervals_s={k: float(str(v["schedule"])) for k, v in BEAT_SCHEDULE.items()},
    )


def _ledger_time(at: str) -> float:
    return datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp()


def fleet(src: Source, *, now: float | None = None) -> dict[str, Any]:
    """Jobs, hosts and interruptions (`tuneharness status`), the beat sweeps' liveness and Flower."""
    import time

    from app.cli.status_cmd import collect
    from app.liveness import last_successes, overdue

    data = collect(now=src.now() if now is None else now)
    last = last_successes(src.engine)
    wall = time.time()  # beat records its successes on the wall clock
    late = {o.name for o in overdue(last, src.intervals_s, now=wall)}
    data["liveness"] = [
        {
            "task": t,
            "interval_s": src.intervals_s[t],
            "age_s": None if t not in last else max(0.0, wall - last[t]),
            "overdue": t in late,
        }
        for t in sorted(src.intervals_s)
    ]
    data["flower_url"] = src.flower_url
    return data


def live(src: Source) -> dict[str, Any]:
    """The fields the pages refresh in place: each job's phase, step, loss, ETA and money."""
    data = fleet(src)
    jobs = {
        j["job_id"]: {
            "phase": j["phase"] if not j.get("paused_by") else f"paused ({j['paused_by']})",
            "step": f"{j['step']}/{j['max_steps']}" if j["max_steps"] else str(j["step"]),
            "loss": j["loss"],
            "eta_s": j["eta_s"],
            "spent_usd": j["spent_usd"],
            "usd_per_hour": j["usd_per_hour"],
        }
        for j in data["jobs"]
    }
    return {"now": data["now"], "jobs": jobs}


def _accrued(amount: float, start: float, end: float, t: float) -> float:
    """How much of `amount`, billed evenly from `start` to `end`, has accrued by `t`."""
    if t >= end:
        return amount
    if t <= start:
        return 0.0
    return amount * (t - start) / (end - start)


def money(src: Source) -> dict[str, Any]:
    """Spend over time stacked by cause against each cap, dead-host lifetimes, and the stops the
    guardrails made with what each one avoided billing until the host's kill-time."""
    from app.budget import Budget
    from app.ledger import Ledger
    from app.rentals import Rentals
    from app.services.pool import STANDBY_ATTEMPT_BASE
    from app.services.receipts import build_receipt

    now = src.now()
    rentals, ledger = Rentals(src.engine), Ledger(src.engine)
    receipt = build_receipt(rentals, ledger, now=now)
    by_id = {r.id: r for r in rentals.all()}
    # (cause, amount, from, until): each cost spread evenly over the time it billed
    pieces: list[tuple[str, float, float, float]] = []
    for c in receipt.rentals:
        r = by_id.get(c.rental)
        if r is None:
            continue
        start = r.created_at
        gpu_end = max(start, r.stopped_at or r.ended_at or now)
        life_end = max(start, r.ended_at or now)
        if c.dead_host:
            pieces.append(("dead hosts", c.total_usd, start, life_end))
            continue
        gpu_cause = "standby" if r.attempt > STANDBY_ATTEMPT_BASE else "training"
        idle_usd = min(c.gpu_usd, (r.rate_usd_per_hour or 0.0) * c.idle_seconds_billed / 3600.0)
        pieces.append((gpu_cause, c.gpu_usd - idle_usd, start, gpu_end))
        if idle_usd > 0:
            pieces.append(("idle", idle_usd, gpu_end - c.idle_seconds_billed, gpu_end))
        pieces.append(("storage", c.storage_usd, start, life_end))
        pieces.append(("traffic", c.traffic_usd, gpu_end, gpu_end))
    t0 = min((p[2] for p in pieces), default=now)
    times = [t0 + (now - t0) * i / (SERIES_POINTS - 1) for i in range(SERIES_POINTS)] if now > t0 else [t0, now]
    layers = {
        cause: [sum(_accrued(a, s, e, t) for c, a, s, e in pieces if c == cause) for t in times] for cause in CAUSES
    }
    caps = [
        {"name": b.name, "period": b.period, "unit": b.unit, "cap": b.cap_usd, "spent": b.spent_usd}
        for b in Budget(src.engine).status()
    ]
    dead_lifetimes = [
        max(0.0, (by_id[c.rental].ended_at or now) - by_id[c.rental].created_at)
        for c in receipt.rentals
        if c.dead_host and c.rental in by_id
    ]
    by_instance = {r.instance_id: r for r in by_id.values() if r.instance_id}
    stops: dict[str, dict[str, Any]] = defaultdict(lambda: {"count": 0, "usd_per_hour": 0.0, "saved_usd": 0.0})
    for e in ledger.rows(kind=["instance_stopped", "instance_destroyed"]):
        by = str(e.payload.get("stopped_by") or e.payload.get("by") or "")
        if by == "operator":
            continue
        row = stops[f"{e.kind.removeprefix('instance_')}: {e.reason or 'unknown'}"]
        rate = e.rate_usd_per_hour or 0.0
        row["count"] += 1
        row["usd_per_hour"] += rate
        r = by_instance.get(e.instance or "")
        ended = None if r is None else (r.stopped_at or r.ended_at)
        if r is not None and ended is not None:
            row["saved_usd"] += rate * max(0.0, r.kill_at - ended) / 3600.0
    return {
        "now": now,
        "receipt": receipt.as_dict(),
        "series": {"t0": t0, "hours": [(t - t0) / 3600.0 for t in times], "layers": layers},
        "caps": caps,
        "dead_lifetimes_s": dead_lifetimes,
        "stops": {
            k: {**v, "usd_per_hour": round(v["usd_per_hour"], 6), "saved_usd": round(v["saved_usd"], 6)}
            for k, v in sorted(stops.items())
        },
    }


def reliability(src: Source) -> dict[str, Any]:
    """The field report's status page: interruptions, resumed, recovery median and p90 over 7 and
    30 days (ledger time), and every recovery's time for the plot."""
    from app.ledger import Ledger
    from app.policy.supervision import recovery_summary

    ledger = Ledger(src.engine)
    wall = datetime.now(UTC)
    windows = []
    for days in WINDOWS_DAYS:
        since = wall - timedelta(days=days)
        lost = ledger.rows(kind="host_lost", since=since)
        recs = ledger.rows(kind="recovery", since=since)
        summary = recovery_summary([float(r.payload.get("recovery_s", 0.0)) for r in recs])
        windows.append({"days": days, "interruptions": len(lost), **summary})
    recoveries = [
        {
            "at": _ledger_time(r.at),
            "job": r.job,
            "recovery_s": float(r.payload.get("recovery_s", 0.0)),
            "cause": r.payload.get("cause"),
            "lost_machine": r.payload.get("lost_machine"),
            "machine": r.payload.get("machine_id"),
        }
        for r in ledger.rows(kind="recovery", since=wall - timedelta(days=max(WINDOWS_DAYS)))
    ]
    causes = Counter(str(r.payload.get("cause") or "unknown") for r in ledger.rows(kind="host_lost"))
    return {"windows": windows, "recoveries": recoveries, "loss_causes": dict(sorted(causes.items()))}


def loss_points(text: str) -> list[tuple[float, float]]:
    """(step, loss) of train.log's `step` lines (the trainer's documented line format)."""
    out = []
    for line in text.splitlines():
        m = _STEP_LINE.match(line)
        if m is None:
            continue
        fields = dict(_FIELD.findall(m.group(1)))
        try:
            out.append((float(fields["step"]), float(fields["loss"])))
        except (KeyError, ValueError):
            continue
    return out


def _pulled_logs(store: ArtifactStore, job_id: str, instances: list[str]) -> list[tuple[str, str]]:
    from app.services.joblogs import MAX_LOG_BYTES, log_key

    out = []
    with tempfile.TemporaryDirectory(prefix="tuneharness-web-") as tmp:
        for i, inst in enumerate(instances):
            key = log_key(job_id, inst)
            try:
                if not store.exists(key):
                    continue
                local = Path(tmp) / f"{i}.log"
                store.get_file(key, local)
            except (ArtifactError, OSError):
                continue
            out.append((inst, local.read_bytes()[-MAX_LOG_BYTES:].decode("utf-8", "replace")))
    return out


def job_page(src: Source, job_id: str) -> dict[str, Any]:
    """A job's timeline, hosts and money (`jobs show`), its loss curve from the pulled train.log
    copies in the order it used the hosts, its live fields and the gate's decision."""
    from app.jobs import JobStore
    from app.ledger import Ledger
    from app.rentals import Rentals
    from app.services.timeline import job_timeline

    jobs = JobStore(src.engine)
    t = job_timeline(job_id, jobs=jobs, ledger=Ledger(src.engine), rentals=Rentals(src.engine), now=src.now())
    instances = [str(h["instance"]) for h in t["hosts"] if h["run"] == job_id]
    logs = [] if src.store is None else _pulled_logs(src.store, job_id, list(dict.fromkeys(instances)))
    t["loss"] = [p for _, text in logs for p in loss_points(text)]
    t["logs_from"] = [inst for inst, _ in logs]
    ev = jobs.evaluation(job_id)
    t["gate"] = (
        None
        if ev is None
        else {"decision": ev.decision, "reasons": list(ev.reasons), "trial_path": ev.trial_path, "at": ev.at}
    )
    return t
