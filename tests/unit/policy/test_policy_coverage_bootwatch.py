"""Boot-watch decisions that the main tests leave undriven: an empty pull and a finished pull that unpacks."""

from __future__ import annotations

from app.policy.bootwatch import BootKill, observe_boot, parse_progress, start_watch


def test_a_pull_of_zero_total_is_no_progress() -> None:
    """A status line claiming `0/0 GB` shows no progress (a zero total cannot project anything)."""
    assert parse_progress("Downloading 0/0 GB") is None
    assert parse_progress("Downloading 300/1000 MB") == (0.3, 1.0)


def test_a_finished_pull_may_stay_still_while_the_image_unpacks() -> None:
    """Once the line shows the pull complete, a still line is frozen only after the unpack allowance."""
    w = start_watch(created_at=0.0)
    for t, done in ((10.0, "10.00"), (20.0, "20.00"), (30.0, "23.00")):
        w, verdict = observe_boot(w, state="loading", status_line=f"Downloading {done}/23.00 GB", now=t)
        assert verdict is None
    # Learned cadence 10 s: a half-done pull would be frozen after 30 s; a finished one unpacks.
    w, verdict = observe_boot(w, state="loading", status_line="Downloading 23.00/23.00 GB", now=300.0)
    assert verdict is None
    _, verdict = observe_boot(w, state="loading", status_line="Downloading 23.00/23.00 GB", now=330.0)
    assert isinstance(verdict, BootKill) and verdict.reason == "boot_frozen"


def test_a_half_done_pull_that_stops_is_frozen_at_the_learned_cadence() -> None:
    """The same host, still at 20 of 23 GB, is killed as frozen 30 s after its last change."""
    w = start_watch(created_at=0.0)
    for t, done in ((10.0, "10.00"), (20.0, "15.00"), (30.0, "20.00")):
        w, _ = observe_boot(w, state="loading", status_line=f"Downloading {done}/23.00 GB", now=t)
    _, verdict = observe_boot(w, state="loading", status_line="Downloading 20.00/23.00 GB", now=60.0)
    assert isinstance(verdict, BootKill) and verdict.reason == "boot_frozen"


def test_a_state_unknown_spell_ended_by_a_known_state_restarts_the_grace() -> None:
    """Unknown for 50 s, loading once, unknown again: the grace (60 s) counts from the second spell."""
    w = start_watch(created_at=0.0)
    w, _ = observe_boot(w, state="unknown", status_line=None, now=10.0)
    w, _ = observe_boot(w, state="loading", status_line=None, now=60.0)
    assert w.unknown_since is None
    w, verdict = observe_boot(w, state="unknown", status_line=None, now=70.0)
    assert verdict is None and w.unknown_since == 70.0
    _, verdict = observe_boot(w, state="unknown", status_line=None, now=130.0)
    assert isinstance(verdict, BootKill) and verdict.reason == "boot_vanished"
