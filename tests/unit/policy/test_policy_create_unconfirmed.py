"""A create whose answer was lost is not a failed create: the job waits and looks again, renting nothing new."""

from __future__ import annotations

from app.market import Offer
from app.policy.provisioning import CreateResult, WakeAt, decide, guarded_config, new_job
from app.policy.ranking import JobShape, Requirements

CFG = guarded_config()
OFFER = Offer(provider="vast", offer_id="o1", machine_id="m1", gpu_name="RTX 3090", num_gpus=1, gpu_ram_gb=24,
              dph_total=0.2, storage_per_gb_month=0.1, inet_down_per_gb=0.0, inet_down_mbps=800, reliability=0.99,
              cuda_max="12.4")  # fmt: skip


def test_unconfirmed_create_waits_for_the_label_lookup() -> None:
    """The job stays queued, counts no create, and is woken after the confirm poll, not at once."""
    job = new_job("job-1", req=Requirements(), shape=JobShape(download_gb=1.0, train_s=60.0, disk_gb=10.0))
    after, acts = decide(job, CreateResult(OFFER, None, "504 after sending", unconfirmed=True), 100.0, cfg=CFG)
    assert after.phase == "queued" and after.creates == job.creates and after.attempt is None
    assert acts == [WakeAt("job-1", 100.0 + CFG.create_confirm_poll_s)]


def test_a_refused_create_still_tries_the_next_offer_at_once() -> None:
    """A clear refusal (not unconfirmed) keeps today's answer: look again now."""
    job = new_job("job-1", req=Requirements(), shape=JobShape(download_gb=1.0, train_s=60.0, disk_gb=10.0))
    _, acts = decide(job, CreateResult(OFFER, None, "offer gone"), 100.0, cfg=CFG)
    assert acts == [WakeAt("job-1", 100.0)]
