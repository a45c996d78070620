"""Ports: the protocols adapters implement. Domain code depends on these, never on adapters.

The Market port and its domain types live in `app.market`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol, runtime_checkable

from app.errors import TuneharnessError

__all__ = ["DEFAULT_MAX_OUTPUT_BYTES", "Clock", "CommandResult", "HostOutputTooLarge", "HostShell", "WallClock"]

# What one command on a host may print (stdout and stderr together) before it is cut off: a
# probe's status, log tail and JSON lines fit many times over; a host cannot fill our memory.
DEFAULT_MAX_OUTPUT_BYTES = 4 * 2**20


class HostOutputTooLarge(TuneharnessError):
    """A host's command output or file went past the size allowed for it; nothing more was read.
    Treat it as a failed probe or a refused artifact, never as data."""


@runtime_checkable
class Clock(Protocol):
    """Seconds since the epoch; virtual in the simulator, scaled under `sim serve`, the wall clock
    in production. A driver that waits in wall time (Celery countdowns, the trainer's slice cap)
    converts with `wall_seconds`; a wall timestamp (a trainer's log line) with `from_wall`."""

    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...

    def wall_seconds(self, clock_s: float) -> float:
        """How many wall seconds `clock_s` seconds of this clock take."""
        ...

    def from_wall(self, wall_s: float) -> float:
        """The wall timestamp `wall_s` on this clock."""
        ...


class WallClock:
    def now(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def wall_seconds(self, clock_s: float) -> float:
        return clock_s

    def from_wall(self, wall_s: float) -> float:
        return wall_s

    def utcnow(self) -> datetime:
        return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class CommandResult:
    exit_code: int
    stdout: str
    stderr: str


@runtime_checkable
class HostShell(Protocol):
    """Run commands on a (rented) host and move files to and from it.

    Whatever comes back is bounded: `run` raises HostOutputTooLarge past `max_output_bytes`
    (stdout and stderr together), `get` past `max_bytes` (None: no cap, for files we wrote).
    """

    def run(
        self, command: str, *, timeout_s: float = 60.0, max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    ) -> CommandResult: ...

    def put(self, local: Path, remote: str) -> None: ...

    def get(self, remote: str, local: Path, *, max_bytes: int | None = None) -> None: ...

    def listdir(self, remote: str) -> list[str]: ...

    def close(self) -> None: ...
