"""Offer rejections the main tests leave undriven: a provider the job does not allow, too few GPUs."""

from __future__ import annotations

from app.market import Offer
from app.policy.ranking import Requirements, offer_rejection


def offer(*, provider: str = "vast", num_gpus: int = 1) -> Offer:
    return Offer(
        provider=provider,
        offer_id="o1",
        machine_id="m1",
        gpu_name="RTX 3090",
        num_gpus=num_gpus,
        gpu_ram_gb=24,
        dph_total=0.3,
        storage_per_gb_month=0.1,
        inet_down_per_gb=0.0,
        inet_down_mbps=800,
        reliability=0.99,
        cuda_max="12.4",
    )


def test_an_offer_from_a_provider_the_job_does_not_allow_is_rejected() -> None:
    """A job limited to RunPod rejects a Vast offer, naming the provider; the same offer passes unrestricted."""
    assert offer_rejection(offer(), Requirements(providers=("runpod",)), now=0.0) == "provider vast not allowed"
    assert offer_rejection(offer(), Requirements(providers=("runpod", "vast")), now=0.0) is None


def test_an_offer_with_fewer_gpus_than_the_job_needs_is_rejected() -> None:
    """A one-GPU offer cannot serve a job that needs two."""
    assert offer_rejection(offer(num_gpus=1), Requirements(num_gpus=2), now=0.0) == "1 GPUs < 2"
    assert offer_rejection(offer(num_gpus=2), Requirements(num_gpus=2), now=0.0) is None
