"""A budget refusal is its own observation: the job waits for money, then gives up naming the cap."""

from __future__ import annotations

from app.market import Offer
from app.policy.provisioning import (
    BudgetRefused,
    CreateResult,
    GaveUp,
    JobState,
    WakeAt,
    decide,
    guarded_config,
    new_job,
)
from app.policy.ranking import JobShape, Requirements

CFG = guarded_config()
OFFER = Offer(
    provider="sim",
    offer_id="a",
    machine_id="m-a",
    gpu_name="RTX 3090",
    num_gpus=1,
    gpu_ram_gb=24,
    dph_total=0.2,
    storage_per_gb_month=0.1,
    inet_down_per_gb=0.0,
    inet_down_mbps=800,
    reliability=0.99,
    cuda_max="12.4",
)


def _job() -> JobState:
    return new_job("job-1", req=Requirements(), shape=JobShape(download_gb=23.0, train_s=600.0, disk_gb=60.0))


def test_a_refused_reservation_waits_then_gives_up_naming_the_cap() -> None:
    """Nothing was rented: look again after queue_retry_s, give up after max_offer_wait_s."""
    j, acts = decide(_job(), BudgetRefused(OFFER, cap="day", detail="$9.90 of $10.00"), 0.0, cfg=CFG)
    assert j.phase == "queued" and acts == [WakeAt("job-1", CFG.queue_retry_s)]
    j, acts = decide(j, BudgetRefused(OFFER, cap="day"), CFG.max_offer_wait_s, cfg=CFG)
    assert j.phase == "failed" and isinstance(acts[0], GaveUp) and "day" in (j.failure or "")


def test_a_create_that_failed_for_any_other_reason_tries_the_next_offer_at_once() -> None:
    """An offer taken or a busy vendor cost nothing: no wait."""
    j, acts = decide(_job(), CreateResult(OFFER, None, "offer gone"), 5.0, cfg=CFG)
    assert j.phase == "queued" and acts == [WakeAt("job-1", 5.0)]
