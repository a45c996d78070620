"""The provisioning state machine: decisions, not effects, driven by hand without a clock."""

from __future__ import annotations

from dataclasses import replace

from app.market import Instance, Offer
from app.policy.preflight import PreflightReport
from app.policy.provisioning import (
    Adopt,
    BudgetCapReached,
    Create,
    CreateResult,
    Destroy,
    FailureSeen,
    Finished,
    GaveUp,
    Hold,
    JobState,
    MarketView,
    Polled,
    PreflightResult,
    Record,
    Recovered,
    RecoveryProgress,
    RunPreflight,
    StartTraining,
    Stop,
    Tick,
    TrainerStatus,
    WakeAt,
    WantStandby,
    decide,
    guarded_config,
    hand_over,
    naive_config,
    new_job,
)
from app.policy.ranking import JobShape, Requirements
from app.policy.reputation import MachineRecord, record_failure
from app.policy.retry import HeldHost

CFG = guarded_config()
SHAPE = JobShape(download_gb=23.0, train_s=600.0, disk_gb=60.0)


def offer(oid: str, dph: float = 0.2) -> Offer:
    return Offer(provider="sim", offer_id=oid, machine_id=f"m-{oid}", gpu_name="RTX 3090", num_gpus=1, gpu_ram_gb=24,
                 dph_total=dph, storage_per_gb_month=0.1, inet_down_per_gb=0.0, inet_down_mbps=800, reliability=0.99,
                 cuda_max="12.4")


def inst(state: str, line: str | None = None, util: float | None = None) -> Instance:
    return Instance(provider="sim", instance_id="i-1", machine_id="m-a", label="th", state=state,  # type: ignore[arg-type]
                    status_line=line, ssh=None, gpu_util=util, dph_total=0.2, started_at=0.0)


def job() -> JobState:
    return new_job("job-1", req=Requirements(), shape=SHAPE)


def booting() -> JobState:
    j, acts = decide(job(), Tick(MarketView(offers=[offer("a"), offer("b", 0.5)])), 0.0, cfg=CFG)
    create = acts[0]
    assert isinstance(create, Create)
    j, _ = decide(j, CreateResult(create.offer, "i-1"), 0.0, cfg=CFG)
    return j


def training() -> JobState:
    j = booting()
    j, _ = decide(j, Polled(inst("running", "running")), 300.0, cfg=CFG)
    report = PreflightReport.from_mapping({"cuda_initialised": True, "matmul_finite": True, "gpu_name": "RTX 3090",
                                           "vram_gb": 24, "tflops_bf16": 71.0})
    j, _ = decide(j, PreflightResult(report), 315.0, cfg=CFG)
    assert j.phase == "training"
    return j


def test_queued_job_creates_the_best_offer() -> None:
    """A queued job asks to rent the offer with the lowest cost per delivered job."""
    _, acts = decide(job(), Tick(MarketView(offers=[offer("b", 0.5), offer("a")])), 0.0, cfg=CFG)
    assert isinstance(acts[0], Create) and acts[0].offer.offer_id == "a" and "per delivered job" in acts[0].why


def test_quarantined_machine_is_not_picked() -> None:
    """A machine in quarantine is skipped for the next offer."""
    recs = {"m-a": record_failure(MachineRecord("m-a"), reason="no_compute", now=0.0)}
    _, acts = decide(job(), Tick(MarketView(offers=[offer("a"), offer("b", 0.5)], records=recs)), 1.0, cfg=CFG)
    assert isinstance(acts[0], Create) and acts[0].offer.offer_id == "b"


def test_created_instance_is_watched() -> None:
    """After a create the job boots, records the create and polls within the poll interval."""
    j, acts = decide(job(), CreateResult(offer("a"), "i-1"), 0.0, cfg=CFG)
    assert j.phase == "booting" and j.creates == 1
    assert any(isinstance(a, Record) and a.event == "create" for a in acts)
    assert WakeAt("job-1", CFG.boot.poll_s) in acts


