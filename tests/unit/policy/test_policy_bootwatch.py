"""Boot watch: fatal patterns, freeze detection that learns each host's cadence, and deadlines."""

from __future__ import annotations

from app.policy.bootwatch import (
    BootKill,
    BootReady,
    BootWatch,
    BootWatchConfig,
    fatal_match,
    observe_boot,
    parse_progress,
    projected_pull_done_at,
    pull_rate_gb_per_s,
    start_watch,
)

CFG = BootWatchConfig()


def run(lines: list[tuple[float, str, str | None]], cfg: BootWatchConfig = CFG) -> tuple[BootWatch, object, float]:
    """Feed (time, state, line) polls until a verdict; return the watch, verdict and its time."""
    w = start_watch(created_at=0.0)
    for t, state, line in lines:
        w, v = observe_boot(w, state=state, status_line=line, now=t, cfg=cfg)
        if v is not None:
            return w, v, t
    return w, None, lines[-1][0]


def pull(*, every_s: float, gb_per_s: float, total: float = 23.0, freeze_at: float | None = None,
         until: float, poll_s: float = 10.0) -> list[tuple[float, str, str | None]]:
    """A host that refreshes its status every `every_s`, optionally freezing, polled every poll_s."""
    out = []
    t = poll_s
    while t <= until:
        seen = t if freeze_at is None else min(t, freeze_at)
        refreshed = (seen // every_s) * every_s
        done = min(total, refreshed * gb_per_s)
        out.append((t, "loading", f"Downloading {done:.2f}/{total:.2f} GB"))
        t += poll_s
    return out


def test_fatal_patterns_match_known_errors_case_insensitively() -> None:
    """OCI runtime errors, no space left, permission denied and 'failed' are fatal."""
    assert fatal_match("OCI runtime create failed: runc create failed")
    assert fatal_match("write /opt/x: No space left on device")
    assert fatal_match("mkdir: permission denied")
    assert fatal_match("Downloading 3.21/23.00 GB") is None
    assert fatal_match(None) is None


def test_fatal_line_kills_at_the_first_poll_that_shows_it() -> None:
    """A fatal status line is acted on at once, with the line as evidence."""
    _, verdict, t = run([(10.0, "loading", "Downloading 1.00/23.00 GB"), (20.0, "loading", "Error: failed to pull image")])
    assert isinstance(verdict, BootKill) and verdict.reason == "boot_fatal" and t == 20.0
    assert "failed to pull image" in verdict.evidence


def test_fast_cadence_host_that_freezes_is_killed_quickly() -> None:
    """A 10 s reporter that goes quiet is killed within about three of its intervals."""
    _, verdict, t = run(pull(every_s=10, gb_per_s=0.05, freeze_at=200, until=2000))
    assert isinstance(verdict, BootKill) and verdict.reason == "boot_frozen"
    assert 200 < t <= 200 + 45


def test_slow_cadence_healthy_host_is_not_killed() -> None:
    """A host that refreshes every 180 s from the start reaches running untouched."""
    lines = pull(every_s=180, gb_per_s=0.02, until=1150)
    lines.append((1160.0, "running", "running"))
    _, verdict, _ = run(lines)
    assert isinstance(verdict, BootReady)


def test_slow_cadence_host_that_freezes_is_killed_after_its_own_cadence() -> None:
    """A 150 s reporter that freezes is killed after about 1.5 of its intervals, not at 10 s speed."""
    _, verdict, t = run(pull(every_s=150, gb_per_s=0.02, freeze_at=500, until=3000))
    assert isinstance(verdict, BootKill) and verdict.reason == "boot_frozen"
    assert 450 + 150 < t <= 450 + 1.5 * 150 + 30
    assert "learned cadence" in verdict.evidence


def test_unknown_cadence_waits_longer_than_any_plausible_cadence() -> None:
    """Before the line has changed once, the freeze window exceeds three minutes."""
    _, verdict, t = run([(float(t), "loading", "Downloading 0.00/23.00 GB") for t in range(10, 400, 10)])
    assert isinstance(verdict, BootKill) and verdict.reason == "boot_frozen" and t > 180


def test_a_slow_but_progressing_host_never_hits_the_deadline() -> None:
    """A host pulling at 30 Mb/s for 100 minutes keeps going, because the deadline follows its rate."""
    rate = 30 / 8000  # GB/s
    lines = pull(every_s=10, gb_per_s=rate, until=6100)
    _, verdict, _ = run(lines)
    assert verdict is None


def test_deadline_without_measurable_progress() -> None:
    """A line that changes but shows no progress is killed at the no-progress deadline."""
    lines = [(float(t), "loading", f"extracting layer {t}") for t in range(10, 4000, 10)]
    _, verdict, t = run(lines)
    assert isinstance(verdict, BootKill) and verdict.reason == "boot_deadline" and t == CFG.no_progress_deadline_s


def test_vanished_and_unknown_states() -> None:
    """Gone is at once; unknown only after its grace period."""
    _, v, _ = run([(10.0, "gone", None)])
    assert isinstance(v, BootKill) and v.reason == "boot_vanished"
    _, v, t = run([(float(t), "unknown", None) for t in range(10, 200, 10)])
    assert isinstance(v, BootKill) and v.reason == "boot_vanished" and t >= 10 + CFG.unknown_state_grace_s


def test_naive_watch_only_times_out() -> None:
    """With freeze watching off and no patterns, only the flat 30-minute deadline kills."""
    naive = BootWatchConfig(fatal_patterns=(), watch_freeze=False, deadline_floor_s=1800, deadline_factor=0,
                            no_progress_deadline_s=1800)
    lines = [(float(t), "loading", "Error: broken") for t in range(60, 3600, 60)]
    _, v, t = run(lines, naive)
    assert isinstance(v, BootKill) and v.reason == "boot_deadline" and t == 1800


def test_parse_progress_units() -> None:
    """Progress lines in GB and MB both read as GB."""
    assert parse_progress("Downloading 3.21/23.00 GB") == (3.21, 23.0)
    assert parse_progress("pulled 500/1000 MB") == (0.5, 1.0)
    assert parse_progress("running") is None


def test_the_pull_is_projected_from_the_average_rate_since_the_create() -> None:
    """The rate is what the line shows done over the time since the create (to when that line was
    first seen); the projection is when the whole download is done at that rate."""
    w, _, _ = run(pull(every_s=10.0, gb_per_s=0.05, until=20.0))
    assert pull_rate_gb_per_s(w) is not None and abs(pull_rate_gb_per_s(w) - 0.05) < 1e-9  # type: ignore[operator]
    assert abs(projected_pull_done_at(w) - 23.0 / 0.05) < 1e-6  # type: ignore[operator]
    slow, _, _ = run(pull(every_s=30.0, gb_per_s=0.05, until=40.0))  # line refreshed at 30 s, seen at 30 s
    assert abs(projected_pull_done_at(slow) - 23.0 / 0.05) < 1e-6  # type: ignore[operator]


def test_no_projection_before_the_line_shows_progress() -> None:
    """A host that has shown nothing yet (or 0 GB) has no rate and no projection."""
    w, _, _ = run([(10.0, "loading", "Downloading 0.00/23.00 GB")])
    assert pull_rate_gb_per_s(w) is None and projected_pull_done_at(w) is None
    assert projected_pull_done_at(start_watch(created_at=0.0)) is None
