"""The operator's cancel and reopen on a job's provisioning state (`app.policy.lifecycle`)."""

from __future__ import annotations

from dataclasses import replace

from app.market import Offer
from app.policy.bootwatch import start_watch
from app.policy.lifecycle import cancel_job, is_cancelled, reopen_job
from app.policy.provisioning import Attempt, GaveUp, JobState, Stop, Tick, decide, guarded_config
from app.policy.ranking import JobShape, Requirements

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


def _job(phase: str = "training", *, held_work: bool = False) -> JobState:
    att = Attempt("i-1", "m", "sim", OFFER, 0.0, start_watch(created_at=0.0), held_work=held_work)
    return JobState("job-1", Requirements(), JobShape(download_gb=1, train_s=60, disk_gb=10), phase=phase, attempt=att)  # type: ignore[arg-type]


def test_cancel_stops_the_host_whatever_it_held_and_ends_the_job() -> None:
    """A cancel stops the host (never a destroy, even one that never held work) and ends the job failed."""
    for held in (True, False):
        ended, acts = cancel_job(_job("booting", held_work=held), reason="wrong data")
        assert acts == [Stop("job-1", "i-1", "m", "cancelled", "wrong data"), GaveUp("job-1", "cancelled: wrong data")]
        assert ended.phase == "failed" and ended.attempt is None and is_cancelled(ended)


def test_a_queued_job_cancels_with_nothing_to_stop_and_then_decides_nothing() -> None:
    """A job between attempts has no host to stop; once cancelled, a tick rents nothing."""
    ended, acts = cancel_job(replace(_job("queued"), attempt=None), reason="operator")
    assert acts == [GaveUp("job-1", "cancelled: operator")]
    assert decide(ended, Tick(), 0.0, cfg=guarded_config()) == (ended, [])


def test_only_a_cancel_reads_as_cancelled() -> None:
    """A failure of another kind, or a job that still runs, is not cancelled."""
    assert not is_cancelled(replace(_job(), phase="failed", failure="budget cap reached: job-1"))
    assert not is_cancelled(_job())


def test_reopen_queues_the_job_keeping_what_it_learnt() -> None:
    """Reopened: queued, no attempt, no failure or recovery in flight; excluded machines and creates kept."""
    failed = replace(
        _job(),
        phase="failed",
        attempt=None,
        failure="cancelled: x",
        creates=3,
        excluded=frozenset({"m-bad"}),
        lost_at=5.0,
        lost_cause="lost",
        lost_machine="m-bad",
        waiting_since=2.0,
        failures_in_row=2,
        not_before=9.0,
        progress_hedges=1,
    )
    job = reopen_job(failed)
    assert job.phase == "queued" and job.attempt is None and job.failure is None
    assert job.creates == 3 and job.excluded == frozenset({"m-bad"})
    assert (job.lost_at, job.lost_cause, job.lost_machine, job.waiting_since) == (None, None, None, None)
    assert (job.failures_in_row, job.not_before, job.progress_hedges) == (0, 0.0, 0)