def test_offer_gone_retries_at_once() -> None:
    """A create that failed (offer taken) costs nothing and the job looks again now."""
    j, acts = decide(job(), CreateResult(offer("a"), None, "gone"), 5.0, cfg=CFG)
    assert j.phase == "queued" and acts == [WakeAt("job-1", 5.0)]


def test_fatal_boot_is_destroyed_quarantined_and_requeued() -> None:
    """A fatal status line: destroy (never held work), record the failure, try again."""
    j, acts = decide(booting(), Polled(inst("loading", "OCI runtime create failed")), 10.0, cfg=CFG)
    assert j.phase == "queued" and "m-a" in j.excluded
    assert isinstance(acts[0], Destroy) and acts[0].reason == "boot_fatal"
    assert any(isinstance(a, Record) and a.event == "failure" and a.reason == "boot_fatal" for a in acts)


def test_running_host_goes_to_preflight() -> None:
    """A host that reaches running is preflighted before any work is pushed."""
    j, acts = decide(booting(), Polled(inst("running", "running")), 300.0, cfg=CFG)
    assert j.phase == "preflight"
    assert any(isinstance(a, RunPreflight) for a in acts)


def test_failed_preflight_destroys_with_the_named_failure() -> None:
    """A host that cannot compute is destroyed and recorded as no_compute."""
    j, _ = decide(booting(), Polled(inst("running", "running")), 300.0, cfg=CFG)
    bad = PreflightReport.from_mapping({"cuda_initialised": False, "error": "CUDA driver version is insufficient"})
    j, acts = decide(j, PreflightResult(bad), 315.0, cfg=CFG)
    assert j.phase == "queued"
    assert isinstance(acts[0], Destroy) and acts[0].reason == "no_compute"


def test_preflight_timeout() -> None:
    """No preflight answer within the timeout is a `timeout` failure."""
    j, _ = decide(booting(), Polled(inst("running", "running")), 300.0, cfg=CFG)
    j, acts = decide(j, Polled(inst("running", "running")), 300.0 + CFG.preflight_timeout_s, cfg=CFG)
    assert isinstance(acts[0], Destroy) and acts[0].reason == "timeout"


def test_passed_preflight_starts_training() -> None:
    """A verified host gets the job; from then on automation may only stop it."""
    j = training()
    assert j.attempt is not None and j.attempt.held_work


def test_finished_job_holds_the_host() -> None:
    """A finished job keeps its verified host for the next compatible job."""
    j, acts = decide(training(), TrainerStatus(inst("running", util=95), "finished", work_s=600.0), 1000.0, cfg=CFG)
    assert j.phase == "done"
    assert any(isinstance(a, Hold) and a.host.hold_until == 1000.0 + CFG.hold_s for a in acts)
    assert any(isinstance(a, Finished) for a in acts)


def test_lost_host_is_stopped_not_destroyed_and_the_job_resumes() -> None:
    """A host lost mid-run is stopped, recorded, and the job resumes from its checkpoint."""
    j, _ = decide(training(), TrainerStatus(inst("running", util=95), "training", work_s=350.0, checkpoint_work_s=300.0,
                                            heartbeat_at=700.0), 700.0, cfg=CFG)
    j, acts = decide(j, TrainerStatus(inst("gone"), None, heartbeat_at=710.0), 730.0, cfg=CFG)
    assert j.phase == "queued" and j.checkpoint_work_s == 300.0
    assert isinstance(acts[0], Stop) and not any(isinstance(a, Destroy) for a in acts)
    j, acts = decide(j, CreateResult(offer("b"), "i-2"), 730.0, cfg=CFG)
    j, _ = decide(j, Polled(inst("running", "running")), 1000.0, cfg=CFG)
    ok = PreflightReport.from_mapping({"cuda_initialised": True, "matmul_finite": True, "gpu_name": "RTX 3090",
                                       "vram_gb": 24, "tflops_bf16": 71.0})
    j, acts = decide(j, PreflightResult(ok), 1015.0, cfg=CFG)
    assert StartTraining("job-1", "i-2", 300.0) in acts
    rec = next(a for a in acts if isinstance(a, Recovered))
    assert (rec.cause, rec.lost_at, rec.resumed_at) == ("lost", 710.0, 1015.0)


