"""SimClientMarket over loopback HTTP to an in-process SimServer: the port's errors survive the wire."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.market import LaunchSpec, Market, OfferGone, OfferQuery, ProviderBusy, ProviderError
from providers.sim.client import SimClientMarket
from providers.sim.server import SimServer
from providers.sim.trace import TRACE_FORMAT, parse_trace

TRACE = parse_trace(
    {
        "format": TRACE_FORMAT,
        "name": "wire",
        "workload": {"image_gb": 8, "model_gb": 15},
        "hosts": [
            {
                "machine_id": "m-a",
                "offer": {"gpu_name": "RTX 3090", "gpu_ram_gb": 24, "dph": 0.1},
                "truth": {"pull_mbps": 1, "fatal_at_s": 0, "fatal_status": "OCI runtime create failed"},
            },
            {
                "machine_id": "m-b",
                "offer": {"gpu_name": "RTX 4090", "gpu_ram_gb": 24, "dph": 0.3},
                "truth": {"pull_mbps": 1},
            },
        ],
    }
)


@pytest.fixture
def client(tmp_path: Path) -> Iterator[SimClientMarket]:
    server = SimServer(TRACE, scale=1.0, root=tmp_path / "sim")
    url = server.start()
    market = SimClientMarket(url)
    yield market
    market.close()
    server.close()


def spec(label: str) -> LaunchSpec:
    return LaunchSpec(image="img", disk_gb=10, label=label, ssh_public_key="ssh-ed25519 AAAA k")


def test_client_round_trips_offers_instances_and_errors(client: SimClientMarket) -> None:
    """Offers, create, status, listing, stop/start/destroy and OfferGone work over HTTP."""
    assert isinstance(client, Market)
    offers = client.search_offers(OfferQuery(gpu_names=("RTX 3090",)))
    assert [(o.machine_id, o.gpu_name, o.dph_total) for o in offers] == [("m-a", "RTX 3090", 0.1)]
    iid = client.create(offers[0], spec("job-1/x"))
    with pytest.raises(OfferGone):
        client.create(offers[0], spec("job-1/y"))
    inst = client.status(iid)
    assert (inst.state, inst.status_line, inst.label) == ("loading", "OCI runtime create failed", "job-1/x")
    other = client.create(client.search_offers(OfferQuery())[0], spec("job-2/x"))
    assert [i.instance_id for i in client.list_instances("job-1/")] == [iid]
    client.stop(other)
    assert client.status(other).state == "stopped"
    client.start(other)
    assert client.status(other).state == "loading"
    client.destroy(iid)
    client.destroy(iid)
    assert client.status(iid).state == "gone"
    with pytest.raises(ProviderError):
        client.start(iid)
    bills = {b["instance_id"]: b for b in client.referee_bills()}
    assert bills[iid]["end_reason"] == "destroyed" and bills[other]["end_reason"] is None
    assert client.clock().scale == 1.0


def test_unreachable_server_is_provider_busy() -> None:
    """A sim server that is not running raises ProviderBusy naming the fix."""
    market = SimClientMarket("http://127.0.0.1:9", timeout_s=2)
    with pytest.raises(ProviderBusy, match="sim serve"):
        market.search_offers(OfferQuery())
