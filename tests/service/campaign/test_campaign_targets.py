"""The campaign simulator's targets, on the shipped traces and on generated traces like them."""

from __future__ import annotations

import pytest

from providers.sim.campaign import run_campaign
from providers.sim.make_traces import adversarial, marketplace
from providers.sim.trace import Trace, load_trace, parse_trace

RECEIPT_KEYS = [
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
]


def three(trace: Trace) -> dict[str, dict[str, object]]:
    return {p: run_campaign(trace, policy=p).receipt for p in ("guarded", "naive", "oracle")}


def check_guarded(r: dict[str, dict[str, object]], trace: Trace) -> None:
    """Every target that must hold on each trace."""
    g, o = r["guarded"], r["oracle"]
    assert g["good_hosts_destroyed"] == 0
    assert g["jobs_completed"] == trace.workload.jobs and g["jobs_failed"] == 0
    assert g["budget_exceeded"] is False
    assert float(g["dead_host_cost_usd"]) <= 1.5 * float(o["dead_host_cost_usd"]) + 1e-9  # type: ignore[arg-type]
    assert float(g["dead_host_mean_lifetime_s"]) <= float(o["dead_host_mean_lifetime_s"]) + 150  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["smoke", "marketplace", "adversarial"])
def test_shipped_trace_meets_every_target(name: str) -> None:
    """On each shipped trace guarded is within the targets against naive and oracle."""
    trace = load_trace(name)
    r = three(trace)
    check_guarded(r, trace)
    assert float(r["guarded"]["dead_host_cost_usd"]) <= 0.25 * float(r["naive"]["dead_host_cost_usd"])  # type: ignore[arg-type]


def test_receipt_has_exactly_the_documented_fields() -> None:
    """The receipt carries the issue's fields in its order, then the standby pool and the unfinished jobs."""
    receipt = run_campaign(load_trace("smoke"), policy="guarded").receipt
    assert list(receipt) == RECEIPT_KEYS


@pytest.mark.parametrize(("gen", "seed"), [(g, s) for g in (marketplace, adversarial) for s in range(1, 9)])
def test_generated_traces_meet_the_per_trace_targets(gen: object, seed: int) -> None:
    """On traces shaped like the shipped ones but not in the repository, every target holds, the
    25%-of-naive one included (the 104-trace sweep in docs/simulation.md names the 2 seeds where it does not)."""
    trace = parse_trace(gen(seed))  # type: ignore[operator]
    r = three(trace)
    check_guarded(r, trace)
    assert float(r["guarded"]["dead_host_cost_usd"]) <= 0.25 * float(r["naive"]["dead_host_cost_usd"])  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["recovery", "hangs"])
def test_mid_run_failure_traces_meet_the_provisioning_targets_too(name: str) -> None:
    """The traces with hosts lost or hung during training keep the dead-host targets as well."""
    trace = load_trace(name)
    r = three(trace)
    check_guarded(r, trace)
    assert float(r["guarded"]["dead_host_cost_usd"]) <= 0.25 * float(r["naive"]["dead_host_cost_usd"])  # type: ignore[arg-type]