def test_hang_is_detected_from_no_progress_and_idle_gpu() -> None:
    """No progress with the GPU idle for the idle stall window is a hang."""
    j = training()
    j, acts = decide(j, TrainerStatus(inst("running", util=0.0), "training", work_s=0.0), 315.0 + CFG.idle_stall_s, cfg=CFG)
    assert isinstance(acts[0], Stop) and acts[0].reason == "hang"


def test_naive_notices_a_dead_training_after_105_minutes() -> None:
    """The naive renter sees a failed trainer only 105 minutes later."""
    cfg = naive_config()
    j, acts = decide(job(), Tick(MarketView(offers=[offer("a")])), 0.0, cfg=cfg)
    j, _ = decide(j, CreateResult(offer("a"), "i-1"), 0.0, cfg=cfg)
    j, acts = decide(j, Polled(inst("running", "running")), 300.0, cfg=cfg)
    assert j.phase == "training" and not any(isinstance(a, RunPreflight) for a in acts)
    j, acts = decide(j, TrainerStatus(inst("running", util=0), "failed", heartbeat_at=330.0, error="CUDA"), 360.0, cfg=cfg)
    assert acts == [WakeAt("job-1", 330.0 + 105 * 60)]
    j, acts = decide(j, TrainerStatus(inst("running", util=0), "failed", heartbeat_at=330.0), 330.0 + 105 * 60, cfg=cfg)
    assert isinstance(acts[0], Destroy)


def test_oracle_failure_seen_acts_at_once() -> None:
    """A failure the driver reports (oracle) fails the boot immediately."""
    j, acts = decide(booting(), FailureSeen("boot_frozen", "oracle"), 25.0, cfg=CFG)
    assert j.phase == "queued" and isinstance(acts[0], Destroy)


def test_held_host_is_adopted_before_renting() -> None:
    """A verified held host is used before rolling the dice on a new offer."""
    h = HeldHost(instance_id="i-9", machine_id="m-9", provider="sim", gpu_name="RTX 3090", gpu_ram_gb=24, num_gpus=1,
                 dph_total=0.3, held_since=0.0, hold_until=600.0)
    _, acts = decide(job(), Tick(MarketView(offers=[offer("a")], held=[h])), 10.0, cfg=CFG)
    assert acts == [Adopt("job-1", h)]


def test_create_cap_gives_up() -> None:
    """A job that used up its creates gives up with the reason."""
    j = new_job("job-1", req=Requirements(), shape=SHAPE)
    from dataclasses import replace

    j = replace(j, creates=CFG.max_creates_per_job)
    j, acts = decide(j, Tick(MarketView(offers=[offer("a")])), 0.0, cfg=CFG)
    assert j.phase == "failed" and isinstance(acts[0], GaveUp)


def test_no_offer_waits_then_gives_up() -> None:
    """With nothing to rent the job looks again later, and gives up after the wait limit."""
    j, acts = decide(job(), Tick(MarketView()), 0.0, cfg=CFG)
    assert acts == [WakeAt("job-1", CFG.queue_retry_s)]
    j, acts = decide(j, Tick(MarketView()), CFG.max_offer_wait_s, cfg=CFG)
    assert j.phase == "failed" and isinstance(acts[0], GaveUp)


def test_budget_refusal_waits_then_gives_up() -> None:
    """A create the budget refused is retried later, not at once, and given up after the wait limit."""
    j, acts = decide(job(), CreateResult(offer("a"), None, "budget: cap reached"), 0.0, cfg=CFG)
    assert j.phase == "queued" and acts == [WakeAt("job-1", CFG.queue_retry_s)]
    j, acts = decide(j, CreateResult(offer("a"), None, "budget: cap reached"), CFG.max_offer_wait_s, cfg=CFG)
    assert j.phase == "failed" and isinstance(acts[0], GaveUp)



