"""The supervisor's pure judgements: what a probe means, where a dead trainer goes, recovery statistics."""

from __future__ import annotations

from app.market import Offer
from app.policy.bootwatch import start_watch
from app.policy.provisioning import Attempt, GaveUp, JobState, Record, Stop
from app.policy.ranking import JobShape, Requirements
from app.policy.supervision import (
    HostProbe,
    SupervisorConfig,
    assess,
    percentile,
    recovery_summary,
    route_triage,
    stop_job,
)

CFG = SupervisorConfig()


def test_the_provider_saying_gone_is_a_loss_at_once() -> None:
    """An instance the provider reports gone is lost even before SSH has failed twice."""
    assert assess(HostProbe("gone", ssh_ok=False), ssh_failures=1, cfg=CFG).kind == "lost"
    assert assess(HostProbe("exited", ssh_ok=True, alive=True), ssh_failures=0, cfg=CFG).kind == "lost"


def test_one_ssh_failure_is_not_a_loss() -> None:
    """A single failed SSH poll with the provider unsure is only 'ssh_down' (look again soon)."""
    assert assess(HostProbe("unknown", ssh_ok=False), ssh_failures=1, cfg=CFG).kind == "ssh_down"


def test_consecutive_ssh_failures_with_the_provider_unsure_are_a_loss() -> None:
    """SSH failing on two polls in a row while the provider reports unknown/stopped means lost."""
    for state in ("unknown", "stopped"):
        assert assess(HostProbe(state, ssh_ok=False), ssh_failures=2, cfg=CFG).kind == "lost"


def test_ssh_failing_while_the_provider_says_running_is_not_a_loss() -> None:
    """The provider still reports the host running: not lost (the stall window catches a host that never answers)."""
    assert assess(HostProbe("running", ssh_ok=False), ssh_failures=5, cfg=CFG).kind == "ssh_down"


def test_probe_outcomes_of_a_reachable_host() -> None:
    """Alive -> training; exit 3 -> slice done; exit 0 finished -> finished; anything else -> dead."""
    assert assess(HostProbe("running", True, alive=True, step=3), ssh_failures=0, cfg=CFG).kind == "training"
    assert assess(HostProbe("running", True, exit_code=3, phase="training"), ssh_failures=0, cfg=CFG).kind == "slice_done"
    assert assess(HostProbe("running", True, exit_code=0, phase="finished"), ssh_failures=0, cfg=CFG).kind == "finished"
    assert assess(HostProbe("running", True, exit_code=1, phase="failed"), ssh_failures=0, cfg=CFG).kind == "dead"
    assert assess(HostProbe("running", True, exit_code=None, phase="training"), ssh_failures=0, cfg=CFG).kind == "dead"


def test_triage_routes() -> None:
    """oom/stalled -> same host; cuda_fault, disk full, serving box -> replace; data error, divergence, bad job -> stop."""
    kw = {"same_host_restarts": 0, "cfg": CFG}
    assert route_triage("oom", "resume with a smaller micro-batch and more accumulation, same host", exit_code=1, **kw) == "same_host"
    assert route_triage("stalled", "restart the slice on the same host; replace the host if it repeats", exit_code=None, **kw) == "same_host"
    assert route_triage("cuda_fault", "replace the host, record it against the machine", exit_code=1, **kw) == "replace"
    assert route_triage("io_error", "replace the host (disk)", exit_code=5, **kw) == "replace"
    assert route_triage("io_error", "retry on the same host (network)", exit_code=1, **kw) == "same_host"
    assert route_triage("io_error", "stop the job, tell the operator (access denied: grant it or fix the credentials)",
                        exit_code=1, **kw) == "stop"
    assert route_triage("progressing", "continue", exit_code=4, **kw) == "replace"
    assert route_triage("data_error", "stop the job, tell the operator (a new host won't fix it)", exit_code=1, **kw) == "stop"
    assert route_triage("diverged", "stop the job, tell the operator (same config won't fix it)", exit_code=1, **kw) == "stop"
    assert route_triage("progressing", "continue", exit_code=2, **kw) == "stop"


def test_repeated_same_host_deaths_replace_the_host() -> None:
    """After max_same_host_restarts resumes on one host, the next death replaces it."""
    assert route_triage("oom", "same host", exit_code=1, same_host_restarts=CFG.max_same_host_restarts, cfg=CFG) == "replace"


def test_stop_job_stops_never_destroys_and_gives_up() -> None:
    """Giving up a training job stops its host, records the failure and says GaveUp; the job is failed."""
    offer = Offer(provider="sim", offer_id="m#1", machine_id="m", gpu_name="RTX 3090", num_gpus=1, gpu_ram_gb=24,
                  dph_total=0.1, storage_per_gb_month=None, inet_down_per_gb=None, inet_down_mbps=None,
                  reliability=None, cuda_max=None)
    att = Attempt(instance_id="i-1", machine_id="m", provider="sim", offer=offer, created_at=0.0,
                  watch=start_watch(created_at=0.0), held_work=True)
    job = JobState("job-1", Requirements(), JobShape(download_gb=1, train_s=60, disk_gb=10), phase="training", attempt=att)
    new, acts = stop_job(job, reason="training failed (data_error)", evidence="bad row")
    assert new.phase == "failed" and new.attempt is None and "data_error" in (new.failure or "")
    assert [type(a) for a in acts] == [Stop, Record, GaveUp]


def test_percentiles_and_summary() -> None:
    """Median and p90 by linear interpolation; empty input gives None."""
    assert percentile([], 50) is None
    assert percentile([7.0], 90) == 7.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert abs((percentile(list(range(11)), 90) or 0) - 9.0) < 1e-9
    assert recovery_summary([60.0, 480.0]) == {"resumed": 2, "median_s": 270.0, "p90_s": 438.0}
