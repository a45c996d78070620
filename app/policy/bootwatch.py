"""Boot watch: read the status line while the image pulls and decide when a boot is dead.

Three ways a boot dies, each with the evidence the ledger records:

- `boot_fatal`: the status line matches a known-fatal pattern (an OCI runtime error, `no space
  left`, `permission denied`, ...). Acted on at the first poll that shows it.
- `boot_frozen`: the line has stopped changing for longer than THIS host's cadence makes
  plausible. The cadence is learned from the line's own history: a host that refreshes every
  10 s and then goes quiet for a minute is frozen; a host that has refreshed every 2-3 minutes
  from the start is merely slow and is left alone. Before the line has changed twice the
  cadence is unknown and a generous window applies.
- `boot_deadline`: the boot takes longer than a deadline projected from the pull rate we have
  observed (`Downloading 3.21/23.00 GB`), so a host that keeps making progress never hits it.
- `boot_vanished`: the provider reports the instance gone, exited or stopped, or `unknown` for
  longer than a grace period.

`observe_boot(watch, state=..., status_line=..., now=...)` is pure: it returns the next watch
and a verdict (`None` = keep watching).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Literal

__all__ = [
    "DEFAULT_FATAL_PATTERNS",
    "BootKill",
    "BootReady",
    "BootVerdict",
    "BootWatch",
    "BootWatchConfig",
    "fatal_match",
    "freeze_window_s",
    "observe_boot",
    "parse_progress",
    "projected_pull_done_at",
    "pull_rate_gb_per_s",
    "start_watch",
]

# From the reference (providers.md "Failure signals") and the field reports; case-insensitive.
DEFAULT_FATAL_PATTERNS: tuple[str, ...] = (
    r"\berror\b",
    r"\berrors?:",
    r"\bfailed\b",
    r"\bfailure\b",
    r"oci runtime",
    r"permission denied",
    r"no space left",
    r"manifest unknown",
    r"pull access denied",
    r"cannot connect to the docker daemon",
    r"exec format error",
)

_PROGRESS = re.compile(r"(\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)\s*(GB|MB|GiB|MiB)", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class BootWatchConfig:
    """Knobs of the boot watch, all in seconds unless named otherwise."""

    poll_s: float = 10.0
    fatal_patterns: tuple[str, ...] = DEFAULT_FATAL_PATTERNS
    watch_freeze: bool = True  # naive renters do not
    # A learned cadence C kills after max(min_freeze_s, cadence_factor*C + poll_s) unchanged.
    cadence_factor: float = 1.5
    min_freeze_s: float = 30.0
    # Before the line has changed once: hosts that report only every 2-3 minutes from the start
    # exist (the slowest measured cadence is 180 s), so wait that long plus a minute.
    unknown_cadence_freeze_s: float = 240.0
    # After the pull shows complete, unpacking the image may keep the line still for a while.
    unpack_allowance_s: float = 300.0
    # Deadline: max(deadline_floor_s, deadline_factor x projected boot time from the pull rate);
    # without any measurable progress, no_progress_deadline_s.
    deadline_floor_s: float = 900.0
    deadline_factor: float = 2.0
    no_progress_deadline_s: float = 1800.0
    unknown_state_grace_s: float = 60.0
    history: int = 8  # change intervals remembered


@dataclass(frozen=True, slots=True)
class BootWatch:
    """What the watch remembers of one boot."""

    created_at: float
    last_line: str | None = None
    last_change_at: float | None = None  # when we first saw the current line
    first_seen_at: float | None = None
    intervals: tuple[float, ...] = ()  # seconds between observed changes, newest last
    first_progress: tuple[float, float] | None = None  # (when, gb done)
    last_progress: tuple[float, float] | None = None
    total_gb: float | None = None
    unknown_since: float | None = None
    polls: int = 0


@dataclass(frozen=True, slots=True)
class BootReady:
    """The instance is running: go on to the preflight."""

    boot_s: float


@dataclass(frozen=True, slots=True)
class BootKill:
    """Kill the attempt: it never held the job's work, so it may be destroyed."""

    reason: Literal["boot_fatal", "boot_frozen", "boot_deadline", "boot_vanished"]
    evidence: str


BootVerdict = BootReady | BootKill | None


def start_watch(*, created_at: float) -> BootWatch:
    return BootWatch(created_at=created_at)


def fatal_match(line: str | None, patterns: tuple[str, ...] = DEFAULT_FATAL_PATTERNS) -> str | None:
    """The first fatal pattern the line matches, or None."""
    if not line:
        return None
    for pat in patterns:
        if re.search(pat, line, re.IGNORECASE):
            return pat
    return None


def parse_progress(line: str | None) -> tuple[float, float] | None:
    """`Downloading 3.21/23.00 GB` -> (3.21, 23.0) in GB; None when the line shows no progress."""
    if not line:
        return None
    m = _PROGRESS.search(line)
    if not m:
        return None
    done, total, unit = float(m.group(1)), float(m.group(2)), m.group(3).lower()
    if unit.startswith("m"):
        done, total = done / 1000.0, total / 1000.0
    if total <= 0:
        return None
    return done, total


