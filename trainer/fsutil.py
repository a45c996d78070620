"""Durable file writes: temp file, fsync, rename, fsync of the directory.

`write_bytes` is the one place the trainer's durable writes go through, so a full disk shows
up here first (as OSError ENOSPC) and nowhere half-way.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

__all__ = ["atomic_write_json", "fsync_dir", "fsync_tree", "remove_tree", "write_bytes"]


def write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` and fsync it (the file itself, not its directory)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make a rename or a new entry in `path` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every file and directory below `root` (for files written by other libraries)."""
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            fd = os.open(Path(dirpath) / name, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))


def atomic_write_json(path: Path, obj: Any) -> None:
    """Replace `path` with the JSON of `obj` so that readers see the old or the new file, whole."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write_bytes(tmp, (json.dumps(obj, sort_keys=True) + "\n").encode())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def remove_tree(path: Path) -> None:
    """Remove a directory so that it never looks half-present: rename it aside, then delete."""
    if not path.exists():
        return
    trash = path.with_name(f".trash-{path.name}-{os.getpid()}")
    os.replace(path, trash)
    shutil.rmtree(trash, ignore_errors=True)
