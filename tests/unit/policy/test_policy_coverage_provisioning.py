"""Provisioning decisions the main tests leave undriven, each driven by hand without a clock."""

from __future__ import annotations

from dataclasses import replace

from app.market import Instance, Offer
from app.policy.preflight import PreflightReport
from app.policy.provisioning import (
    Adopted,
    BudgetRefused,
    Create,
    CreateResult,
    Destroy,
    FailureSeen,
    Finished,
    JobState,
    MarketView,
    Polled,
    PreflightResult,
    Record,
    Recovered,
    StartTraining,
    Stop,
    Tick,
    TrainerStatus,
    WakeAt,
    decide,
    guarded_config,
    hedge_width,
    new_job,
    oracle_config,
    slow_chains,
)
from app.policy.ranking import JobShape, Requirements
from app.policy.retry import HeldHost

CFG = guarded_config()
SHAPE = JobShape(download_gb=23.0, train_s=600.0, disk_gb=60.0)


def offer(oid: str = "a", dph: float = 0.2) -> Offer:
    return Offer(
        provider="sim",
        offer_id=oid,
        machine_id=f"m-{oid}",
        gpu_name="RTX 3090",
        num_gpus=1,
        gpu_ram_gb=24,
        dph_total=dph,
        storage_per_gb_month=0.1,
        inet_down_per_gb=0.0,
        inet_down_mbps=800,
        reliability=0.99,
        cuda_max="12.4",
    )


def inst(state: str, line: str | None = None, util: float | None = None) -> Instance:
    return Instance(
        provider="sim",
        instance_id="i-1",
        machine_id="m-a",
        label="th",
        state=state,  # type: ignore[arg-type]
        status_line=line,
        ssh=None,
        gpu_util=util,
        dph_total=0.2,
        started_at=0.0,
    )


def queued() -> JobState:
    return new_job("job-1", req=Requirements(), shape=SHAPE)


def booting() -> JobState:
    j, acts = decide(queued(), Tick(MarketView(offers=[offer()])), 0.0, cfg=CFG)
    assert isinstance(acts[0], Create)
    j, _ = decide(j, CreateResult(acts[0].offer, "i-1"), 0.0, cfg=CFG)
    assert j.phase == "booting"
    return j


def preflight() -> JobState:
    j, _ = decide(booting(), Polled(inst("running", "running")), 300.0, cfg=CFG)
    assert j.phase == "preflight"
    return j


def training() -> JobState:
    report = PreflightReport.from_mapping(
        {"cuda_initialised": True, "matmul_finite": True, "gpu_name": "RTX 3090", "vram_gb": 24, "tflops_bf16": 71.0}
    )
    j, _ = decide(preflight(), PreflightResult(report), 315.0, cfg=CFG)
    assert j.phase == "training"
    return j


def held(instance_id: str = "i-held") -> HeldHost:
    return HeldHost(
        instance_id=instance_id,
        machine_id="m-held",
        provider="sim",
        gpu_name="RTX 3090",
        gpu_ram_gb=24,
        num_gpus=1,
        dph_total=0.2,
        held_since=50.0,
        hold_until=700.0,
    )


def test_the_oracle_differs_from_guarded_only_in_seeing_failures_at_once() -> None:
    """The oracle makes guarded choices; only its driver reports each failure at its physical instant."""
    oracle = oracle_config()
    assert oracle.name == "oracle" and oracle.failures_seen_at_once
    assert replace(oracle, name="guarded", failures_seen_at_once=False) == CFG


def test_a_finished_or_failed_job_ignores_every_observation() -> None:
    """A job that is done or failed rents nothing more, whatever the driver reports."""
    for phase in ("done", "failed"):
        j = replace(queued(), phase=phase)
        assert decide(j, Tick(MarketView(offers=[offer()])), 0.0, cfg=CFG) == (j, [])
        assert decide(j, Adopted(held()), 0.0, cfg=CFG) == (j, [])


def test_a_queued_job_adopting_a_held_host_trains_on_it_at_once() -> None:
    """Adopting a verified host skips boot and preflight: training starts on that instance, which now holds work."""
    j, acts = decide(queued(), Adopted(held()), 100.0, cfg=CFG)
    assert j.phase == "training" and j.attempt is not None
    assert (j.attempt.instance_id, j.attempt.machine_id, j.attempt.held_work) == ("i-held", "m-held", True)
    assert j.attempt.created_at == 50.0 and j.attempt.offer.offer_id == "held:i-held"
    assert acts == [StartTraining("job-1", "i-held", 0.0), WakeAt("job-1", 100.0 + CFG.monitor_s)]


def test_a_recovery_adopting_a_held_host_records_the_recovery() -> None:
    """A job whose host was lost resumes from its checkpoint on the adopted host, and the recovery is recorded."""
    lost = replace(queued(), lost_at=40.0, lost_cause="hang", lost_machine="m-old", checkpoint_work_s=120.0)
    j, acts = decide(lost, Adopted(held()), 100.0, cfg=CFG)
    assert j.lost_at is None and j.phase == "training"
    assert acts[:2] == [StartTraining("job-1", "i-held", 120.0), Recovered("job-1", "m-old", "hang", 40.0, 100.0)]


def test_an_adoption_reaching_a_job_no_longer_queued_is_ignored() -> None:
    """A job that already rented its own host does not take a second one."""
    j = booting()
    assert decide(j, Adopted(held()), 10.0, cfg=CFG) == (j, [])


def test_a_queued_job_in_backoff_waits_until_its_not_before() -> None:
    """A job backing off after failures creates nothing before its not_before and wakes at it."""
    j = replace(queued(), not_before=90.0)
    assert decide(j, Tick(MarketView(offers=[offer()])), 30.0, cfg=CFG) == (j, [WakeAt("job-1", 90.0)])


