"""A full disk while checkpointing: the previous checkpoint stays whole, the failure is reported."""

from __future__ import annotations

import errno
import json
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from trainer import checkpoint as ckpt
from trainer.reporting import parse_line
from trainer.run import EXIT_DISK_FULL, run_job
from trainer.testing import write_causal_job


def _assert_reported(job: Path, *, previous_step: int) -> None:
    latest = ckpt.find_latest(job / "checkpoints")
    assert latest is not None and latest.step == previous_step
    ckpt.verify(latest.path)
    ckpt.read_state(latest.path / "trainer_state.pt")
    assert not [p for p in (job / "checkpoints").iterdir() if p.name.startswith(".tmp-")]
    status = json.loads((job / "status.json").read_text())
    assert status["phase"] == "failed" and status["exit_code"] == EXIT_DISK_FULL
    assert "No space left on device" in status["error"]
    last = parse_line((job / "train.log").read_text().splitlines()[-1])
    assert last is not None and last[1] == "failed" and "No space left" in last[2]["reason"]


def test_enospc_at_the_file_write_keeps_previous_checkpoint(
    tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC injected at the durable write of checkpoint 4 leaves checkpoint 2 loadable; exit 5."""
    job = write_causal_job(tmp_path / "job", base_model=tiny_model, max_steps=6, checkpoint_every=2)
    real_write = ckpt.write_bytes

    def write_until_full(path: Path, data: bytes) -> None:
        if ".tmp-step-00000004" in str(path) and path.name == "trainer_state.pt":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real_write(path, data)

    monkeypatch.setattr(ckpt, "write_bytes", write_until_full)
    assert run_job(job) == EXIT_DISK_FULL
    _assert_reported(job, previous_step=2)


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Callable[[int], Path]]:
    """Mount a tmpfs of a given size (root only); skip where mounting is not permitted."""
    mounted: list[Path] = []

    def mount(size_bytes: int) -> Path:
        point = tmp_path / "tmpfs"
        point.mkdir()
        result = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(point)],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], check=False)


@pytest.mark.slow
def test_real_full_tmpfs_keeps_previous_checkpoint(
    tmp_path: Path,
    tiny_model: Path,
    run_trainer: Callable[..., subprocess.CompletedProcess[str]],
    small_tmpfs: Callable[[int], Path],
) -> None:
    """On a real tmpfs with room for one checkpoint, the second fails with ENOSPC and the first survives."""
    probe = write_causal_job(
        tmp_path / "probe", base_model=tiny_model, max_steps=1, checkpoint_every=1, warmup_steps=0, eval_file=None
    )
    assert run_job(probe) == 0
    one = sum(p.stat().st_size for p in (probe / "checkpoints").rglob("*") if p.is_file())
    mnt = small_tmpfs(int(one * 1.5) + 64 * 1024)  # job files and logs fit, two checkpoints do not
    job = write_causal_job(
        mnt / "job", base_model=tiny_model, max_steps=20, checkpoint_every=1, eval_file=None, keep_checkpoints=5
    )
    (job / "eval.jsonl").unlink()
    result = run_trainer("run", "--job-dir", str(job))
    assert result.returncode == EXIT_DISK_FULL, result.stdout + result.stderr
    latest = ckpt.find_latest(job / "checkpoints")
    assert latest is not None
    _assert_reported(job, previous_step=latest.step)
    shutil.rmtree(job)
