"""`python -m trainer bootstrap`: make this host's Python able to run the trainer, in one JSON line.

A rented host starts from an image with torch and little else. The bootstrap reads the lock
(`trainer/requirements.txt`: every package of the trainer's stack beyond torch, pinned), finds
which pins this Python does not already import at exactly that version, and installs only those
with pip into a cache directory on the host's disk:

    ${TUNEHARNESS_STACK_CACHE:-~/.cache/tuneharness}/stack-<key>

where `<key>` hashes the pins, the Python version and the machine type, so later slices and
later jobs on the same host reuse it (`"cached": true`). The install goes into a temporary
directory that is renamed into place once pip succeeded and every pin reads back: a killed
bootstrap leaves no half-installed stack behind. The path of the directory to use is written to
`<cache>/active`, which the supervisor's launch line puts on PYTHONPATH (ahead of site-packages,
so a pinned version wins over an older one in the image).

Packages come from PyPI (pip's own configuration), or only from a wheelhouse when
`--find-links DIR` or TUNEHARNESS_WHEELHOUSE is given (`--no-index`).

Stdlib only (pip is run as `python -m pip`): the control plane pushes this file on its own,
with the lock beside it, before the preflight, when the trainer's code is not on the host yet.
Exit 0 when the stack is complete afterwards, 2 on a lock or wheelhouse that cannot work, 1 otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = [
    "CACHE_ENV",
    "WHEELHOUSE_ENV",
    "BootstrapError",
    "Pin",
    "UsageError",
    "bootstrap",
    "main_bootstrap",
    "read_lock",
    "stack_cache",
    "stack_key",
    "wheelhouse_dir",
]

CACHE_ENV = "TUNEHARNESS_STACK_CACHE"
WHEELHOUSE_ENV = "TUNEHARNESS_WHEELHOUSE"
ACTIVE_FILE = "active"
DEFAULT_LOCK = Path(__file__).resolve().parent / "requirements.txt"
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)$")


class BootstrapError(RuntimeError):
    """The stack could not be made complete; the message says what to do."""


class UsageError(BootstrapError):
    """The bootstrap was called with something that cannot work (a lock, a wheelhouse): exit 2."""


@dataclass(frozen=True, slots=True)
class Pin:
    name: str  # normalised (PEP 503): lower case, runs of -_. as one -
    version: str

    def requirement(self) -> str:
        return f"{self.name}=={self.version}"


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: Path) -> tuple[Pin, ...]:
    """The pins of a lock file: `name==version` lines; blank lines and `#` comments ignored."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise UsageError(f"cannot read the lock {path}: {e.strerror}. Fix: pass --lock FILE") from None
    pins: list[Pin] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = _PIN.match(line)
        if m is None:
            raise UsageError(f"{path}:{n}: {line!r} is not a pin. Fix: write name==version, one a line")
        pins.append(Pin(_normalise(m.group(1)), m.group(2)))
    if not pins:
        raise UsageError(f"{path}: no pins. Fix: list the stack as name==version lines")
    return tuple(sorted(pins, key=lambda p: p.name))


def stack_cache(env: Mapping[str, str] | None = None) -> Path:
    """The cache root: TUNEHARNESS_STACK_CACHE, else ~/.cache/tuneharness."""
    env = os.environ if env is None else env
    return Path(env.get(CACHE_ENV) or Path.home() / ".cache" / "tuneharness")


def wheelhouse_dir(env: Mapping[str, str] | None = None) -> Path | None:
    """The wheelhouse to install from alone (TUNEHARNESS_WHEELHOUSE), or None: the package index."""
    env = os.environ if env is None else env
    return Path(env[WHEELHOUSE_ENV]) if env.get(WHEELHOUSE_ENV) else None


def stack_key(pins: tuple[Pin, ...]) -> str:
    """What the cache directory is keyed by: the pins, this Python's version and the machine type."""
    h = hashlib.sha256()
    h.update(f"{sys.implementation.name}-{sys.version_info.major}.{sys.version_info.minor}\n".encode())
    h.update(f"{platform.machine()}\n".encode())
    for p in pins:
        h.update(f"{p.requirement()}\n".encode())
    return h.hexdigest()[:16]


def _installed(paths: list[str]) -> dict[str, str]:
    """Distribution name -> version as an interpreter with `paths` as sys.path would import them."""
    found: dict[str, str] = {}
    for dist in metadata.distributions(path=paths):
        name = dist.metadata["Name"]
        if name:
            found.setdefault(_normalise(name), dist.version)
    return found


def _missing(pins: tuple[Pin, ...], have: dict[str, str]) -> list[Pin]:
    return [p for p in pins if have.get(p.name) != p.version]


def _site_paths(exclude: Path) -> list[str]:
    """sys.path without the script's own directory's stack caches (what the host's Python has)."""
    out = []
    for entry in sys.path:
        try:
            if entry and Path(entry).resolve().parent == exclude.resolve():
                continue
        except OSError:
            continue
        out.append(entry)
    return out


def _write_active(cache: Path, target: Path | None) -> None:
    tmp = cache / f".{ACTIVE_FILE}.{os.getpid()}"
    tmp.write_text("" if target is None else str(target), encoding="utf-8")
    os.replace(tmp, cache / ACTIVE_FILE)