def test_a_budget_refusal_for_a_job_that_already_rents_is_ignored() -> None:
    """A late budget refusal cannot fail or re-queue a job whose create already went through."""
    j = booting()
    assert decide(j, BudgetRefused(offer(), cap="day"), 5.0, cfg=CFG) == (j, [])


def test_without_hedging_a_recovery_runs_one_chain() -> None:
    """recovery_hedge 1 (or 0) means one chain whatever the market's dud rate."""
    assert hedge_width(replace(CFG, recovery_hedge=1), {}) == 1
    assert hedge_width(replace(CFG, recovery_hedge=0), {}) == 1


def test_no_chain_is_slow_before_any_pull_rate_was_observed() -> None:
    """With no pull rate seen anywhere, no chain can be judged slower than a fresh rental."""
    assert slow_chains([booting()], download_gb=23.0, rates_gb_per_s=[], now=100.0, margin_s=60.0) == 0


def test_a_failed_attempt_that_held_work_is_stopped_never_destroyed() -> None:
    """Even a boot-phase failure stops, not destroys, an instance that has held the user's work (money invariant 3)."""
    j = booting()
    assert j.attempt is not None
    j = replace(j, attempt=replace(j.attempt, held_work=True))
    j2, acts = decide(j, FailureSeen("boot_frozen", "line still"), 20.0, cfg=CFG)
    assert acts[0] == Stop("job-1", "i-1", "m-a", "boot_frozen", "line still")
    assert not any(isinstance(a, Destroy) for a in acts)
    assert j2.phase == "queued" and "m-a" in j2.excluded


def test_an_instance_gone_during_preflight_is_destroyed_as_unreachable() -> None:
    """The provider reporting the instance gone mid-preflight fails the attempt at once: destroyed, ssh_unreachable."""
    j, acts = decide(preflight(), Polled(inst("gone")), 320.0, cfg=CFG)
    assert acts[0] == Destroy("job-1", "i-1", "m-a", "ssh_unreachable", "instance gone during preflight")
    assert j.phase == "queued" and j.attempt is None


def test_a_preflight_wake_up_before_the_timeout_waits_for_the_report() -> None:
    """A poll during the preflight, before its timeout, only wakes again at the timeout."""
    j = preflight()
    assert decide(j, Polled(inst("running")), 360.0, cfg=CFG) == (j, [WakeAt("job-1", 300.0 + CFG.preflight_timeout_s)])


def test_a_preflight_without_a_report_fails_with_the_reason_the_driver_gives() -> None:
    """No report: the attempt fails as the driver's reason (timeout), or ssh_unreachable when it gives none."""
    _, acts = decide(preflight(), PreflightResult(None, unreachable="timeout", detail="no answer"), 320.0, cfg=CFG)
    assert acts[0] == Destroy("job-1", "i-1", "m-a", "timeout", "no answer")
    _, acts = decide(preflight(), PreflightResult(None), 320.0, cfg=CFG)
    assert acts[0] == Destroy("job-1", "i-1", "m-a", "ssh_unreachable", "no report")


def test_a_finished_job_without_holding_stops_its_host() -> None:
    """With hold_s 0 a finished job's host is stopped (it held work: never destroyed), not held."""
    cfg = replace(CFG, hold_s=0.0)
    j, acts = decide(training(), TrainerStatus(inst("running"), "finished", work_s=600.0), 1000.0, cfg=cfg)
    assert j.phase == "done" and j.checkpoint_work_s == 600.0
    assert acts[1:] == [Stop("job-1", "i-1", "m-a", "job finished", "adapter pulled"), Finished("job-1")]
    assert isinstance(acts[0], Record) and acts[0].event == "slice_finished"


def test_ssh_failing_while_the_provider_is_unsure_loses_the_host() -> None:
    """No status over SSH and the provider reports unknown: lost, stopped, re-queued for a replacement."""
    j, acts = decide(training(), TrainerStatus(inst("unknown"), None), 400.0, cfg=CFG)
    assert acts[0] == Stop("job-1", "i-1", "m-a", "lost", "SSH failed and the provider reports unknown")
    assert j.phase == "queued" and j.lost_cause == "lost"


def test_without_a_stall_window_an_idle_gpu_with_no_progress_is_a_hang() -> None:
    """stall_s 0 (no stall window): a GPU at 0% with no progress for a monitor period is a hang; at 80% it is not."""
    cfg = replace(CFG, stall_s=0.0)
    j = training()
    busy, acts = decide(j, TrainerStatus(inst("running", util=80.0), "training"), 400.0, cfg=cfg)
    assert busy.phase == "training" and acts == [WakeAt("job-1", 400.0 + cfg.monitor_s)]
    j, acts = decide(j, TrainerStatus(inst("running", util=0.0), "training"), 400.0, cfg=cfg)
    assert acts[0] == Stop("job-1", "i-1", "m-a", "hang", "GPU utilisation 0 and no progress")
    assert j.phase == "queued" and j.lost_cause == "hang"


def test_a_failure_seen_under_training_loses_the_host_at_that_instant() -> None:
    """The oracle's FailureSeen on a training host stops it (never destroys) and dates the loss now."""
    j, acts = decide(training(), FailureSeen("lost", "host powered off"), 500.0, cfg=oracle_config())
    assert acts[0] == Stop("job-1", "i-1", "m-a", "lost", "host powered off")
    assert j.phase == "queued" and j.lost_at == 500.0 and "m-a" in j.excluded
