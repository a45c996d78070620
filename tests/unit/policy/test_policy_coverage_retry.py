"""Retry arithmetic the main tests leave undriven: hedging on a market that always delivers, a held host's offer."""

from __future__ import annotations

from app.policy.retry import HeldHost, hedge_chains


def test_a_market_that_always_delivers_or_a_zero_target_needs_the_fewest_chains() -> None:
    """Certain delivery, or no delivery probability asked for, runs only `at_least` chains."""
    assert hedge_chains(delivery_rate=1.0, first_try_p=0.9, at_least=2, at_most=6) == 2
    assert hedge_chains(delivery_rate=0.3, first_try_p=0.0, at_least=2, at_most=6) == 2
    assert hedge_chains(delivery_rate=0.3, first_try_p=0.9, at_least=2, at_most=6) == 6


def test_a_held_host_is_rented_as_an_offer_with_its_gpu_and_rate_only() -> None:
    """The offer a job adopts a held host through carries its GPU, VRAM and rate; nothing else is known."""
    h = HeldHost(
        instance_id="i-9",
        machine_id="m-9",
        provider="vast",
        gpu_name="RTX 4090",
        gpu_ram_gb=24.0,
        num_gpus=1,
        dph_total=0.4,
        held_since=0.0,
        hold_until=600.0,
    )
    o = h.as_offer()
    assert (o.provider, o.offer_id, o.machine_id) == ("vast", "held:i-9", "m-9")
    assert (o.gpu_name, o.gpu_ram_gb, o.num_gpus, o.dph_total) == ("RTX 4090", 24.0, 1, 0.4)
    assert o.storage_per_gb_month is None and o.inet_down_per_gb is None and o.reliability is None
