"""A job the operator resumes after it failed at its create cap may rent again: the cap counts the
creates since the reopening, while attempt numbers keep counting from every create it made."""

from __future__ import annotations

from dataclasses import replace

from app.market import Offer
from app.policy.codec import dump_job, load_job
from app.policy.lifecycle import reopen_job
from app.policy.provisioning import Create, GaveUp, MarketView, Tick, decide, guarded_config, new_job
from app.policy.ranking import JobShape, Requirements

CFG = guarded_config()
OFFER = Offer(
    provider="sim",
    offer_id="m#1",
    machine_id="m",
    gpu_name="RTX 3090",
    num_gpus=1,
    gpu_ram_gb=24,
    dph_total=0.1,
    storage_per_gb_month=None,
    inet_down_per_gb=None,
    inet_down_mbps=None,
    reliability=None,
    cuda_max=None,
)


def _at_cap() -> tuple[object, object]:
    job = replace(
        new_job("job-1", req=Requirements(), shape=JobShape(download_gb=1, train_s=60, disk_gb=10)),
        creates=CFG.max_creates_per_job,
    )
    return decide(job, Tick(MarketView(offers=[OFFER])), 0.0, cfg=CFG)


def test_a_job_at_its_cap_gives_up_and_once_reopened_creates_again() -> None:
    failed, acts = _at_cap()
    assert failed.phase == "failed" and isinstance(acts[0], GaveUp)  # type: ignore[attr-defined]
    reopened = reopen_job(failed)  # type: ignore[arg-type]
    assert reopened.creates_before_reopen == CFG.max_creates_per_job == reopened.creates
    job, acts = decide(reopened, Tick(MarketView(offers=[OFFER])), 0.0, cfg=CFG)
    assert [type(a) for a in acts] == [Create] and job.phase == "queued"


def test_after_a_reopening_the_cap_is_a_full_cap_again_not_more() -> None:
    failed, _ = _at_cap()
    reopened = reopen_job(failed)  # type: ignore[arg-type]
    spent = replace(reopened, creates=reopened.creates + CFG.max_creates_per_job)
    again, acts = decide(spent, Tick(MarketView(offers=[OFFER])), 0.0, cfg=CFG)
    assert again.phase == "failed" and isinstance(acts[0], GaveUp)


def test_the_reopening_survives_the_stored_state() -> None:
    failed, _ = _at_cap()
    reopened = reopen_job(failed)  # type: ignore[arg-type]
    assert load_job(dump_job(reopened)).creates_before_reopen == CFG.max_creates_per_job
    d = dump_job(reopened)
    del d["creates_before_reopen"]  # a state stored before the field existed
    assert load_job(d).creates_before_reopen == 0