def freeze_window_s(watch: BootWatch, cfg: BootWatchConfig) -> float:
    """How long the line may stay unchanged before the boot counts as frozen."""
    if not watch.intervals:
        window = cfg.unknown_cadence_freeze_s
    else:
        cadence = max(watch.intervals[-cfg.history :])
        window = max(cfg.min_freeze_s, cfg.cadence_factor * cadence + cfg.poll_s)
    lp, total = watch.last_progress, watch.total_gb
    if lp is not None and total is not None and lp[1] >= total - 1e-9:
        window = max(window, cfg.unpack_allowance_s)
    return window


def _recent_rate_gb_per_s(watch: BootWatch) -> float | None:
    fp, lp = watch.first_progress, watch.last_progress
    if fp is not None and lp is not None and lp[0] > fp[0] and lp[1] > fp[1]:
        return (lp[1] - fp[1]) / (lp[0] - fp[0])
    return None


def pull_rate_gb_per_s(watch: BootWatch) -> float | None:
    """The average pull rate since the create (GB/s): what the status line shows done, over the
    time from the create to when that line was first seen; None before it shows any progress.
    Measured from the create, like a finished boot's create-to-running time, so the two compare."""
    lp, seen_at = watch.last_progress, watch.last_change_at
    if lp is None or seen_at is None or lp[1] <= 0 or seen_at <= watch.created_at:
        return None
    return lp[1] / (seen_at - watch.created_at)


def projected_pull_done_at(watch: BootWatch) -> float | None:
    """When the pull will be done at the average rate since the create, or None while no
    progress is shown."""
    rate, lp, total, seen_at = pull_rate_gb_per_s(watch), watch.last_progress, watch.total_gb, watch.last_change_at
    if rate is None or lp is None or total is None or seen_at is None:
        return None
    return seen_at + max(total - lp[1], 0.0) / rate


def _deadline_at(watch: BootWatch, cfg: BootWatchConfig) -> float:
    rate, lp, total = _recent_rate_gb_per_s(watch), watch.last_progress, watch.total_gb
    if rate is not None and lp is not None and total is not None:
        projected_done_at = lp[0] + max(total - lp[1], 0.0) / rate
        projected_boot_s = projected_done_at - watch.created_at
        return watch.created_at + max(cfg.deadline_floor_s, cfg.deadline_factor * projected_boot_s)
    return watch.created_at + cfg.no_progress_deadline_s


def _seen(watch: BootWatch, line: str | None, now: float, cfg: BootWatchConfig) -> BootWatch:
    watch = replace(watch, polls=watch.polls + 1)
    if watch.first_seen_at is None:
        watch = replace(watch, first_seen_at=now, last_line=line, last_change_at=now)
    elif line != watch.last_line:
        prev = watch.last_change_at if watch.last_change_at is not None else now
        # The first observed change is measured from the first sighting, which may undercount
        # the real interval; the next ones are exact to within one poll.
        intervals = (*watch.intervals, now - prev)[-cfg.history :]
        watch = replace(watch, last_line=line, last_change_at=now, intervals=intervals)
    prog = parse_progress(line)
    if prog is not None:
        done, total = prog
        sample = (now, done)
        first = watch.first_progress if watch.first_progress is not None else sample
        watch = replace(watch, first_progress=first, last_progress=sample, total_gb=total)
    return watch


def observe_boot(
    watch: BootWatch,
    *,
    state: str,
    status_line: str | None,
    now: float,
    cfg: BootWatchConfig = BootWatchConfig(),
) -> tuple[BootWatch, BootVerdict]:
    """Fold one poll of the instance into the watch; say whether to go on, proceed or kill."""
    watch = _seen(watch, status_line, now, cfg)
    age_s = now - watch.created_at
    if state == "running":
        return watch, BootReady(boot_s=age_s)
    if state in ("gone", "exited", "stopped"):
        return watch, BootKill("boot_vanished", f"state {state} after {age_s:.0f}s; line {status_line!r}")
    if state == "unknown":
        since = watch.unknown_since if watch.unknown_since is not None else now
        watch = replace(watch, unknown_since=since)
        if now - since >= cfg.unknown_state_grace_s:
            return watch, BootKill("boot_vanished", f"state unknown for {now - since:.0f}s")
    elif watch.unknown_since is not None:
        watch = replace(watch, unknown_since=None)

    pat = fatal_match(status_line, cfg.fatal_patterns)
    if pat is not None:
        return watch, BootKill("boot_fatal", f"status line {status_line!r} matches {pat!r}")

    if cfg.watch_freeze and watch.last_change_at is not None:
        still_s = now - watch.last_change_at
        window = freeze_window_s(watch, cfg)
        if still_s >= window:
            cadence = f"{max(watch.intervals):.0f}s" if watch.intervals else "unknown"
            return watch, BootKill(
                "boot_frozen",
                f"status line {status_line!r} unchanged for {still_s:.0f}s "
                f"(learned cadence {cadence}, window {window:.0f}s)",
            )

    deadline = _deadline_at(watch, cfg)
    if now >= deadline:
        return watch, BootKill(
            "boot_deadline", f"not running after {age_s:.0f}s (deadline {deadline - watch.created_at:.0f}s)"
        )
    return watch, None
