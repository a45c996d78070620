"""Checkpoints: a directory per step, written atomically, with a completion marker that lists
every file's size and SHA-256. Only a directory whose marker verifies is ever loaded.

Layout of `DIR/checkpoints/step-00000050/`:
    adapter/adapter_model.safetensors, adapter/adapter_config.json   (PEFT format)
    trainer_state.pt    optimizer, scheduler, RNG states, step (= data position)
    job.json            the job as it was when written (resume compares its shape)
    labels.json         the label set (classification only)
    COMPLETE            the manifest, written last, fsynced, before the rename
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.fsutil import fsync_dir, fsync_tree, remove_tree, write_bytes

__all__ = [
    "MARKER",
    "Checkpoint",
    "CorruptCheckpoint",
    "checkpoint_name",
    "clean_stale",
    "find_latest",
    "list_checkpoints",
    "prune",
    "read_state",
    "verify",
    "write_adapter",
    "write_dir_atomically",
    "write_state",
]

MARKER = "COMPLETE"
FORMAT = 1
_NAME = re.compile(r"^step-(\d{8})$")


class CorruptCheckpoint(Exception):
    """A checkpoint directory whose marker is missing or does not match its files."""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    step: int
    path: Path


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _manifest(root: Path) -> dict[str, dict[str, Any]]:
    files: dict[str, dict[str, Any]] = {}
    for dirpath, _dirs, names in os.walk(root):
        for name in sorted(names):
            p = Path(dirpath) / name
            rel = p.relative_to(root).as_posix()
            if rel != MARKER:
                files[rel] = {"size": p.stat().st_size, "sha256": _sha256(p)}
    return files


def write_dir_atomically(final: Path, fill: Callable[[Path], None], *, marker: dict[str, Any]) -> None:
    """Build `final` in a temp sibling via `fill`, add the manifest marker, fsync, rename.

    On any error the temp directory is removed and `final` (if it existed) is untouched.
    """
    parent = final.parent
    tmp = parent / f".tmp-{final.name}-{os.getpid()}"
    if tmp.exists():
        remove_tree(tmp)
    tmp.mkdir(parents=True)
    try:
        fill(tmp)
        fsync_tree(tmp)
        body = dict(marker, format=FORMAT, files=_manifest(tmp))
        write_bytes(tmp / MARKER, (json.dumps(body, sort_keys=True, indent=1) + "\n").encode())
        fsync_dir(tmp)
        if final.exists():
            remove_tree(final)
        os.replace(tmp, final)
        fsync_dir(parent)
    except BaseException:
        remove_tree(tmp)
        raise


def verify(path: Path) -> dict[str, Any]:
    """The marker of a complete, intact checkpoint (or adapter) directory; CorruptCheckpoint otherwise."""
    try:
        marker = json.loads((path / MARKER).read_text())
    except FileNotFoundError:
        raise CorruptCheckpoint(f"{path}: no {MARKER} marker (incomplete)") from None
    except (OSError, ValueError) as e:
        raise CorruptCheckpoint(f"{path}: unreadable marker ({e})") from None
    if not isinstance(marker, dict) or marker.get("format") != FORMAT or not isinstance(marker.get("files"), dict):
        raise CorruptCheckpoint(f"{path}: marker of unknown format")
    for rel, want in marker["files"].items():
        p = path / rel
        try:
            size = p.stat().st_size
        except FileNotFoundError:
            raise CorruptCheckpoint(f"{path}: {rel} is missing") from None
        if size != want["size"] or _sha256(p) != want["sha256"]:
            raise CorruptCheckpoint(f"{path}: {rel} does not match its checksum")
    return marker


def list_checkpoints(root: Path) -> list[Checkpoint]:
    """Checkpoint directories by step, newest first (complete or not: `verify` decides)."""
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        m = _NAME.match(entry.name)
        if m and entry.is_dir():
            found.append(Checkpoint(int(m.group(1)), entry))
    return sorted(found, key=lambda c: c.step, reverse=True)


def find_latest(root: Path, *, on_skip: Callable[[Checkpoint, str], None] | None = None) -> Checkpoint | None:
    """The newest checkpoint whose marker verifies; broken ones are reported through on_skip."""
    for ckpt in list_checkpoints(root):
        try:
            verify(ckpt.path)
        except CorruptCheckpoint as e:
            if on_skip is not None:
                on_skip(ckpt, str(e))
            continue
        return ckpt
    return None


def prune(root: Path, *, keep: int) -> list[Checkpoint]:
    """Remove all but the `keep` newest complete checkpoints (and incomplete ones older than them)."""
    complete = [c for c in list_checkpoints(root) if (c.path / MARKER).is_file()]
    if not complete:
        return []
    kept = complete[:keep]
    oldest_kept = kept[-1].step
    removed = [c for c in list_checkpoints(root) if c not in kept and c.step < oldest_kept]
    for c in removed:
        remove_tree(c.path)
    return removed


def clean_stale(root: Path) -> None:
    """Remove temp and trash directories left by a killed process."""
    if root.is_dir():
        for entry in root.iterdir():
            if entry.name.startswith((".tmp-", ".trash-")) and entry.is_dir():
                remove_tree(entry)


def write_adapter(model: Any, out: Path) -> None:
    """The adapter in PEFT's format; every byte through the durable write path."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save as safetensors_save

    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu").contiguous() for k, v in get_peft_model_state_dict(model).items()}
    write_bytes(out / "adapter_model.safetensors", safetensors_save(state, metadata={"format": "pt"}))
    config = model.peft_config["default"]
    d = config.to_dict()
    d = {k: (sorted(v) if isinstance(v, set) else v) for k, v in d.items()}
    d["inference_mode"] = True
    write_bytes(out / "adapter_config.json", (json.dumps(d, indent=2, sort_keys=True) + "\n").encode())


def write_state(path: Path, state: dict[str, Any]) -> None:
    import torch

    buf = io.BytesIO()
    torch.save(state, buf)
    write_bytes(path, buf.getvalue())


def read_state(path: Path) -> dict[str, Any]:
    import torch

    state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    return state
