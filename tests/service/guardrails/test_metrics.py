"""`tuneharness metrics`: the money and health figures, read from the database at each scrape, as
Prometheus parses them; the Grafana dashboard asks only for metrics that exist."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from app.jobs import JobStore
from app.ledger import Event
from app.liveness import record_success
from app.metrics import FleetCollector, exposition
from app.rentals import Rentals
from app.services.guardrails import sweep_idle
from providers.sim import VirtualClock
from tests.support.jobfiles import sim_needs_section, train_section

from .conftest import host, make_market, rent

REPO = Path(__file__).resolve().parents[3]
INTERVALS = {"reaper": 60.0, "idle-watchdog": 60.0}


def _values(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_the_figures_are_the_receipts_budgets_ledger_and_liveness_as_they_stand(
    rentals: Rentals, clock: VirtualClock, tmp_path: Path
) -> None:
    from app.jobs import parse_job_text

    (tmp_path / "model").mkdir()
    (tmp_path / "train.jsonl").write_text('{"prompt": "a", "completion": "b"}\n')
    spec = parse_job_text("name: m\n" + train_section("none") + sim_needs_section(), base_dir=tmp_path)
    jobs = JobStore(rentals.engine)
    jobs.set_phase(jobs.add(spec), "training")
    jobs.add(spec)
    market = make_market([host(1, computes=False), host(2, hangs_at_s=0)], clock)
    dud = rent(rentals, market, clock, "a", machine="m-1")
    idle = rent(rentals, market, clock, "b", machine="m-2")
    rentals.mark_held_work(idle.id)
    clock.advance(600)
    rentals.destroy(dud.id, market=market, by="automation", reason="no_compute", now=clock.now())
    for _ in range(7):
        clock.advance(300)
        sweep_idle(rentals, {"sim": market}, now=clock.now(), grace_s=1800)
    for i, secs in enumerate((100.0, 200.0, 300.0)):
        rentals.ledger.append(Event(kind="recovery", job=f"j{i}", payload={"recovery_s": secs}))
    for state in ("oom", "oom", "nan_loss"):
        rentals.ledger.append(Event(kind="trainer_died", job="x", payload={"triage_state": state}))
    record_success(rentals.engine, "reaper", time.time())  # beat's liveness is on the wall clock

    text = exposition(FleetCollector(lambda: rentals.engine, intervals_s=INTERVALS, clock=clock.now))
    v = _values(text)
    from app.services.receipts import build_receipt

    r = build_receipt(rentals, rentals.ledger, now=clock.now()).as_dict()
    assert v[("tuneharness_spend_rate_usd_per_hour", ())] == r["billing_per_hour_now"] > 0
    assert v[("tuneharness_spent_usd", (("cause", "gpu"),))] == r["gpu_usd"] > 0
    assert v[("tuneharness_spent_usd", (("cause", "dead_hosts"),))] == r["dead_host_cost_usd"] > 0
    assert v[("tuneharness_dead_hosts_total", ())] == 1
    (cap,) = [b for b in rentals.budget.status() if b.name == "default"]
    labels = (("budget", "default"), ("period", cap.period), ("unit", cap.unit))
    assert v[("tuneharness_budget_cap", labels)] == 100.0
    assert v[("tuneharness_budget_reserved", labels)] == cap.reserved_usd
    assert v[("tuneharness_budget_spent", labels)] == cap.spent_usd
    assert v[("tuneharness_rentals", (("state", "stopped"),))] == 1
    assert v[("tuneharness_jobs", (("phase", "training"),))] == 1
    assert v[("tuneharness_jobs", (("phase", "queued"),))] == 1
    assert v[("tuneharness_stops_total", (("reason", "idle"),))] == 1
    assert v[("tuneharness_recoveries_total", ())] == 3
    assert v[("tuneharness_recovery_seconds", (("quantile", "0.5"), ("window", "7d")))] == 200.0
    assert v[("tuneharness_recovery_seconds", (("quantile", "0.9"), ("window", "30d")))] == 280.0
    assert v[("tuneharness_triage_total", (("state", "oom"),))] == 2
    assert v[("tuneharness_periodic_overdue", (("task", "reaper"),))] == 0
    assert v[("tuneharness_periodic_overdue", (("task", "idle-watchdog"),))] == 1  # never ran
    assert v[("tuneharness_periodic_age_seconds", (("task", "idle-watchdog"),))] == -1


def _exported(text: str) -> set[str]:
    return {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_the_dashboard_asks_only_for_metrics_that_exist(rentals: Rentals) -> None:
    """Every tuneharness_* series in deploy/grafana/tuneharness.json is exported (an empty fleet
    exports each family's name too), and every flower_* one is a metric Flower defines."""
    ours = _exported(exposition(FleetCollector(lambda: rentals.engine, intervals_s=INTERVALS)))
    families = {re.sub(r"_total$", "", n) for n in ours} | ours
    empty_text = exposition(FleetCollector(lambda: rentals.engine, intervals_s=INTERVALS))
    families |= set(re.findall(r"^# TYPE (tuneharness_\w+)", empty_text, flags=re.M))
    import flower

    flower_src = (Path(flower.__file__).parent / "events.py").read_text()
    theirs = set(re.findall(r"['\"](flower_\w+)['\"]", flower_src))
    dash = json.loads((REPO / "deploy" / "grafana" / "tuneharness.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\b((?:tuneharness|flower)_\w+)", e)}
    assert used, "the dashboard queries something"
    for name in sorted(used):
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        if name.startswith("tuneharness_"):
            assert name in families or name.removesuffix("_total") in families, name
        else:
            assert base in theirs, name
