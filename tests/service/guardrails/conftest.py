"""A simulated marketplace on a virtual clock, and a registry on a fresh SQLite file."""

from __future__ import annotations

from typing import Any

import pytest

from app.alerts import InMemoryNotifier
from app.db import init_db, make_engine
from app.market import LaunchSpec, OfferQuery
from app.rentals import Rentals
from providers.sim import SimMarket, VirtualClock
from providers.sim.trace import parse_trace

PULL_GB = 1.0  # image + model; at 800 Mbit/s the pull takes 10 s


def host(i: int, **truth: Any) -> dict[str, Any]:
    return {
        "machine_id": f"m-{i}",
        "offer": {
            "gpu_name": "RTX 3090",
            "num_gpus": 1,
            "gpu_ram_gb": 24,
            "dph": 0.10 + i / 1000,
            "storage_per_gb_month": 0.15,
            "inet_down_per_gb": 0.0,
            "inet_down_mbps": 800,
            "reliability": 0.995,
            "cuda_max": "12.4",
        },
        "truth": {"pull_mbps": 800, "actual_gpu_ram_gb": 24, "actual_gpu_name": "RTX 3090", **truth},
    }


def make_market(hosts: list[dict[str, Any]], clock: VirtualClock) -> SimMarket:
    trace = parse_trace(
        {
            "format": "tuneharness-market-trace/1",
            "name": "guardrails",
            "workload": {
                "jobs": 1,
                "image_gb": 0.5,
                "model_gb": 0.5,
                "train_seconds": 600,
                "checkpoint_every_s": 60,
                "disk_gb": 10,
                "budget_usd": 100.0,
            },
            "hosts": hosts,
        }
    )
    return SimMarket(trace, clock)


SPEC = LaunchSpec(image="tuneharness/trainer:cpu", disk_gb=10, label="", ssh_public_key="ssh-ed25519 AAAA test")


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture
def rentals(tmp_path) -> Rentals:  # type: ignore[no-untyped-def]
    engine = make_engine(f"sqlite:///{tmp_path / 'th.db'}")
    init_db(engine)
    r = Rentals(engine)
    r.budget.set_cap("default", 100.0)
    return r


@pytest.fixture
def notifier() -> InMemoryNotifier:
    return InMemoryNotifier()


def rent(
    rentals: Rentals,
    market: SimMarket,
    clock: VirtualClock,
    job: str,
    *,
    machine: str | None = None,
    ttl_s: float = 3600.0,
    attempt: int = 1,
):  # type: ignore[no-untyped-def]
    offers = market.search_offers(OfferQuery(limit=0))
    offer = next(o for o in offers if machine is None or o.machine_id == machine)
    plan = rentals.plan(
        job=job,
        attempt=attempt,
        offer=offer,
        disk_gb=10,
        ttl_s=ttl_s,
        now=clock.now(),
        reserve_usd=1.0,
        budget_name="default",
    )
    return rentals.execute(plan.id, market=market, spec=SPEC, now=clock.now())
