"""Checkpoint directories: atomic, verified by their manifest, pruned to the last K."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from trainer import checkpoint as ckpt
from trainer.fsutil import write_bytes


def _write(root: Path, step: int, payload: bytes = b"weights") -> Path:
    def fill(tmp: Path) -> None:
        (tmp / "adapter").mkdir()
        write_bytes(tmp / "adapter" / "w.bin", payload)
        write_bytes(tmp / "trainer_state.pt", b"state-%d" % step)

    final = root / ckpt.checkpoint_name(step)
    ckpt.write_dir_atomically(final, fill, marker={"step": step})
    return final


def test_written_checkpoint_verifies_and_lists_every_file(tmp_path: Path) -> None:
    """A checkpoint's marker lists every file with size and checksum, and verifies."""
    path = _write(tmp_path, 4)
    marker = ckpt.verify(path)
    assert set(marker["files"]) == {"adapter/w.bin", "trainer_state.pt"}
    assert marker["step"] == 4
    assert [p.name for p in tmp_path.iterdir()] == ["step-00000004"]


def test_find_latest_skips_incomplete_and_corrupt(tmp_path: Path) -> None:
    """The newest checkpoint that verifies wins; a torn or markerless newer one is skipped."""
    _write(tmp_path, 2)
    torn = _write(tmp_path, 4)
    (torn / "adapter" / "w.bin").write_bytes(b"weightX")  # same size, other bytes
    bare = tmp_path / ckpt.checkpoint_name(6)
    bare.mkdir()
    (bare / "trainer_state.pt").write_bytes(b"half")
    skipped: list[int] = []
    latest = ckpt.find_latest(tmp_path, on_skip=lambda c, why: skipped.append(c.step))
    assert latest is not None and latest.step == 2
    assert skipped == [6, 4]


def test_failed_write_leaves_previous_intact_and_no_temp(tmp_path: Path) -> None:
    """A full disk during a checkpoint write (ENOSPC at the file write) keeps the previous one whole."""
    _write(tmp_path, 2)

    def fill(tmp: Path) -> None:
        write_bytes(tmp / "trainer_state.pt", b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError) as info:
        ckpt.write_dir_atomically(tmp_path / ckpt.checkpoint_name(4), fill, marker={"step": 4})
    assert info.value.errno == errno.ENOSPC
    assert [p.name for p in tmp_path.iterdir()] == ["step-00000002"]
    ckpt.verify(tmp_path / "step-00000002")


def test_prune_keeps_newest_k_complete(tmp_path: Path) -> None:
    """Pruning keeps the K newest complete checkpoints and removes older ones."""
    for step in (1, 2, 3, 4, 5):
        _write(tmp_path, step)
    removed = ckpt.prune(tmp_path, keep=2)
    assert sorted(c.step for c in removed) == [1, 2, 3]
    assert [c.step for c in ckpt.list_checkpoints(tmp_path)] == [5, 4]


def test_clean_stale_removes_temp_dirs_of_killed_writers(tmp_path: Path) -> None:
    """Temp and trash directories left by a killed process are removed; checkpoints are not."""
    _write(tmp_path, 1)
    (tmp_path / ".tmp-step-00000002-999").mkdir()
    (tmp_path / ".trash-step-00000000-999").mkdir()
    ckpt.clean_stale(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["step-00000001"]


def test_marker_of_unknown_format_is_corrupt(tmp_path: Path) -> None:
    """A marker that is not the trainer's format is never trusted."""
    path = _write(tmp_path, 1)
    (path / ckpt.MARKER).write_text(json.dumps({"format": 99, "files": {}}))
    with pytest.raises(ckpt.CorruptCheckpoint):
        ckpt.verify(path)
