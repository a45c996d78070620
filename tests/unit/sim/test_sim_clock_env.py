"""Sim clocks and `market_from_env`: virtual time, scaled time, and which market `--provider sim` gets."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from app.market import OfferQuery
from app.ports import Clock
from providers.sim import ScaledClock, SimMarket, VirtualClock, market_from_env
from providers.sim.client import SimClientMarket
from providers.sim.trace import TraceError


def test_virtual_clock_moves_only_when_told() -> None:
    """advance and sleep move virtual time at once; it never runs backwards."""
    clock = VirtualClock(start_s=100.0)
    assert isinstance(clock, Clock)
    clock.sleep(3600)
    assert clock.now() == 3700.0
    assert clock.advance(0.5) == 3700.5
    with pytest.raises(ValueError):
        clock.advance(-1)
    with pytest.raises(ValueError):
        clock.set(0.0)


def test_scaled_clock_runs_scale_times_faster_since_its_epoch() -> None:
    """Two processes sharing (epoch, scale) read the same simulated time, scale x wall time."""
    epoch = time.time() - 10.0
    clock = ScaledClock(scale=60.0, epoch_s=epoch)
    assert isinstance(clock, Clock)
    assert clock.now() == pytest.approx(epoch + 600.0, abs=60.0)
    twin = ScaledClock(**clock.to_dict())
    assert twin.now() == pytest.approx(clock.now(), abs=5.0)
    assert clock.wall_seconds(120.0) == 2.0
    with pytest.raises(ValueError):
        ScaledClock.starting_now(0)


def test_market_from_env_defaults_to_the_smoke_trace_in_process() -> None:
    """Without TUNEHARNESS_SIM_URL: an in-process SimMarket on the shipped smoke trace."""
    market = market_from_env({})
    assert isinstance(market, SimMarket) and market.trace.name == "smoke"
    assert [o.machine_id for o in market.search_offers(OfferQuery())] == ["m-frozen", "m-fatal", "m-stale", "m-good"]


def test_market_from_env_reads_the_trace_and_url_variables(tmp_path: Path) -> None:
    """TUNEHARNESS_SIM_TRACE picks the trace; TUNEHARNESS_SIM_URL picks the shared server."""
    market = market_from_env({"TUNEHARNESS_SIM_TRACE": "adversarial"})
    assert isinstance(market, SimMarket) and market.trace.name == "adversarial"
    with pytest.raises(TraceError):
        market_from_env({"TUNEHARNESS_SIM_TRACE": str(tmp_path / "missing.json")})
    client = market_from_env({"TUNEHARNESS_SIM_URL": "http://127.0.0.1:9"})
    assert isinstance(client, SimClientMarket) and client.url == "http://127.0.0.1:9"


def test_every_clock_converts_to_and_from_wall_time() -> None:
    """The Clock port says how long its seconds take in wall time, and where a wall timestamp falls."""
    from app.ports import Clock, WallClock

    scaled = ScaledClock(scale=10.0, epoch_s=1_000.0)
    assert scaled.wall_seconds(60.0) == 6.0 and scaled.from_wall(1_010.0) == 1_100.0
    wall = WallClock()
    assert wall.wall_seconds(60.0) == 60.0 and wall.from_wall(5.0) == 5.0
    virtual = VirtualClock(start_s=0.0)
    assert virtual.wall_seconds(60.0) == 0.0
    for clock in (scaled, wall, virtual):
        assert isinstance(clock, Clock)
