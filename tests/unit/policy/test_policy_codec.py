"""The job state round-trips through the codec, and rows written by earlier versions still load."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from app.market import Offer
from app.policy.bootwatch import BootWatch
from app.policy.codec import dump_job, load_job
from app.policy.provisioning import Attempt, JobState
from app.policy.ranking import JobShape, Requirements

finite = st.floats(min_value=-1e9, max_value=1e9, allow_nan=False, allow_infinity=False)
positive = st.floats(min_value=0, max_value=1e7, allow_nan=False, allow_infinity=False)
maybe = st.one_of(st.none(), finite)
text = st.text(max_size=12)
pair = st.one_of(st.none(), st.tuples(finite, finite))

offers = st.builds(
    Offer,
    provider=st.sampled_from(["vast", "runpod", "sim"]),
    offer_id=text,
    machine_id=st.one_of(st.none(), text),
    gpu_name=text,
    num_gpus=st.integers(1, 8),
    gpu_ram_gb=positive,
    dph_total=positive,
    storage_per_gb_month=st.one_of(st.none(), positive),
    inet_down_per_gb=st.one_of(st.none(), positive),
    inet_down_mbps=st.one_of(st.none(), positive),
    reliability=st.one_of(st.none(), st.floats(0, 1)),
    cuda_max=st.one_of(st.none(), text),
)
watches = st.builds(
    BootWatch,
    created_at=finite,
    last_line=st.one_of(st.none(), text),
    last_change_at=maybe,
    first_seen_at=maybe,
    intervals=st.lists(positive, max_size=4).map(tuple),
    first_progress=pair,
    last_progress=pair,
    total_gb=st.one_of(st.none(), positive),
    unknown_since=maybe,
    polls=st.integers(0, 1000),
)
attempts = st.builds(
    Attempt,
    instance_id=text,
    machine_id=text,
    provider=text,
    offer=offers,
    created_at=finite,
    watch=watches,
    held_work=st.booleans(),
    preflight_started_at=maybe,
    training_started_at=maybe,
    last_progress_at=maybe,
    last_work_s=positive,
    trouble_since=maybe,
    trouble=st.one_of(st.none(), st.tuples(text, text)),
)
states = st.builds(
    JobState,
    job_id=text,
    req=st.builds(
        Requirements,
        gpu_names=st.lists(text, max_size=3).map(tuple),
        min_gpu_ram_gb=positive,
        num_gpus=st.integers(1, 8),
        min_reliability=st.floats(0, 1),
        reliability_floor_soft=st.booleans(),
        min_inet_down_mbps=positive,
        max_dph=st.one_of(st.none(), positive),
        providers=st.lists(text, max_size=3).map(tuple),
    ),
    shape=st.builds(JobShape, download_gb=positive, train_s=positive, disk_gb=positive, overhead_s=positive),
    phase=st.sampled_from(["queued", "booting", "preflight", "training", "done", "failed"]),
    creates=st.integers(0, 100),
    failures_in_row=st.integers(0, 100),
    attempt=st.one_of(st.none(), attempts),
    excluded=st.frozensets(text, max_size=4),
    not_before=finite,
    checkpoint_work_s=positive,
    lost_at=maybe,
    lost_cause=st.one_of(st.none(), text),
    lost_machine=st.one_of(st.none(), text),
    failure=st.one_of(st.none(), text),
    waiting_since=maybe,
    standby=st.booleans(),
    progress_hedges=st.integers(0, 10),
    rentals_max=st.one_of(st.none(), st.integers(1, 10)),
)


@settings(max_examples=300, deadline=None)
@given(job=states)
def test_every_state_round_trips_through_json(job: JobState) -> None:
    """load_job(json(dump_job(s))) == s for any state, every field included."""
    assert load_job(json.loads(json.dumps(dump_job(job)))) == job


def test_the_codec_names_every_field_of_the_state() -> None:
    """A field added to JobState or Attempt without the codec learning it fails here."""
    job = JobState(
        job_id="j",
        req=Requirements(),
        shape=JobShape(download_gb=1.0, train_s=2.0, disk_gb=3.0),
        standby=True,
        progress_hedges=2,
        rentals_max=1,
    )
    dumped = dump_job(job)
    assert set(dumped) == set(JobState.__dataclass_fields__)
    back = load_job(dumped)
    assert (back.standby, back.progress_hedges, back.rentals_max) == (True, 2, 1)


# A row as an earlier version wrote it: no standby, progress_hedges or rentals_max.
EARLIER_ROW = {
    "job_id": "job-1",
    "phase": "booting",
    "creates": 1,
    "failures_in_row": 0,
    "excluded": ["m-1"],
    "not_before": 0.0,
    "checkpoint_work_s": 0.0,
    "lost_at": None,
    "lost_cause": None,
    "lost_machine": None,
    "failure": None,
    "waiting_since": None,
    "req": {
        "gpu_names": ["RTX 3090"],
        "min_gpu_ram_gb": 24.0,
        "num_gpus": 1,
        "min_reliability": 0.98,
        "reliability_floor_soft": True,
        "min_inet_down_mbps": 0.0,
        "max_dph": 0.6,
        "providers": ["sim"],
    },
    "shape": {"download_gb": 3.0, "train_s": 120.0, "disk_gb": 40.0, "overhead_s": 120.0},
    "attempt": {
        "instance_id": "sim-4",
        "machine_id": "m-good",
        "provider": "sim",
        "created_at": 100.0,
        "held_work": False,
        "preflight_started_at": None,
        "training_started_at": None,
        "last_progress_at": None,
        "last_work_s": 0.0,
        "trouble_since": None,
        "trouble": None,
        "offer": {
            "provider": "sim",
            "offer_id": "m-good#1",
            "machine_id": "m-good",
            "gpu_name": "RTX 3090",
            "num_gpus": 1,
            "gpu_ram_gb": 24.0,
            "dph_total": 0.11,
            "storage_per_gb_month": 0.15,
            "inet_down_per_gb": 0.0,
            "inet_down_mbps": 400.0,
            "reliability": 0.995,
            "cuda_max": "12.4",
        },
        "watch": {
            "created_at": 100.0,
            "last_line": "Downloading 0.50/3.00 GB",
            "last_change_at": 110.0,
            "first_seen_at": 110.0,
            "intervals": [10.0],
            "first_progress": [110.0, 0.5],
            "last_progress": [110.0, 0.5],
            "total_gb": 3.0,
            "unknown_since": None,
            "polls": 1,
        },
    },
}


def test_a_row_written_before_standby_fields_existed_still_loads() -> None:
    """Missing newer fields take their defaults; everything present is restored."""
    job = load_job(EARLIER_ROW)
    assert job.phase == "booting" and job.attempt is not None and job.attempt.instance_id == "sim-4"
    assert (job.standby, job.progress_hedges, job.rentals_max) == (False, 0, None)
    assert job.excluded == frozenset({"m-1"}) and job.req.gpu_names == ("RTX 3090",)
    assert load_job(dump_job(job)) == job