GOOD_REPORT = {"cuda_initialised": True, "matmul_finite": True, "gpu_name": "RTX 3090", "vram_gb": 24,
               "tflops_bf16": 71.0}


def lost() -> JobState:
    """A job whose host vanished mid-run, back in the queue."""
    j, _ = decide(training(), TrainerStatus(inst("gone"), None, heartbeat_at=700.0), 710.0, cfg=CFG)
    assert j.phase == "queued" and j.lost_at == 700.0
    return j


def test_a_standby_job_holds_its_verified_host_instead_of_training() -> None:
    """A standby job rents and verifies like any other, then holds the host (marked standby) and trains nothing."""
    j = new_job("standby-1", req=Requirements(), shape=SHAPE, standby=True)
    j, acts = decide(j, Tick(MarketView(offers=[offer("a")])), 0.0, cfg=CFG)
    create = acts[0]
    assert isinstance(create, Create)
    j, _ = decide(j, CreateResult(create.offer, "i-1"), 0.0, cfg=CFG)
    j, _ = decide(j, Polled(inst("running", "running")), 300.0, cfg=CFG)
    j, acts = decide(j, PreflightResult(PreflightReport.from_mapping(GOOD_REPORT)), 315.0, cfg=CFG)
    holds = [a for a in acts if isinstance(a, Hold)]
    assert j.phase == "done" and len(holds) == 1 and holds[0].host.standby
    assert not any(isinstance(a, StartTraining) for a in acts)


def test_standby_hosts_are_kept_for_recoveries() -> None:
    """A fresh job does not take a standby host while offers remain; a recovering job adopts it at once."""
    standby = HeldHost("i-9", "m-s", "sim", "RTX 3090", 24, 1, 0.3, 0.0, 10_000.0, standby=True)
    view = MarketView(offers=[offer("a")], held=[standby])
    _, acts = decide(job(), Tick(view), 10.0, cfg=CFG)
    assert isinstance(acts[0], Create)
    _, acts = decide(lost(), Tick(view), 710.0, cfg=CFG)
    assert acts == [Adopt("job-1", standby)]


def _records(delivered: int, duds: int) -> dict[str, MachineRecord]:
    """Our record of a marketplace: `delivered` machines that passed the preflight, `duds` that failed it."""
    recs = {f"g{i}": MachineRecord(machine_id=f"g{i}", provider="sim", creates=1, booted=1, preflight_passed=1)
            for i in range(delivered)}
    for i in range(duds):
        recs[f"d{i}"] = record_failure(MachineRecord(machine_id=f"d{i}", provider="sim", creates=1), reason="no_compute",
                                       now=0.0)
    return recs


def _hedge(records: dict[str, MachineRecord]) -> int:
    _, acts = decide(lost(), Tick(MarketView(offers=[offer("b")], records=records)), 710.0, cfg=CFG)
    want = [a for a in acts if isinstance(a, WantStandby)]
    assert isinstance(acts[0], Create) and len(want) == 1
    return want[0].count + 1


def test_a_recovery_with_no_verified_host_hedges_with_parallel_standby_jobs() -> None:
    """The first create of a recovery asks the driver for standby jobs: recovery_hedge chains in all
    at least, and more on a marketplace where we have seen most rentals fail."""
    reliable, unknown, hostile = _hedge(_records(40, 2)), _hedge({}), _hedge(_records(4, 20))
    assert reliable == CFG.recovery_hedge
    assert CFG.recovery_hedge <= unknown < hostile == CFG.recovery_hedge_max


def test_a_first_create_that_is_not_a_recovery_does_not_hedge() -> None:
    """A fresh job (nobody's work is waiting) rents one host at a time, whatever the dud rate."""
    _, acts = decide(job(), Tick(MarketView(offers=[offer("b")], records=_records(2, 20))), 10.0, cfg=CFG)
    assert not any(isinstance(a, WantStandby) for a in acts)


