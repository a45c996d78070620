"""What `tuneharness up` started, written down under TUNEHARNESS_HOME so every shell finds it.

`up` writes `TUNEHARNESS_HOME/run/stack.json` (atomically, mode 0600: the broker URL may hold a
password) when its children are up, and removes it when they stop. Every other command reads it
through `adopt`: a setting the shell does not set itself (the broker, the shared simulated
marketplace and its scale) is taken from the running stack, so a second shell neither misses the
broker nor falls back to a fresh in-process simulated marketplace while a shared one runs. A value
the shell sets wins. A file whose `up` process is gone (killed -9) is stale and ignored.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import MutableMapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path

__all__ = ["ADOPTED", "StackState", "adopt", "home_of", "read", "remove", "state_path", "write"]

FILE_NAME = "stack.json"
# The settings a running stack answers for, in groups taken together or not at all (a shell that
# names its own broker keeps its own result backend too): variable -> the state field it comes from.
ADOPTED: tuple[dict[str, str], ...] = (
    {"TUNEHARNESS_BROKER_URL": "broker_url", "TUNEHARNESS_RESULT_URL": "result_url"},
    {"TUNEHARNESS_SIM_URL": "sim_url", "TUNEHARNESS_SIM_SCALE": "sim_scale"},
)


@dataclass(frozen=True, slots=True)
class StackState:
    """One running `tuneharness up`."""

    pid: int
    host: str
    started_at: float  # epoch seconds
    broker_url: str
    result_url: str = ""
    sim_url: str = ""
    sim_scale: str = ""
    flower_url: str = ""
    web_url: str = ""
    logs: str = ""

    def alive(self) -> bool:
        """Is the `up` process still running? (A state from another machine is taken as alive.)"""
        if self.host != socket.gethostname():
            return True
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # someone else's process: it exists
            return True
        return True


def home_of(env: MutableMapping[str, str]) -> Path:
    """TUNEHARNESS_HOME as `app.settings` reads it (without validating anything else)."""
    return Path(env.get("TUNEHARNESS_HOME") or str(Path.home() / ".tuneharness")).expanduser()


def state_path(home: Path) -> Path:
    return home / "run" / FILE_NAME


def write(home: Path, state: StackState) -> Path:
    """Write the state atomically (a reader never sees half a file), readable by its owner only."""
    path = state_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{FILE_NAME}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(asdict(state), fh, indent=2)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path


def read(home: Path) -> StackState | None:
    """The recorded stack, or None when there is none or the file is not one (never raises)."""
    try:
        data = json.loads(state_path(home).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    known = {f.name for f in fields(StackState)}
    try:
        return StackState(**{k: v for k, v in data.items() if k in known})
    except TypeError:
        return None


def remove(home: Path, *, pid: int) -> None:
    """Remove the state if `pid` wrote it (a second `up` in the same home keeps its own)."""
    current = read(home)
    if current is not None and current.pid == pid:
        state_path(home).unlink(missing_ok=True)


def adopt(env: MutableMapping[str, str]) -> StackState | None:
    """Fill the settings `env` leaves unset from the running stack; return that stack (None: none runs)."""
    state = read(home_of(env))
    if state is None or not state.alive():
        return None
    for group in ADOPTED:
        if any(env.get(variable) for variable in group):
            continue
        for variable, attr in group.items():
            value = str(getattr(state, attr) or "")
            if value:
                env[variable] = value
    return state
