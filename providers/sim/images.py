"""The Pythons a simulated host offers, by its truth's `image`, and a wheelhouse of the trainer's stack.

- `"trainer"`: this project's interpreter, the whole stack installed (the trainer image, as
  `trainer/Dockerfile` builds it).
- `"bare"`: what `pytorch/pytorch:*-runtime` offers: torch, torch's own dependencies and pip,
  nothing else. Built once as a venv without packages whose site-packages links those
  distributions from this interpreter's site-packages, cached under TUNEHARNESS_SIM_CACHE
  (default `~/.cache/tuneharness-sim`), keyed by the linked versions. The trainer dies at its
  first import there unless `python -m trainer bootstrap` installed the stack.

`wheelhouse()` downloads the lock's wheels once (`pip download --no-deps`) into the same cache,
so a test bootstraps a bare host for real without PyPI on every run.
Each is built in a temporary directory and renamed into place (concurrent builders: one wins).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Literal

from packaging.requirements import Requirement

__all__ = ["IMAGES", "SIM_CACHE_ENV", "Image", "bare_python", "image_python", "sim_cache", "wheelhouse"]

Image = Literal["bare", "trainer"]
IMAGES: tuple[Image, ...] = ("bare", "trainer")
SIM_CACHE_ENV = "TUNEHARNESS_SIM_CACHE"
LOCK = Path(__file__).resolve().parents[2] / "trainer" / "requirements.txt"
# What the runtime image has besides torch's own dependencies: pip, to install the rest.
_IMAGE_EXTRAS = ("pip",)


def sim_cache(env: Mapping[str, str] | None = None) -> Path:
    """Where the bare Python and the wheelhouse are built: TUNEHARNESS_SIM_CACHE, else ~/.cache/tuneharness-sim."""
    env = os.environ if env is None else env
    return Path(env.get(SIM_CACHE_ENV) or Path.home() / ".cache" / "tuneharness-sim")


def image_python(image: Image) -> Path:
    """The `python` a sim host with this image runs (its directory goes first on the PATH)."""
    return Path(sys.executable) if image == "trainer" else bare_python()


@contextmanager
def _build_lock(root: Path) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".build.lock", "w", encoding="utf-8") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _closure(roots: tuple[str, ...]) -> dict[str, metadata.Distribution]:
    """The installed distributions `roots` need (no extras), by normalised name."""
    seen: dict[str, metadata.Distribution] = {}
    todo = list(roots)
    while todo:
        name = _norm(todo.pop())
        if name in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        seen[name] = dist
        for raw in dist.requires or []:
            req = Requirement(raw)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def _top_level(dist: metadata.Distribution) -> set[str]:
    """The entries a distribution put directly into site-packages (packages, modules, its dist-info)."""
    tops = set()
    for f in dist.files or []:
        parts = Path(str(f)).parts
        if parts and parts[0] not in ("..", "__pycache__"):
            tops.add(parts[0])
    return tops


def bare_python() -> Path:
    """A Python with only torch, its dependencies and pip (see the module docstring); built once."""
    dists = _closure(("torch", *_IMAGE_EXTRAS))
    key = hashlib.sha256(
        "\n".join([sys.executable, *sorted(f"{n}=={d.version}" for n, d in dists.items())]).encode()
    ).hexdigest()[:12]
    root = sim_cache()
    final = root / f"bare-{key}"
    python = final / "bin" / "python3"
    if python.exists():
        return python
    with _build_lock(root):
        if python.exists():
            return python
        tmp = root / f".bare-{key}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", "--without-pip", str(tmp)], check=True, capture_output=True)
        site = next((tmp / "lib").glob("python*/site-packages"))
        for dist in dists.values():
            src_root = Path(str(dist.locate_file("")))
            for top in _top_level(dist):
                src = src_root / top
                if src.exists() and not (site / top).exists():
                    (site / top).symlink_to(src)
        os.rename(tmp, final)  # the venv's own paths name `tmp`: fix them below
        for script in (final / "bin").iterdir():
            if script.is_file() and not script.is_symlink():
                text = script.read_text(encoding="utf-8", errors="replace")
                script.write_text(text.replace(str(tmp), str(final)), encoding="utf-8")
    return python


def wheelhouse(lock: Path = LOCK) -> Path:
    """A directory of the lock's wheels (`pip download --no-deps`), downloaded once per lock."""
    key = hashlib.sha256(lock.read_bytes()).hexdigest()[:12]
    root = sim_cache()
    final = root / f"wheelhouse-{key}"
    if final.is_dir():
        return final
    with _build_lock(root):
        if final.is_dir():
            return final
        tmp = root / f".wheelhouse-{key}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        res = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-r", str(lock), "-d", str(tmp)],
            capture_output=True,
            text=True,
            check=False,
        )
        if res.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tail = " | ".join(res.stderr.strip().splitlines()[-2:])
            raise RuntimeError(f"cannot download the trainer's wheels: {tail}")
        os.rename(tmp, final)
    return final
