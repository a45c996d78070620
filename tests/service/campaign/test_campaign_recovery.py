"""Simulator targets for recovery and hangs: hosts lost mid-run, hangs, warm standby, budget cap."""

from __future__ import annotations

import statistics
from typing import Any

import pytest

from providers.sim.campaign import Campaign, CampaignResult, run_campaign
from providers.sim.make_traces import hangs, marketplace, recovery
from providers.sim.trace import Trace, load_trace, parse_trace

RECOVERY_KEYS = {"job", "machine_id", "cause", "lost_at_s", "resumed_at_s"}
WATCHDOG_GRACE_S = 30 * 60.0  # the idle watchdog's grace period
WATCHDOG_INTERVAL_S = 5 * 60.0  # the idle watchdog's period


def campaign(
    trace: Trace, *, standby_hosts: int = 0, progress_hedge_max: int | None = None
) -> tuple[CampaignResult, Campaign]:
    c = Campaign(
        trace,
        "guarded",
        jobs=None,
        seed=0,
        trace_label=trace.name,
        standby_hosts=standby_hosts,
        progress_hedge_max=progress_hedge_max,
    )
    receipt = c.run()
    return CampaignResult(receipt=receipt, ledger=c.ledger, unfinished=dict(c.failed)), c


def recovery_facts(res: CampaignResult, c: Campaign) -> list[dict[str, float]]:
    """Per recovery: seconds to detect (loss -> the lost host stopped), to recover, and the replacement's pull."""
    facts = []
    for rec in res.receipt["recoveries"]:
        stop = min(
            e["t_s"]
            for e in res.ledger
            if e["kind"] == "stopped"
            and e["job"] == rec["job"]
            and e["reason"] in ("lost", "hang")
            and e["t_s"] >= rec["lost_at_s"] - 1e-6
        )
        resumed = next(
            e
            for e in res.ledger
            if e["kind"] == "training_started" and e["job"] == rec["job"] and abs(e["t_s"] - rec["resumed_at_s"]) < 1e-6
        )
        facts.append(
            {
                "detect_s": stop - rec["lost_at_s"],
                "recovery_s": rec["resumed_at_s"] - rec["lost_at_s"],
                "pull_s": c.referee.pull_seconds(resumed["instance"]),
            }
        )
    return facts


def check_recovery_targets(
    trace: Trace, *, standby_hosts: int, progress_hedge_max: int | None = None
) -> dict[str, Any]:
    res, c = campaign(trace, standby_hosts=standby_hosts, progress_hedge_max=progress_hedge_max)
    r = res.receipt
    assert r["jobs_completed"] == trace.workload.jobs and r["jobs_failed"] == 0 and r["unfinished_jobs"] == []
    assert r["good_hosts_destroyed"] == 0 and r["budget_exceeded"] is False
    facts = recovery_facts(res, c)
    assert facts, "the trace must lose a host during training"
    assert all(set(x) == RECOVERY_KEYS for x in r["recoveries"])
    assert all(f["detect_s"] <= 60.0 for f in facts)
    times = sorted(f["recovery_s"] for f in facts)
    assert r["recovery_median_s"] == pytest.approx(statistics.median(times), abs=0.1)
    assert r["recovery_p90_s"] is not None and r["recovery_p90_s"] >= r["recovery_median_s"]
    if standby_hosts:
        assert r["recovery_median_s"] <= 90.0
        assert r["standby_hosts"] == standby_hosts and r["standby_cost_usd"] > 0
    else:
        assert statistics.median(f["recovery_s"] - f["pull_s"] for f in facts) <= 90.0
    return r


@pytest.mark.parametrize("standby_hosts", [0, 1])
def test_shipped_recovery_trace_meets_the_recovery_targets(standby_hosts: int) -> None:
    """Hosts vanishing mid-run: every job completes, losses are seen within 60 s, and the job is back
    within one image pull + 90 s (within 90 s with one standby host)."""
    check_recovery_targets(load_trace("recovery"), standby_hosts=standby_hosts)


def test_progress_hedging_on_the_shipped_marketplace_meets_the_pull_target() -> None:
    """With progress-aware hedging switched on (off by default), the marketplace recovery, whose
    first hedged rentals were duds and slow pulls, rents once more for each chain pulling slower
    than a fresh rental would (single rentals, at most progress_hedge_max), keeps every slow chain,
    and is back within one image pull + 90 s; switched off, nothing of the kind is rented."""
    check_recovery_targets(load_trace("marketplace"), standby_hosts=0, progress_hedge_max=3)
    res, c = campaign(load_trace("marketplace"), progress_hedge_max=3)
    extra = [e for e in res.ledger if e["kind"] == "standby_wanted" and e["rentals"] is not None]
    assert extra and all(e["rentals"] == 1 for e in extra)
    per_recovery: dict[str, int] = {}
    for e in extra:
        per_recovery[e["hedge_for"]] = per_recovery.get(e["hedge_for"], 0) + 1
    assert all(n <= c.cfg.progress_hedge_max for n in per_recovery.values())
    extra_jobs = {e["job"] for e in extra}
    assert all(sum(1 for e in res.ledger if e["kind"] == "created" and e["job"] == j) <= 1 for j in extra_jobs)
    slow_destroyed = [e for e in res.ledger if e["kind"] == "destroyed" and "slow" in e["evidence"]]
    assert not slow_destroyed and res.receipt["good_hosts_destroyed"] == 0
    off, _ = campaign(load_trace("marketplace"))
    assert not [e for e in off.ledger if e["kind"] == "standby_wanted" and e["rentals"] is not None]


