"""Billing invariants of the simulated marketplace hold for any sequence of operator actions."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from app.market import LaunchSpec, OfferQuery
from providers.sim import SimMarket, VirtualClock
from providers.sim.trace import TRACE_FORMAT, parse_trace

ACTIONS = st.lists(
    st.tuples(st.sampled_from(["advance", "stop", "start", "destroy"]), st.floats(min_value=0, max_value=5000)),
    max_size=12,
)


@settings(max_examples=150, deadline=None)
@given(actions=ACTIONS, dies_at=st.one_of(st.none(), st.floats(min_value=0, max_value=20000)))
def test_bills_never_shrink_and_gpu_time_fits_in_the_life(
    actions: list[tuple[str, float]], dies_at: float | None
) -> None:
    """GPU time never exceeds the instance's life; storage is the life's price; bills only grow."""
    trace = parse_trace(
        {
            "format": TRACE_FORMAT,
            "name": "p",
            "workload": {"image_gb": 2, "model_gb": 1, "disk_gb": 50},
            "hosts": [
                {
                    "machine_id": "m",
                    "offer": {
                        "gpu_name": "RTX 3090",
                        "gpu_ram_gb": 24,
                        "dph": 0.5,
                        "storage_per_gb_month": 0.2,
                        "inet_down_per_gb": 0.1,
                    },
                    "truth": {"pull_mbps": 400, "dies_at_s": dies_at},
                }
            ],
        }
    )
    clock = VirtualClock(start_s=0.0)
    market = SimMarket(trace, clock)
    iid = market.create(
        market.search_offers(OfferQuery())[0], LaunchSpec(image="i", disk_gb=0, label="l", ssh_public_key="k")
    )
    last = 0.0
    for action, seconds in actions:
        if action == "advance":
            clock.advance(seconds)
        elif action == "stop":
            market.stop(iid)
        elif action == "start":
            try:
                market.start(iid)
            except Exception:
                assert market.status(iid).state == "gone"
        else:
            market.destroy(iid)
        bill = market.referee.bill(iid)
        end = clock.now() if bill.ended_at is None else min(clock.now(), bill.ended_at)
        life_s = end - bill.created_at
        assert -1e-9 <= bill.gpu_seconds <= life_s + 1e-9
        assert abs(bill.storage_usd - 0.2 * 50 * life_s / 3600 / 720) < 1e-9
        assert bill.downloaded_gb <= 3.0 + 1e-9
        assert bill.total_usd >= last - 1e-12
        last = bill.total_usd
        if dies_at is not None and clock.now() >= dies_at:
            assert market.status(iid).state == "gone" and bill.ended_at is not None and bill.ended_at <= dies_at + 1e-9
