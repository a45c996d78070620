"""Clocks of the simulated marketplace: virtual time and scaled real time.

Both implement `app.ports.Clock`. `VirtualClock` moves only when told to (the campaign
simulator and unit tests). `ScaledClock` runs `scale` simulated seconds per wall second since
its epoch; two processes that share `(epoch, scale)` read the same simulated time, which is how
Celery workers, the CLI and `tuneharness sim serve` agree on "now".
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

__all__ = ["ScaledClock", "VirtualClock"]


class VirtualClock:
    """Time that moves only by `advance`/`sleep`/`set`; `sleep` returns at once."""

    def __init__(self, start_s: float = 1_750_000_000.0) -> None:
        self._now_s = float(start_s)
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now_s

    def advance(self, seconds: float) -> float:
        """Move time forward by `seconds` (never backwards); return the new now."""
        if seconds < 0:
            raise ValueError(f"a clock never runs backwards (advance by {seconds})")
        with self._lock:
            self._now_s += seconds
            return self._now_s

    def set(self, now_s: float) -> None:
        with self._lock:
            if now_s < self._now_s:
                raise ValueError(f"a clock never runs backwards ({now_s} < {self._now_s})")
            self._now_s = float(now_s)

    def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))

    def wall_seconds(self, clock_s: float) -> float:
        """Virtual time passes only when told: no wall time is needed to wait for it."""
        return 0.0

    def from_wall(self, wall_s: float) -> float:
        """Virtual time has no relation to the wall clock: a wall timestamp reads as itself."""
        return wall_s


@dataclass(frozen=True, slots=True)
class ScaledClock:
    """Simulated seconds = epoch + scale x (wall seconds since epoch).

    At the epoch the simulated and the wall clock agree; afterwards simulated time runs
    `scale` times faster. `sleep(s)` sleeps s/scale wall seconds.
    """

    scale: float = 1.0
    epoch_s: float = 0.0

    @classmethod
    def starting_now(cls, scale: float = 1.0) -> ScaledClock:
        if scale <= 0:
            raise ValueError(f"scale must be > 0, got {scale}")
        return cls(scale=float(scale), epoch_s=time.time())

    def now(self) -> float:
        return self.epoch_s + self.scale * (time.time() - self.epoch_s)

    def wall_seconds(self, clock_s: float) -> float:
        """How many wall seconds `clock_s` of simulated time take."""
        return clock_s / self.scale

    def from_wall(self, wall_s: float) -> float:
        """The wall timestamp `wall_s` in simulated seconds."""
        return self.epoch_s + self.scale * (wall_s - self.epoch_s)

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds / self.scale)

    def to_dict(self) -> dict[str, float]:
        return {"scale": self.scale, "epoch_s": self.epoch_s}
