"""A simulated host's hang as the trainer reads it, and the deferred torch.compile of the import path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trainer.simhost import SIM_TRUTH_ENV, SimHang, load_hang
from trainer.stack import deferred_compile


def _truth(tmp_path: Path, **fields: Any) -> dict[str, str]:
    path = tmp_path / "truth.json"
    path.write_text(json.dumps({"format": "tuneharness-sim-truth/1", "computes": True, **fields}))
    return {SIM_TRUTH_ENV: str(path)}


def test_hang_instant_is_read_on_the_scaled_sim_clock(tmp_path: Path) -> None:
    """With scale 60 from epoch 1000, a hang at sim 1600 comes 10 wall seconds after the epoch."""
    hang = load_hang(_truth(tmp_path, hangs_at_epoch_s=1600.0, clock={"scale": 60.0, "epoch_s": 1000.0}))
    assert hang == SimHang(hangs_at_epoch_s=1600.0, scale=60.0, epoch_s=1000.0)
    assert hang.sim_now(1005.0) == 1300.0
    assert not hang.hung(1009.99)
    assert hang.hung(1010.0)


def test_null_clock_means_the_wall_clock(tmp_path: Path) -> None:
    """A truth without a clock (an in-process simulator) reads the hang instant on the wall clock."""
    hang = load_hang(_truth(tmp_path, hangs_at_epoch_s=2000.0, clock=None))
    assert hang is not None and not hang.hung(1999.0) and hang.hung(2000.0)


def test_no_hang_without_a_truth_or_a_hang_or_with_a_broken_truth(tmp_path: Path) -> None:
    """No truth variable, a null hang, an unreadable file or a bad scale: the trainer never hangs."""
    assert load_hang({}) is None
    assert load_hang(_truth(tmp_path, hangs_at_epoch_s=None, clock=None)) is None
    assert load_hang({SIM_TRUTH_ENV: str(tmp_path / "missing.json")}) is None
    (tmp_path / "bad.json").write_text("{not json")
    assert load_hang({SIM_TRUTH_ENV: str(tmp_path / "bad.json")}) is None
    assert load_hang(_truth(tmp_path, hangs_at_epoch_s=5.0, clock={"scale": 0, "epoch_s": 0})) is None


def test_deferred_compile_compiles_once_on_first_call_with_the_same_arguments() -> None:
    """The stand-in calls the real compile only when the function is first used, once, with its options."""
    calls: list[tuple[Any, dict[str, Any]]] = []

    def real(fn: Any, **kwargs: Any) -> Any:
        calls.append((fn, kwargs))
        return lambda *a, **k: ("compiled", fn(*a, **k))

    compile_later = deferred_compile(real)

    @compile_later(dynamic=False)
    def double(x: int) -> int:
        return 2 * x

    plain = compile_later(lambda x: x + 1)
    assert calls == []
    assert double(3) == ("compiled", 6) and double(4) == ("compiled", 8)
    assert plain(1) == ("compiled", 2)
    assert [kw for _, kw in calls] == [{"dynamic": False}, {}]
    assert double.__name__ == "double"


def test_a_simulated_hosts_pace_comes_from_its_truth(tmp_path: Path) -> None:
    """train_step_s / tflops_factor simulated seconds a step, read through the scaled clock; none without it."""
    import json

    from trainer.simhost import load_pace

    truth = tmp_path / "truth.json"
    truth.write_text(json.dumps({"train_step_s": 3.0, "tflops_factor": 0.5, "clock": {"scale": 10.0, "epoch_s": 0}}))
    pace = load_pace({"TUNEHARNESS_SIM_TRUTH": str(truth)})
    assert pace is not None and (pace.step_s, pace.factor, pace.scale) == (3.0, 0.5, 10.0)
    truth.write_text(json.dumps({"train_step_s": None}))
    assert load_pace({"TUNEHARNESS_SIM_TRUTH": str(truth)}) is None
    assert load_pace({}) is None


def test_the_pace_waits_out_what_the_cpu_did_faster(monkeypatch: Any) -> None:
    """After n steps the trainer sleeps until n x step_s / factor simulated seconds have passed."""
    import time as _time

    from trainer.simhost import SimPace

    slept: list[float] = []
    monkeypatch.setattr(_time, "time", lambda: 100.0)
    monkeypatch.setattr(_time, "sleep", lambda s: slept.append(s))
    SimPace(step_s=3.0, factor=0.5, scale=10.0).wait(steps=2, since_wall=99.0)
    assert slept == [pytest.approx(0.2)]  # 2 steps x 6 simulated s = 12 s = 1.2 wall s, 1 already passed
