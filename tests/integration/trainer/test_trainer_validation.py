"""The trainer's held-out validation split, its `val_loss`, and the wall-clock time box."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from trainer.data import split_rows
from trainer.reporting import parse_line
from trainer.testing import write_causal_job


def _events(job_dir: Path, name: str) -> list[dict[str, str]]:
    """The fields of every `name` line in the job's train.log."""
    lines = (job_dir / "train.log").read_text().splitlines()
    return [p[2] for p in map(parse_line, lines) if p is not None and p[1] == name]


def test_split_is_fixed_by_its_own_seed_and_never_overlaps() -> None:
    """The split depends on (rows, fraction, seed) only; train and validation rows are disjoint and cover all."""
    train, val = split_rows(40, fraction=0.25, seed=3)
    assert len(val) == 10 and not set(train) & set(val) and sorted(train + val) == list(range(40))
    assert split_rows(40, fraction=0.25, seed=3) == (train, val)
    assert split_rows(40, fraction=0.25, seed=4)[1] != val
    assert split_rows(5, fraction=0.0, seed=1) == ([0, 1, 2, 3, 4], [])
    assert len(split_rows(2, fraction=0.5, seed=1)[0]) == 1


def test_time_boxed_run_stops_early_and_reports_val_loss(
    tiny_model: Path, tmp_path: Path, run_trainer: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    """A job with a 2-second time box and a huge max_steps finishes (exit 0) with a val_loss in status.json,
    train.log and the adapter's metadata."""
    job = write_causal_job(
        tmp_path / "job",
        base_model=tiny_model,
        rows=40,
        max_steps=100_000,
        checkpoint_every=100_000,
        lr_schedule="constant",
        val_fraction=0.25,
        time_box_s=2.0,
        quantization="none",
    )
    done = run_trainer("run", "--job-dir", str(job))
    assert done.returncode == 0, done.stdout + done.stderr
    status = json.loads((job / "status.json").read_text())
    meta = json.loads((job / "adapter" / "trainer_meta.json").read_text())
    (boxed,) = _events(job, "time_box")
    (val,) = _events(job, "val")
    assert 0 < int(boxed["step"]) < 100_000 and float(boxed["trained_s"]) >= 2.0
    assert status["phase"] == "finished" and status["val_rows"] == 10 == int(val["val_rows"])
    assert status["val_loss"] == meta["val_loss"] > 0
    assert abs(float(val["val_loss"]) - meta["val_loss"]) <= 1e-5 * meta["val_loss"]  # train.log writes %.6g
    assert meta["steps"] == int(boxed["step"])


@pytest.mark.long
def test_time_box_spans_slices_and_a_resumed_run_trains_only_train_rows(
    tiny_model: Path, tmp_path: Path, run_trainer: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    """Slices of 3 steps under a step budget resume with the split intact: the run ends at max_steps with the
    same adapter and val_loss as one uninterrupted run (the split and the data order are functions of the seeds)."""
    kw = {"rows": 40, "max_steps": 9, "checkpoint_every": 3, "val_fraction": 0.25, "quantization": "none"}
    whole = write_causal_job(tmp_path / "whole", base_model=tiny_model, **kw)
    sliced = write_causal_job(tmp_path / "sliced", base_model=tiny_model, **kw)
    assert run_trainer("run", "--job-dir", str(whole)).returncode == 0
    codes = [run_trainer("run", "--job-dir", str(sliced), "--slice-steps", "3").returncode for _ in range(3)]
    assert codes[:2] == [3, 3], codes
    if codes[2] == 3:  # the third slice stops at the cap only when max_steps was not reached
        codes.append(run_trainer("run", "--job-dir", str(sliced)).returncode)
    assert codes[-1] == 0, codes
    a = json.loads((whole / "adapter" / "trainer_meta.json").read_text())
    b = json.loads((sliced / "adapter" / "trainer_meta.json").read_text())
    assert a["steps"] == b["steps"] == 9
    assert abs(a["val_loss"] - b["val_loss"]) <= 1e-5
