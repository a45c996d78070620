"""The simulated marketplace honours `OfferQuery.datacenter_only`, in process and over the wire."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app.market import OfferQuery
from providers.sim.client import SimClientMarket
from providers.sim.clock import VirtualClock
from providers.sim.market import SimMarket
from providers.sim.server import SimServer
from providers.sim.trace import TRACE_FORMAT, TraceError, parse_trace


def trace_data(dc: Any = True) -> dict[str, Any]:
    return {
        "format": TRACE_FORMAT,
        "name": "datacenter",
        "workload": {"image_gb": 8, "model_gb": 2},
        "hosts": [
            {"machine_id": "m-home", "offer": {"gpu_name": "RTX 3090", "gpu_ram_gb": 24, "dph": 0.1}},
            {"machine_id": "m-dc", "offer": {"gpu_name": "RTX 3090", "gpu_ram_gb": 24, "dph": 0.3, "datacenter": dc}},
        ],
    }


def test_only_datacenter_hosts_when_asked_and_every_host_otherwise() -> None:
    """A trace without the flag lists hosts as today; datacenter_only leaves only the flagged one."""
    market = SimMarket(parse_trace(trace_data()), VirtualClock())
    assert [o.machine_id for o in market.search_offers(OfferQuery())] == ["m-home", "m-dc"]
    (only,) = market.search_offers(OfferQuery(datacenter_only=True))
    assert only.machine_id == "m-dc" and only.raw["datacenter"] is True


def test_a_trace_flag_that_is_not_true_or_false_is_named() -> None:
    """`datacenter: "yes"` is refused naming hosts[1].offer.datacenter."""
    with pytest.raises(TraceError, match=r"hosts\[1\]\.offer\.datacenter"):
        parse_trace(trace_data("yes"))


def test_the_shared_marketplace_honours_it_over_loopback_http(tmp_path: Path) -> None:
    """SimClientMarket carries datacenter_only to the shared SimServer."""
    server = SimServer(parse_trace(trace_data()), scale=1.0, root=tmp_path / "sim")
    client = SimClientMarket(server.start())
    try:
        assert len(client.search_offers(OfferQuery())) == 2
        assert [o.machine_id for o in client.search_offers(OfferQuery(datacenter_only=True))] == ["m-dc"]
    finally:
        client.close()
        server.close()