def test_naive_never_hedges() -> None:
    """The naive renter has one chain per job, even in a recovery."""
    j = replace(job(), lost_at=700.0, lost_cause="lost", lost_machine="m-x")
    _, acts = decide(j, Tick(MarketView(offers=[offer("b")], records=_records(2, 20))), 710.0, cfg=naive_config())
    assert not any(isinstance(a, WantStandby) for a in acts)


def test_hand_over_gives_a_booting_replacement_to_a_standby_job() -> None:
    """A recovering job whose replacement still boots hands that attempt to a standby job and re-queues."""
    j, acts = decide(lost(), Tick(MarketView(offers=[offer("b")])), 710.0, cfg=CFG)
    create = acts[0]
    assert isinstance(create, Create)
    j, _ = decide(j, CreateResult(create.offer, "i-2"), 710.0, cfg=CFG)
    moved = hand_over(j, standby_id="standby-1")
    assert moved is not None
    back, standby = moved
    assert back.phase == "queued" and back.attempt is None and back.lost_at == 700.0
    assert standby.standby and standby.phase == "booting" and standby.attempt == j.attempt
    assert hand_over(training(), standby_id="standby-2") is None


def test_budget_cap_stops_a_training_host_and_destroys_a_booting_one() -> None:
    """At the cap nothing is rented any more: a host that held work is stopped, one still booting is destroyed."""
    j, acts = decide(training(), BudgetCapReached("campaign budget $1.00"), 400.0, cfg=CFG)
    assert j.phase == "failed" and "budget cap" in (j.failure or "")
    assert isinstance(acts[0], Stop) and isinstance(acts[-1], GaveUp)
    j, acts = decide(booting(), BudgetCapReached("campaign budget $1.00"), 20.0, cfg=CFG)
    assert isinstance(acts[0], Destroy) and j.phase == "failed"
    j, acts = decide(job(), BudgetCapReached("campaign budget $1.00"), 0.0, cfg=CFG)
    assert acts == [GaveUp("job-1", "budget cap reached: campaign budget $1.00")]


def test_a_hung_trainer_with_an_idle_gpu_is_caught_in_a_minute() -> None:
    """No progress and an idle GPU for idle_stall_s (60 s) is a hang."""
    assert CFG.idle_stall_s == 60.0
    j = training()
    j, acts = decide(j, TrainerStatus(inst("running", util=95.0), "training", work_s=30.0), 345.0, cfg=CFG)
    j, acts = decide(j, TrainerStatus(inst("running", util=0.0), "training", work_s=30.0), 375.0, cfg=CFG)
    assert j.phase == "training"
    j, acts = decide(j, TrainerStatus(inst("running", util=0.0), "training", work_s=30.0), 405.0, cfg=CFG)
    assert j.phase == "queued" and j.lost_cause == "hang" and any(isinstance(a, Stop) for a in acts)


def _pulling(job_id: str, *, created_at: float, gb_per_s: float, now: float, standby: bool = True) -> JobState:
    """A chain whose host has pulled at `gb_per_s` since `created_at`, seen at `now`."""
    j = replace(new_job(job_id, req=Requirements(), shape=SHAPE, standby=standby), not_before=created_at)
    j, acts = decide(j, Tick(MarketView(offers=[offer(job_id)])), created_at, cfg=CFG)
    create = acts[0]
    assert isinstance(create, Create)
    j, _ = decide(j, CreateResult(create.offer, f"i-{job_id}"), created_at, cfg=CFG)
    line = f"Downloading {gb_per_s * (now - created_at):.2f}/23.00 GB"
    j, _ = decide(j, Polled(replace(inst("loading", line), instance_id=f"i-{job_id}")), now, cfg=CFG)
    assert j.phase == "booting"
    return j


def _waiting_recovery() -> JobState:
    """A recovery whose own replacement (created at 710 s) pulls at 0.02 GB/s: 1150 s for 23 GB."""
    j, acts = decide(lost(), Tick(MarketView(offers=[offer("b")])), 710.0, cfg=CFG)
    create = acts[0]
    assert isinstance(create, Create)
    j, _ = decide(j, CreateResult(create.offer, "i-2"), 710.0, cfg=CFG)
    j, _ = decide(j, Polled(replace(inst("loading", "Downloading 0.40/23.00 GB"), instance_id="i-2")), 730.0, cfg=CFG)
    return j


