"""Properties of the boot watch and the provisioning machine, over generated hosts and histories."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from app.market import Instance, Offer
from app.policy.bootwatch import BootKill, BootReady, BootWatchConfig, observe_boot, start_watch
from app.policy.preflight import PreflightReport
from app.policy.provisioning import (
    CreateResult,
    Destroy,
    FailureSeen,
    MarketView,
    Polled,
    PreflightResult,
    StartTraining,
    Tick,
    TrainerStatus,
    decide,
    guarded_config,
    naive_config,
    new_job,
)
from app.policy.ranking import JobShape, Requirements

CFG = BootWatchConfig()


def status_line(t: float, *, every_s: float, mbps: float, total_gb: float, freeze_at: float | None) -> str:
    seen = t if freeze_at is None else min(t, freeze_at)
    refreshed = math.floor(seen / every_s) * every_s
    done = min(total_gb, refreshed * mbps / 8000.0)
    return f"Downloading {done:.2f}/{total_gb:.2f} GB"


@settings(max_examples=200, deadline=None)
@given(
    every_s=st.sampled_from([10, 15, 30, 60, 120, 150, 180]),
    mbps=st.floats(min_value=30, max_value=1000),
    total_gb=st.floats(min_value=1, max_value=40),
    poll_offset=st.floats(min_value=0, max_value=9.9),
)
def test_a_healthy_host_is_never_killed_whatever_its_cadence(every_s: int, mbps: float, total_gb: float,
                                                             poll_offset: float) -> None:
    """A host that keeps pulling, reporting every 10 s to 3 min, always reaches running untouched."""
    pull_s = total_gb * 8000.0 / mbps
    w = start_watch(created_at=0.0)
    t = 10.0 + poll_offset
    while t < pull_s:
        w, v = observe_boot(w, state="loading", now=t, cfg=CFG,
                            status_line=status_line(t, every_s=every_s, mbps=mbps, total_gb=total_gb, freeze_at=None))
        assert v is None, (t, v)
        t += CFG.poll_s
    _, v = observe_boot(w, state="running", status_line="running", now=t, cfg=CFG)
    assert isinstance(v, BootReady)


@settings(max_examples=200, deadline=None)
@given(
    every_s=st.sampled_from([10, 15, 30, 120, 150, 180]),
    mbps=st.floats(min_value=150, max_value=900),
    freeze_frac=st.floats(min_value=0.05, max_value=0.9),
)
def test_a_frozen_host_is_killed_within_its_cadence_window(every_s: int, mbps: float, freeze_frac: float) -> None:
    """A frozen pull is killed no later than 1.5 cadences + 2 polls after its last refresh (240 s if it never refreshed)."""
    total_gb = 23.0
    freeze_at = freeze_frac * total_gb * 8000.0 / mbps
    w = start_watch(created_at=0.0)
    t = 10.0
    verdict = None
    while t < 20000 and verdict is None:
        w, verdict = observe_boot(w, state="loading", now=t, cfg=CFG,
                                  status_line=status_line(t, every_s=every_s, mbps=mbps, total_gb=total_gb,
                                                          freeze_at=freeze_at))
        t += CFG.poll_s
    assert isinstance(verdict, BootKill) and verdict.reason in ("boot_frozen", "boot_deadline")
    last_refresh = math.floor(freeze_at / every_s) * every_s
    bound = max(CFG.unknown_cadence_freeze_s, 1.5 * every_s + 2 * CFG.poll_s) + last_refresh + CFG.poll_s
    assert t - CFG.poll_s <= bound + every_s


def _offer(i: int) -> Offer:
    return Offer(provider="sim", offer_id=f"o{i}", machine_id=f"m{i}", gpu_name="RTX 3090", num_gpus=1,
                 gpu_ram_gb=24, dph_total=0.1 + i / 100, storage_per_gb_month=0.1, inet_down_per_gb=0.0,
                 inet_down_mbps=800, reliability=0.99, cuda_max="12.4")


def _inst(state: str, line: str | None = None, util: float | None = None) -> Instance:
    return Instance(provider="sim", instance_id="i", machine_id="m", label="l", state=state,  # type: ignore[arg-type]
                    status_line=line, ssh=None, gpu_util=util, dph_total=0.1, started_at=0.0)


OK_REPORT = PreflightReport.from_mapping({"cuda_initialised": True, "matmul_finite": True, "gpu_name": "RTX 3090",
                                          "vram_gb": 24, "tflops_bf16": 71.0})
OBSERVATIONS = st.one_of(
    st.just(Tick(MarketView(offers=tuple(_offer(i) for i in range(5))))),
    st.builds(lambda i: CreateResult(_offer(i), f"i{i}"), st.integers(0, 4)),
    st.sampled_from([
        Polled(_inst("loading", "Downloading 1.00/23.00 GB")), Polled(_inst("loading", "Error: OCI runtime")),
        Polled(_inst("running", "running")), Polled(_inst("gone")), Polled(_inst("unknown")),
        PreflightResult(OK_REPORT), PreflightResult(None, "timeout", "slow"),
        PreflightResult(PreflightReport.from_mapping({"cuda_initialised": False, "error": "CUDA"})),
        TrainerStatus(_inst("running", util=95.0), "training", work_s=10.0),
        TrainerStatus(_inst("running", util=0.0), "training", work_s=10.0),
        TrainerStatus(_inst("gone"), None, heartbeat_at=5.0),
        TrainerStatus(_inst("running", util=0.0), "failed", error="boom"),
        TrainerStatus(_inst("running", util=95.0), "finished", work_s=600.0),
        FailureSeen("boot_frozen", "oracle"), FailureSeen("lost", "oracle"),
    ]),
)


@settings(max_examples=300, deadline=None)
@given(history=st.lists(st.tuples(OBSERVATIONS, st.floats(min_value=0, max_value=900)), max_size=40),
       naive=st.booleans())
def test_automation_never_destroys_an_instance_that_held_work(history: list[tuple[object, float]], naive: bool) -> None:
    """Whatever the guarded policy observes, it destroys only instances it never started training on."""
    cfg = naive_config() if naive else guarded_config()
    job = new_job("j", req=Requirements(), shape=JobShape(download_gb=23, train_s=600, disk_gb=60))
    now = 0.0
    trained: set[str] = set()
    for obs, dt in history:
        now += dt
        before = job.attempt
        job, actions = decide(job, obs, now, cfg=cfg)  # type: ignore[arg-type]
        for act in actions:
            if isinstance(act, StartTraining):
                trained.add(act.instance_id)
            if isinstance(act, Destroy) and not naive:
                assert act.instance_id not in trained, (act, before)
        assert job.phase in ("queued", "booting", "preflight", "training", "done", "failed")