def _pip_install(pins: list[Pin], into: Path, *, find_links: Path | None, timeout_s: float) -> None:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--no-deps",  # the lock is the whole closure
        "--no-input",
        "--disable-pip-version-check",
        "--no-warn-script-location",
        "--quiet",
        "--target",
        str(into),
    ]
    if find_links is not None:
        cmd += ["--no-index", "--find-links", str(find_links)]
    cmd += [p.requirement() for p in pins]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise BootstrapError(
            f"pip did not finish within {timeout_s:.0f}s. Fix: a faster mirror or a wheelhouse"
        ) from None
    if res.returncode != 0:
        tail = (res.stderr or res.stdout).strip().splitlines()[-3:]
        if "No module named pip" in (res.stderr or ""):
            raise BootstrapError(f"{sys.executable} has no pip. Fix: use an image whose Python has pip")
        raise BootstrapError(f"pip install failed (exit {res.returncode}): {' | '.join(tail)}")


def bootstrap(
    *,
    lock: Path = DEFAULT_LOCK,
    cache: Path | None = None,
    find_links: Path | None = None,
    timeout_s: float = 900.0,
    check: bool = False,
) -> dict[str, Any]:
    """Make the stack complete; return the report (the JSON line's content). Raises BootstrapError.
    With `check`, only report (`ok` false when anything is missing); install and activate nothing."""
    started = time.monotonic()
    pins = read_lock(lock)
    cache = cache or stack_cache()
    find_links = find_links or wheelhouse_dir()
    if find_links is not None and not find_links.is_dir():
        raise UsageError(f"wheelhouse {find_links} is not a directory. Fix: pass an existing --find-links DIR")
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / f"stack-{stack_key(pins)}"
    site = _site_paths(cache)
    cached = target.is_dir()
    have = _installed(([str(target)] if cached else []) + site)
    missing = _missing(pins, have)
    installed: list[str] = []
    if check:
        path = target if cached else None
        return _report(pins, have, path=path, installed=[], cached=cached, source=None, t0=started)
    if missing or not cached:
        if cached:  # the host's own packages changed under the cache: build it again
            missing = _missing(pins, _installed(site))
            cached = False
        if missing:
            tmp = cache / f".{target.name}.tmp-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            try:
                _pip_install(missing, tmp, find_links=find_links, timeout_s=timeout_s)
                still = _missing(tuple(missing), _installed([str(tmp)]))
                if still:
                    raise BootstrapError(
                        "pip installed other versions than the lock pins: "
                        + ", ".join(p.requirement() for p in still)
                        + ". Fix: check the wheelhouse or the index for these exact versions"
                    )
                _swap_in(tmp, target)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            installed = [p.name for p in missing]
            have = _installed([str(target), *site])
        elif target.exists():  # a stale cache the host no longer needs
            shutil.rmtree(target, ignore_errors=True)
    active = target if target.is_dir() else None
    _write_active(cache, active)
    source = "pypi" if find_links is None else f"wheelhouse {find_links}"
    return _report(pins, have, path=active, installed=installed, cached=cached, source=source, t0=started)


def _report(
    pins: tuple[Pin, ...],
    have: dict[str, str],
    *,
    path: Path | None,
    installed: list[str],
    cached: bool,
    source: str | None,
    t0: float,
) -> dict[str, Any]:
    still_missing = _missing(pins, have)
    return {
        "ok": not still_missing,
        "path": None if path is None else str(path),
        "installed": installed,
        "cached": cached,
        "missing": [p.requirement() for p in still_missing],
        "torch": have.get("torch"),  # the image's; the lock was resolved against trainer/requirements.txt's
        "versions": {p.name: have[p.name] for p in pins if p.name in have},
        "source": source,
        "seconds": round(time.monotonic() - t0, 3),
        "error": None,
    }


def _swap_in(tmp: Path, target: Path) -> None:
    """Rename the finished install into place; a concurrent bootstrap's result is as good as ours."""
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.rename(target, old)
    try:
        os.rename(tmp, target)
    except OSError:
        if not target.is_dir():
            raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def main_bootstrap(
    *,
    lock: Path | None = None,
    cache: Path | None = None,
    find_links: Path | None = None,
    timeout_s: float = 900.0,
    check: bool = False,
) -> int:
    started = time.monotonic()
    code = 1
    try:
        report = bootstrap(
            lock=lock or DEFAULT_LOCK, cache=cache, find_links=find_links, timeout_s=timeout_s, check=check
        )
    except (BootstrapError, OSError) as e:
        code = 2 if isinstance(e, UsageError) else 1
        report = {
            "ok": False,
            "path": None,
            "installed": [],
            "cached": False,
            "missing": [],
            "torch": None,
            "versions": {},
            "source": None,
            "seconds": round(time.monotonic() - started, 3),
            "error": str(e),
        }
    print(json.dumps(report), flush=True)
    if not report["ok"]:
        why = report["error"] or f"still missing: {', '.join(report['missing'])}"
        print(f"bootstrap: {why}", file=sys.stderr, flush=True)
    return 0 if report["ok"] else code


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="install the trainer's stack where this host lacks it")
    add_arguments(p)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lock", type=Path, default=None, help="the pins (default: trainer/requirements.txt)")
    p.add_argument(
        "--cache", type=Path, default=None, help=f"cache root (default: ${CACHE_ENV} or ~/.cache/tuneharness)"
    )
    p.add_argument(
        "--find-links",
        type=Path,
        default=None,
        help=f"install only from this wheelhouse, no index (default: ${WHEELHOUSE_ENV}, else PyPI)",
    )
    p.add_argument("--timeout-s", type=float, default=900.0, help="limit of the pip run")
    p.add_argument("--check", action="store_true", help="install nothing: exit 1 when anything is missing")


if __name__ == "__main__":  # pushed on its own as a script (see the module docstring)
    a = _parser().parse_args()
    sys.exit(main_bootstrap(lock=a.lock, cache=a.cache, find_links=a.find_links, timeout_s=a.timeout_s, check=a.check))
