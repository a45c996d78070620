"""SQL statements counted on an engine, and a fleet of live rentals to count them against."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, event

from app.market import LaunchSpec, OfferQuery
from app.rentals import Rental, Rentals

__all__ = ["add_live_rentals", "counting"]


@contextmanager
def counting(engine: Engine) -> Iterator[Counter[str]]:
    """Every statement sent on `engine` while inside, counted by its text (whitespace folded)."""
    seen: Counter[str] = Counter()

    def note(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen[" ".join(statement.split())] += 1

    event.listen(engine, "before_cursor_execute", note)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", note)


def add_live_rentals(
    rentals: Rentals, n: int, *, now: float, cap: str | None = None, prefix: str = "other"
) -> list[Rental]:
    """`n` other jobs, each with an active rental on a simulated host of its own; each reserves under
    a cap of its own (`<prefix>-<i>`, $50), or all under `cap` when given."""
    from providers.sim import SimMarket, VirtualClock
    from providers.sim.trace import parse_trace

    offer = {"gpu_name": "RTX 3090", "num_gpus": 1, "gpu_ram_gb": 24, "inet_down_mbps": 800, "reliability": 0.995}
    hosts = [
        {"machine_id": f"{prefix}-m-{i}", "offer": {**offer, "dph": 0.2 + i / 100_000}, "truth": {}} for i in range(n)
    ]
    clock = VirtualClock()
    clock.set(now)
    market = SimMarket(
        parse_trace({"format": "tuneharness-market-trace/1", "name": prefix, "workload": {}, "hosts": hosts}), clock
    )
    spec = LaunchSpec(image="img", disk_gb=10, label="", ssh_public_key="ssh-ed25519 k")
    made = []
    for i, o in enumerate(market.search_offers(OfferQuery(limit=0))[:n]):
        job = f"{prefix}-{i}"
        budget_name = cap or job
        if cap is None:
            rentals.budget.set_cap(budget_name, 50.0)
        plan = rentals.plan(
            job=job, attempt=1, offer=o, disk_gb=10, ttl_s=86_400, now=now, reserve_usd=1.0, budget_name=budget_name
        )
        made.append(rentals.execute(plan.id, market=market, spec=spec, now=now))
    return made