FAST = (0.08, 0.06, 0.07)  # GB/s seen on finished boots: a fresh rental pulls 23 GB in ~330 s
HEDGING = replace(CFG, progress_hedge_max=3)  # progress-aware hedging is off by default


def test_a_waiting_recovery_whose_chains_pull_slowly_rents_once_more_per_slow_chain() -> None:
    """Given a recovery whose own replacement and one hedge pull far slower than a fresh rental
    would (at the median rate observed), when the driver shows it its chains, then it asks for one
    single rental per slow chain, never destroys a slow chain, and asks nothing more next time."""
    j = _waiting_recovery()
    chains = (_pulling("standby-1", created_at=710.0, gb_per_s=0.021, now=730.0),
              _pulling("standby-2", created_at=710.0, gb_per_s=0.09, now=730.0))
    view = MarketView(pull_rates_gb_per_s=FAST)
    j2, acts = decide(j, RecoveryProgress(chains=chains, view=view), 730.0, cfg=HEDGING)
    assert acts == [WantStandby("job-1", 2, acts[0].why, rentals=1)]  # type: ignore[union-attr]
    assert j2.progress_hedges == 2 and j2.attempt == j.attempt
    _, again = decide(j2, RecoveryProgress(chains=chains, view=view), 740.0, cfg=HEDGING)
    assert again == []


def test_progress_hedging_is_bounded_and_needs_an_observed_rate() -> None:
    """At most progress_hedge_max extra rentals per recovery; with no pull rate observed anywhere,
    no chain is called slow; chains on pace ask for nothing; a job not recovering asks for nothing;
    the default configuration does not hedge on progress."""
    j = _waiting_recovery()
    slow = tuple(_pulling(f"standby-{i}", created_at=710.0, gb_per_s=0.02, now=730.0) for i in range(6))
    many_fast = MarketView(pull_rates_gb_per_s=FAST * 4)  # the slow chains' own rates count too
    _, acts = decide(j, RecoveryProgress(chains=slow, view=many_fast), 730.0, cfg=HEDGING)
    assert len(acts) == 1 and isinstance(acts[0], WantStandby) and acts[0].count == HEDGING.progress_hedge_max
    blind = replace(j, attempt=None, phase="queued")  # only the hedges' own (slow) rates are known
    _, acts = decide(blind, RecoveryProgress(chains=slow[:1]), 730.0, cfg=HEDGING)
    assert acts == []
    paced = tuple(_pulling(f"standby-{i}", created_at=710.0, gb_per_s=0.07, now=730.0) for i in range(3))
    _, acts = decide(blind, RecoveryProgress(chains=paced, view=MarketView(pull_rates_gb_per_s=FAST)), 730.0,
                     cfg=HEDGING)
    assert acts == []
    _, acts = decide(training(), RecoveryProgress(chains=slow, view=many_fast), 730.0, cfg=HEDGING)
    assert acts == []
    _, acts = decide(j, RecoveryProgress(chains=slow, view=many_fast), 730.0, cfg=CFG)  # the default: off
    assert acts == []


def test_a_single_extra_rental_that_meets_a_dud_does_not_retry() -> None:
    """A standby job allowed one rental ends after its host failed, instead of renting again."""
    j = replace(_pulling("standby-9", created_at=710.0, gb_per_s=0.05, now=730.0), rentals_max=1)
    j, acts = decide(j, Polled(replace(inst("loading", "Error: failed to pull image"), instance_id="i-standby-9")),
                     740.0, cfg=CFG)
    assert any(isinstance(a, Destroy) for a in acts) and j.phase == "queued"
    j, acts = decide(j, Tick(MarketView(offers=[offer("c")])), 740.0, cfg=CFG)
    assert j.phase == "done" and acts == []