@pytest.mark.parametrize("seed", [2, 4, 5, 8])
def test_generated_recovery_traces_meet_the_targets_without_standby(seed: int) -> None:
    """On recovery traces not in the repository the no-standby targets hold (see docs/simulation.md for the sweep)."""
    check_recovery_targets(parse_trace(recovery(seed)), standby_hosts=0)


@pytest.mark.parametrize("seed", [1, 2, 11, 16, 19, 28])
def test_generated_recovery_traces_meet_the_targets_with_one_standby(seed: int) -> None:
    """With one warm standby host the median recovery is under 90 s on generated traces too."""
    check_recovery_targets(parse_trace(recovery(seed)), standby_hosts=1)


def test_standby_costs_show_in_the_receipt_and_are_part_of_the_total() -> None:
    """The standby pool's bill is named in the receipt and never exceeds the campaign's total."""
    plain = run_campaign(load_trace("recovery"), policy="guarded").receipt
    warm = run_campaign(load_trace("recovery"), policy="guarded", standby_hosts=1).receipt
    assert 0 < warm["standby_cost_usd"] <= warm["total_cost_usd"]
    assert warm["total_cost_usd"] > plain["total_cost_usd"]


@pytest.mark.parametrize(
    "trace", [load_trace("hangs"), parse_trace(hangs(1)), parse_trace(hangs(3))], ids=["shipped", "gen1", "gen3"]
)
def test_hangs_are_stopped_and_bill_little_idle_time(trace: Trace) -> None:
    """Hung trainers are stopped (never destroyed) by the supervisor; each hang bills at most the
    watchdog's grace plus one interval of idle GPU time; spend stays within the budget."""
    res, c = campaign(trace)
    r = res.receipt
    assert r["jobs_completed"] == trace.workload.jobs and r["budget_exceeded"] is False
    hung = [x for x in r["recoveries"] if x["cause"] == "hang"]
    assert hung
    assert r["idle_gpu_seconds_billed"] <= len(hung) * (WATCHDOG_GRACE_S + WATCHDOG_INTERVAL_S)
    hung_machines = {x["machine_id"] for x in hung}
    assert not any(
        e["kind"] == "destroyed" and e["machine"] in hung_machines and e["reason"] == "hang" for e in res.ledger
    )
    assert all(f["detect_s"] <= 90.0 for f in recovery_facts(res, c))


@pytest.mark.parametrize(("gen", "budget"), [(marketplace, 0.15), (recovery, 0.3), (hangs, 0.05)])
def test_a_budget_too_small_stops_at_the_cap_and_names_the_unfinished_jobs(gen: Any, budget: float) -> None:
    """With a budget that cannot pay for the workload, spend stops at the cap, never above it, and
    the receipt names every job left unfinished."""
    data = gen(3)
    data["workload"]["budget_usd"] = budget
    r = run_campaign(parse_trace(data), policy="guarded").receipt
    assert r["budget_exceeded"] is False and r["total_cost_usd"] <= budget
    assert r["jobs_completed"] < data["workload"]["jobs"]
    names = [u["job"] for u in r["unfinished_jobs"]]
    assert len(names) == r["jobs_failed"] and len(names) + r["jobs_completed"] == data["workload"]["jobs"]
    assert all("budget" in u["reason"] for u in r["unfinished_jobs"])


def test_a_held_host_that_vanished_is_never_adopted() -> None:
    """A verified host that dies while it waits is dropped and recorded, never handed a job."""
    res, _ = campaign(load_trace("recovery"), standby_hosts=1)
    adopted_at = {e["instance"]: e["t_s"] for e in res.ledger if e["kind"] == "host_adopted"}
    for iid, t in adopted_at.items():
        bill = _bill_end(res, iid)
        assert bill is None or bill > t


def _bill_end(res: CampaignResult, iid: str) -> float | None:
    """When the ledger saw the instance stopped as lost, if it did."""
    ends = [e["t_s"] for e in res.ledger if e["kind"] == "stopped" and e["instance"] == iid and e["reason"] == "lost"]
    return min(ends) if ends else None


def test_a_recovery_on_a_dud_heavy_market_hedges_wider_than_the_minimum() -> None:
    """On the marketplace trace (most rentals are duds), a recovery with no verified host waiting
    runs more parallel chains than recovery_hedge, sized from the delivery rate observed so far."""
    res, c = campaign(load_trace("marketplace"))
    hedges: dict[str, int] = {}
    for e in res.ledger:
        if e["kind"] == "standby_wanted" and e["hedge_for"] and e["rentals"] is None:  # not progress hedges
            hedges[e["hedge_for"]] = hedges.get(e["hedge_for"], 0) + 1
    assert hedges and all(n + 1 > c.cfg.recovery_hedge for n in hedges.values())
    assert all(n + 1 <= c.cfg.recovery_hedge_max for n in hedges.values())


def test_the_standby_pool_grows_only_after_losses_and_its_cost_is_in_the_receipt() -> None:
    """With one standby host asked for, the pool grows to two only once hosts were seen lost often
    enough that another loss during a refill is likely; the extra host's bill is in standby_cost_usd."""
    res, _ = campaign(parse_trace(recovery(11)), standby_hosts=1)
    grown = [e for e in res.ledger if e["kind"] == "standby_pool" and e["size"] == 2]
    assert grown and all(e["losses"] >= 1 for e in grown)
    assert max(e["size"] for e in res.ledger if e["kind"] == "standby_pool") <= 2
    first_loss = min(e["t_s"] for e in res.ledger if e["kind"] == "stopped" and e["reason"] == "lost")
    assert min(e["t_s"] for e in grown) >= first_loss
    assert 0 < res.receipt["standby_cost_usd"] <= res.receipt["total_cost_usd"]
    plain, _ = campaign(parse_trace(recovery(11)))
    assert not [e for e in plain.ledger if e["kind"] == "standby_pool"]
