"""The pull rate an attempt shows as it leaves its boot, in the cases the main tests leave undriven."""

from __future__ import annotations

from dataclasses import replace

from app.market import Offer
from app.policy.bootwatch import observe_boot, start_watch
from app.policy.fleet import pull_rate_seen
from app.policy.provisioning import Attempt, JobState, new_job
from app.policy.ranking import JobShape, Requirements

OFFER = Offer(
    provider="sim",
    offer_id="o1",
    machine_id="m1",
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


def booting(instance_id: str = "i-1") -> JobState:
    w = start_watch(created_at=0.0)
    w, _ = observe_boot(w, state="loading", status_line="Downloading 5.00/20.00 GB", now=50.0)
    att = Attempt(instance_id=instance_id, machine_id="m1", provider="sim", offer=OFFER, created_at=0.0, watch=w)
    job = new_job("job-1", req=Requirements(), shape=JobShape(download_gb=20.0, train_s=600.0, disk_gb=40.0))
    return replace(job, phase="booting", attempt=att)


def test_a_job_that_was_not_booting_shows_no_pull_rate() -> None:
    """Before a boot (queued) or after it (training), there is no pull to measure."""
    queued = new_job("job-1", req=Requirements(), shape=JobShape(download_gb=20.0, train_s=600.0, disk_gb=40.0))
    assert pull_rate_seen(queued, booting(), now=60.0) is None
    training = replace(booting(), phase="training")
    assert pull_rate_seen(training, replace(training, phase="done"), now=60.0) is None


def test_a_boot_still_under_way_shows_no_rate_yet() -> None:
    """The same attempt still booting has not finished its pull: nothing to report."""
    assert pull_rate_seen(booting(), booting(), now=60.0) is None


def test_a_killed_pull_reports_the_rate_its_status_line_showed() -> None:
    """An attempt replaced mid-pull (lost, killed) reports 5 GB in 50 s: 0.1 GB/s, from its last status line."""
    gone = replace(booting(), phase="queued", attempt=None)
    assert pull_rate_seen(booting(), gone, now=60.0) == 0.1
    assert pull_rate_seen(booting(), booting("i-2"), now=60.0) == 0.1


def test_a_finished_boot_reports_its_download_over_create_to_running() -> None:
    """The same attempt leaving the boot at 100 s pulled 20 GB in 100 s: 0.2 GB/s."""
    assert pull_rate_seen(booting(), replace(booting(), phase="preflight"), now=100.0) == 0.2
