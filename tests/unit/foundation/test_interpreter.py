"""The one interpreter: each action reaches its effect, and what an effect observes is folded in next."""

from __future__ import annotations

from typing import Any

from app.interpreter import drive, tend
from app.market import Offer
from app.policy.fleet import Drop, Release, Renew
from app.policy.provisioning import (
    Adopt,
    Create,
    CreateResult,
    Destroy,
    Finished,
    GaveUp,
    Hold,
    JobState,
    MarketView,
    Observation,
    Record,
    Recovered,
    RecoveryProgress,
    RunPreflight,
    StartTraining,
    Stop,
    Tick,
    WakeAt,
    WantStandby,
    guarded_config,
    new_job,
)
from app.policy.ranking import JobShape, Requirements
from app.policy.retry import HeldHost

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


class Recorder:
    """Effects that remember every call and rent instance i-1 when asked to create."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.states: list[JobState] = []
        self.jitters = 0

    def now(self) -> float:
        return 100.0

    def jitter(self) -> float:
        self.jitters += 1
        return 0.25

    def decided(self, job: JobState) -> None:
        self.states.append(job)

    def create(self, job: JobState, act: Create) -> Observation:
        self.calls.append(("create", act))
        return CreateResult(act.offer, "i-1")

    def adopt(self, job: JobState, act: Adopt) -> Observation | None:
        self.calls.append(("adopt", act))
        return None

    def __getattr__(self, name: str) -> Any:  # destroy, stop, record, ... : remembered by name
        if name in (
            "destroy",
            "stop",
            "record",
            "run_preflight",
            "start_training",
            "hold",
            "want_standby",
            "recovered",
            "finished",
            "gave_up",
            "wake",
            "release",
            "renew",
            "drop",
        ):
            return lambda *args: self.calls.append((name, args[-1]))
        raise AttributeError(name)


def test_a_tick_rents_the_best_offer_and_the_create_is_folded_in_at_once() -> None:
    """Tick -> Create; the effect's CreateResult moves the job to booting and schedules a boot poll."""
    fx = Recorder()
    job = drive(
        new_job("j", req=Requirements(), shape=JobShape(download_gb=3, train_s=60, disk_gb=10)),
        Tick(MarketView(offers=(OFFER,))),
        fx,
        guarded_config(),
    )  # type: ignore[arg-type]
    assert job.phase == "booting" and job.attempt is not None and job.attempt.instance_id == "i-1"
    kinds = [k for k, _ in fx.calls]
    assert kinds == ["create", "record", "wake"]
    assert isinstance(fx.calls[-1][1], WakeAt) and fx.calls[-1][1].at == 100.0 + guarded_config().boot.poll_s
    assert [s.phase for s in fx.states] == ["queued", "booting"] and fx.jitters == 2


def test_a_progress_look_draws_no_jitter() -> None:
    """A RecoveryProgress never backs off, so the random stream is left as it was."""
    fx = Recorder()
    drive(
        new_job("j", req=Requirements(), shape=JobShape(download_gb=3, train_s=60, disk_gb=10)),
        RecoveryProgress(),
        fx,
        guarded_config(),
    )  # type: ignore[arg-type]
    assert fx.jitters == 0


def test_every_action_and_hold_decision_reaches_its_effect() -> None:
    """The dispatch covers every action type the policy returns."""
    from app.interpreter import apply

    fx = Recorder()
    job = new_job("j", req=Requirements(), shape=JobShape(download_gb=3, train_s=60, disk_gb=10))
    h = HeldHost("i", "m", "sim", "RTX 3090", 24, 1, 0.2, 0.0, 600.0)
    actions = [
        Destroy("j", "i", "m", "r", "e"),
        Stop("j", "i", "m", "r", "e"),
        Record("m", "sim", "create"),
        RunPreflight("j", "i"),
        StartTraining("j", "i", 0.0),
        Hold("j", h),
        WantStandby("j", 2, "why"),
        Recovered("j", "m", "lost", 1.0, 2.0),
        Finished("j"),
        GaveUp("j", "r"),
        WakeAt("j", 5.0),
    ]
    for act in actions:
        assert apply(fx, job, act) is None  # type: ignore[arg-type]
    tend(
        fx,
        [
            Release(h, destroy=True, reason="r"),
            Renew(h, until=9.0, standby=True, reason="r"),  # type: ignore[arg-type]
            Drop(h, lost=True, evidence="e"),
            None,
        ],
    )
    assert [k for k, _ in fx.calls] == [
        "destroy",
        "stop",
        "record",
        "run_preflight",
        "start_training",
        "hold",
        "want_standby",
        "recovered",
        "finished",
        "gave_up",
        "wake",
        "release",
        "renew",
        "drop",
    ]
