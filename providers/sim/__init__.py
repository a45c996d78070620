"""The simulated marketplace of lying hosts (see docs/simulation.md).

- `SimMarket(trace, clock)`: the Market port in-process; `market.referee` holds truth and billing.
- `SimServer` / `SimClientMarket`: the same marketplace shared over loopback HTTP by separate
  processes, with each running host behind a real sshd.
- `market_from_env()`: what `--provider sim` uses.

Only light modules are imported here; the server and the SSH runtime load on demand.
"""

from __future__ import annotations

import os

from app.market import Market
from app.ports import WallClock
from providers.sim.clock import ScaledClock, VirtualClock
from providers.sim.market import InstanceBill, SimMarket, SimReferee
from providers.sim.trace import (
    HostSpec,
    HostTruth,
    Trace,
    TraceError,
    Workload,
    load_trace,
    shipped_trace_path,
)

__all__ = [
    "HostSpec",
    "HostTruth",
    "InstanceBill",
    "ScaledClock",
    "SimMarket",
    "SimReferee",
    "Trace",
    "TraceError",
    "VirtualClock",
    "Workload",
    "load_trace",
    "market_from_env",
    "shared_clock_from_env",
    "shipped_trace_path",
]


def market_from_env(env: dict[str, str] | None = None) -> Market:
    """TUNEHARNESS_SIM_URL set: the shared sim server; else an in-process SimMarket on
    TUNEHARNESS_SIM_TRACE (default: the shipped smoke trace) with the wall clock."""
    env = dict(os.environ) if env is None else env
    url = env.get("TUNEHARNESS_SIM_URL")
    if url:
        from providers.sim.client import SimClientMarket

        return SimClientMarket(url)
    trace = load_trace(env.get("TUNEHARNESS_SIM_TRACE") or shipped_trace_path("smoke"))
    return SimMarket(trace, WallClock())


def shared_clock_from_env(env: dict[str, str] | None = None) -> ScaledClock | None:
    """The shared marketplace's scaled clock when TUNEHARNESS_SIM_URL is set (so that every process
    measures boot windows and countdowns in its simulated seconds), else None."""
    env = dict(os.environ) if env is None else env
    url = env.get("TUNEHARNESS_SIM_URL")
    if not url:
        return None
    from providers.sim.client import SimClientMarket

    return SimClientMarket(url).clock()
