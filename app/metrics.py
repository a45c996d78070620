"""The money and health figures as Prometheus metrics, read from the database at each scrape.

`tuneharness metrics` prints them once (the text exposition format: a node-exporter textfile, a
cron job, a look by eye); `tuneharness metrics --serve` answers Prometheus on 127.0.0.1:9464. Every
figure is computed from the shared database when scraped, so any process on any machine of the
fleet serves the same numbers and nothing is lost when it restarts. Flower's own `/metrics` covers
the queues and workers; `deploy/grafana/tuneharness.json` is a dashboard built on both.

| metric | type | what |
|---|---|---|
| tuneharness_spend_rate_usd_per_hour | gauge | what the running rentals bill per hour now |
| tuneharness_spent_usd{cause} | gauge | spend so far: gpu, storage, traffic; dead_hosts (part of them) |
| tuneharness_budget_cap{budget,period,unit} | gauge | each cap, in its unit (usd unless set otherwise) |
| tuneharness_budget_reserved{budget,period,unit} | gauge | reserved and not yet settled, this period |
| tuneharness_budget_spent{budget,period,unit} | gauge | settled this period |
| tuneharness_rentals{state} | gauge | rentals by state (intent, active, stopped, ...) |
| tuneharness_jobs{phase} | gauge | jobs by phase |
| tuneharness_dead_hosts_total | counter | hosts that never held the work (destroyed or lost) |
| tuneharness_stops_total{reason} | counter | hosts the guardrails and supervisor stopped, by reason |
| tuneharness_recoveries_total | counter | jobs moved to another host after a loss |
| tuneharness_recovery_seconds{window,quantile} | gauge | median and p90 recovery time over 7 and 30 days |
| tuneharness_periodic_age_seconds{task} | gauge | seconds since each beat task last succeeded (-1: never) |
| tuneharness_periodic_overdue{task} | gauge | 1 when a beat task is more than three intervals late |
| tuneharness_triage_total{state} | counter | dead trainers by triage state |

Money figures are our own estimates from the rates in force (`app.services.receipts`); the
vendor's invoice is the final word.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine

__all__ = ["DEFAULT_PORT", "FleetCollector", "Sample", "exposition", "snapshot"]

DEFAULT_PORT = 9464  # the port Prometheus's exporter registry gives OpenTelemetry-style app exporters
PREFIX = "tuneharness_"
WINDOWS_DAYS = (7, 30)


@dataclass(frozen=True)
class Sample:
    """One metric family: its name (without the prefix), type, help and labelled values."""

    name: str
    kind: str  # "gauge" or "counter"
    help: str
    values: list[tuple[dict[str, str], float]] = field(default_factory=list)


def _percentile(values: list[float], q: float) -> float:
    from app.policy.supervision import percentile

    got = percentile(values, q)
    return float("nan") if got is None else float(got)


def snapshot(engine: Engine, *, now: float, intervals_s: Mapping[str, float]) -> list[Sample]:
    """Every figure, read from the database as it is at `now` (the billing clock)."""
    from app.budget import Budget
    from app.jobs import JOB_PHASES, JobStore
    from app.ledger import Ledger
    from app.liveness import last_successes, overdue
    from app.rentals import Rentals
    from app.services.receipts import build_receipt

    rentals, ledger = Rentals(engine), Ledger(engine)
    receipt = build_receipt(rentals, ledger, now=now)
    r = receipt.as_dict()
    out = [
        Sample(
            "spend_rate_usd_per_hour",
            "gauge",
            "What the running rentals bill per hour now.",
            [({}, r["billing_per_hour_now"])],
        ),
        Sample(
            "spent_usd",
            "gauge",
            "Spend so far by cause (our estimate from the rates in force; dead_hosts is part of the rest).",
            [({"cause": c}, r[f"{c}_usd"]) for c in ("gpu", "storage", "traffic")]
            + [({"cause": "dead_hosts"}, r["dead_host_cost_usd"])],
        ),
        Sample("dead_hosts_total", "counter", "Hosts that never held the job's work.", [({}, float(r["dead_hosts"]))]),
    ]
    caps, reserved, spent = [], [], []
    for b in Budget(engine).status():
        labels = {"budget": b.name, "period": b.period, "unit": b.unit}
        caps.append((labels, b.cap_usd))
        reserved.append((labels, b.reserved_usd))
        spent.append((labels, b.spent_usd))
    out += [
        Sample("budget_cap", "gauge", "Each budget cap.", caps),
        Sample("budget_reserved", "gauge", "Reserved and not yet settled, this period.", reserved),
        Sample("budget_spent", "gauge", "Settled this period.", spent),
    ]
    by_state = Counter(x.state for x in rentals.all())
    out.append(
        Sample("rentals", "gauge", "Rentals by state.", [({"state": s}, float(n)) for s, n in sorted(by_state.items())])
    )
    phases = Counter(j.phase for j in JobStore(engine).list())
    out.append(Sample("jobs", "gauge", "Jobs by phase.", [({"phase": p}, float(phases.get(p, 0))) for p in JOB_PHASES]))
    stops = Counter((e.reason or "unknown") for e in ledger.rows(kind="instance_stopped"))
    out.append(
        Sample(
            "stops_total",
            "counter",
            "Hosts stopped by the guardrails and supervisor, by reason.",
            [({"reason": k}, float(n)) for k, n in sorted(stops.items())],
        )
    )
    recs = ledger.rows(kind="recovery")
    out.append(
        Sample("recoveries_total", "counter", "Jobs moved to another host after a loss.", [({}, float(len(recs)))])
    )
    quantiles: list[tuple[dict[str, str], float]] = []
    wall_now = datetime.now(UTC)
    for days in WINDOWS_DAYS:
        window = ledger.rows(kind="recovery", since=wall_now - timedelta(days=days))
        secs = [float(e.payload.get("recovery_s", 0.0)) for e in window]
        for q, label in ((50, "0.5"), (90, "0.9")):
            quantiles.append(({"window": f"{days}d", "quantile": label}, _percentile(secs, q)))
    out.append(Sample("recovery_seconds", "gauge", "Recovery time quantiles (NaN: none in the window).", quantiles))
    last = last_successes(engine)
    late = {o.name for o in overdue(last, intervals_s, now=time.time())}
    out += [
        Sample(
            "periodic_age_seconds",
            "gauge",
            "Seconds since each beat task last succeeded (-1: never).",
            [({"task": t}, (time.time() - last[t]) if t in last else -1.0) for t in sorted(intervals_s)],
        ),
        Sample(
            "periodic_overdue",
            "gauge",
            "1 when a beat task is more than three intervals late.",
            [({"task": t}, 1.0 if t in late else 0.0) for t in sorted(intervals_s)],
        ),
    ]
    triage = Counter(str(e.payload.get("triage_state", "unknown")) for e in ledger.rows(kind="trainer_died"))
    out.append(
        Sample(
            "triage_total",
            "counter",
            "Dead trainers by triage state.",
            [({"state": s}, float(n)) for s, n in sorted(triage.items())],
        )
    )
    return out


class FleetCollector:
    """A prometheus_client collector: `snapshot` at every scrape."""

    def __init__(
        self, engine: Callable[[], Engine], *, intervals_s: Mapping[str, float], clock: Callable[[], float] = time.time
    ) -> None:
        self._engine, self._intervals, self._clock = engine, dict(intervals_s), clock

    def collect(self) -> Iterator[object]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        for s in snapshot(self._engine(), now=self._clock(), intervals_s=self._intervals):
            names = sorted({k for labels, _ in s.values for k in labels})
            if s.kind == "counter":
                fam: object = CounterMetricFamily(PREFIX + s.name.removesuffix("_total"), s.help, labels=names)
            else:
                fam = GaugeMetricFamily(PREFIX + s.name, s.help, labels=names)
            for labels, value in s.values:
                fam.add_metric([labels.get(k, "") for k in names], value)  # type: ignore[attr-defined]
            yield fam


def exposition(collector: FleetCollector) -> str:
    """The text exposition format Prometheus scrapes, for this collector alone."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)  # type: ignore[arg-type]
    return generate_latest(registry).decode("utf-8")
