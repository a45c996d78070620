"""On consumer cards that never reach their datasheet, the learned expectation destroys no healthy
host and catches every throttled one the campaign meets."""

from __future__ import annotations

import pytest

from providers.sim.campaign import run_campaign
from providers.sim.make_traces import consumer
from providers.sim.trace import load_trace, parse_trace


def test_consumer_trace_destroys_no_good_host_and_catches_every_throttled_one() -> None:
    """Guarded on `consumer`: 0 good hosts destroyed, each throttled host met fails its preflight as throttled."""
    trace = load_trace("consumer")
    result = run_campaign(trace, policy="guarded")
    r = result.receipt
    assert r["good_hosts_destroyed"] == 0
    assert r["jobs_completed"] == trace.workload.jobs and r["jobs_failed"] == 0
    machine_of = {e["instance"]: e["machine"] for e in result.ledger if e.get("kind") == "created"}
    throttled = {h.machine_id for h in trace.hosts if h.truth.tflops_factor < 0.85}
    met = throttled & set(machine_of.values())
    caught = {e["machine"] for e in result.ledger if e.get("kind") == "host_failed" and e.get("reason") == "throttled"}
    trained = {machine_of[e["instance"]] for e in result.ledger if e.get("kind") == "training_started"}
    assert met, "the trace should put throttled hosts in the policy's way"
    assert met <= caught and not (met & trained)
    assert caught <= throttled  # nothing healthy was called throttled


@pytest.mark.parametrize("seed", range(1, 9))
def test_generated_consumer_traces_keep_both_promises(seed: int) -> None:
    """On consumer traces not in the repository too: no good host destroyed, no throttled host trained on."""
    trace = parse_trace(consumer(seed))
    result = run_campaign(trace, policy="guarded")
    assert result.receipt["good_hosts_destroyed"] == 0
    machine_of = {e["instance"]: e["machine"] for e in result.ledger if e.get("kind") == "created"}
    throttled = {h.machine_id for h in trace.hosts if h.truth.tflops_factor < 0.85}
    trained = {machine_of[e["instance"]] for e in result.ledger if e.get("kind") == "training_started"}
    assert not (throttled & trained)
