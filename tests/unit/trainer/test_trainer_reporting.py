"""train.log line format and status.json: interfaces that triage and the monitor read."""

from __future__ import annotations

import json
from pathlib import Path

from trainer.reporting import StatusFile, TrainLog, format_line, parse_line


def test_line_roundtrips_with_quoted_reason() -> None:
    """A log line parses back into its event and fields, spaces in values quoted."""
    line = format_line("failed", {"exit_code": 5, "reason": 'OSError: [Errno 28] No space "left"'}, t=0)
    assert line.startswith("1970-01-01T00:00:00.000Z failed exit_code=5 reason=")
    stamp, event, fields = parse_line(line)  # type: ignore[misc]
    assert (stamp, event) == ("1970-01-01T00:00:00.000Z", "failed")
    assert fields == {"exit_code": "5", "reason": 'OSError: [Errno 28] No space "left"'}


def test_step_line_fields() -> None:
    """A step line carries step, loss, lr, grad norm, throughput and elapsed time."""
    line = format_line(
        "step",
        {
            "step": 3,
            "max_steps": 10,
            "loss": 2.5,
            "lr": 2e-4,
            "grad_norm": 0.5,
            "tokens_per_s": 100.0,
            "samples_per_s": 2.0,
            "elapsed_s": 1.5,
        },
    )
    parsed = parse_line(line)
    assert parsed is not None
    assert parsed[2]["lr"] == "2.000e-04" and parsed[2]["loss"] == "2.5"


def test_traceback_text_is_not_a_line() -> None:
    """Traceback text (no timestamp) is recognised as such."""
    assert parse_line("Traceback (most recent call last):") is None
    assert parse_line('  File "x.py", line 3, in f') is None


def test_log_appends_and_status_is_whole_json(tmp_path: Path) -> None:
    """The log appends lines; status.json always holds the documented fields."""
    log = TrainLog(tmp_path / "train.log")
    log.event("start", pid=1)
    log.raw("Traceback (most recent call last):\n  boom")
    log.event("failed", reason="boom")
    log.close()
    lines = (tmp_path / "train.log").read_text().splitlines()
    assert len(lines) == 4 and parse_line(lines[-1])[1] == "failed"  # type: ignore[index]
    status = StatusFile(tmp_path / "status.json", max_steps=10, every_s=5)
    status.start()
    status.update(phase="training", step=3)
    status.stop()
    data = json.loads((tmp_path / "status.json").read_text())
    assert {
        "step",
        "max_steps",
        "loss",
        "tokens_per_s",
        "samples_per_s",
        "last_checkpoint_step",
        "phase",
        "pid",
        "updated_at",
    } <= set(data)
    assert (data["phase"], data["step"]) == ("training", 3)


def test_heartbeat_rewrites_status_without_progress(tmp_path: Path) -> None:
    """The heartbeat thread rewrites status.json on its own (updated_at moves) while nothing else happens."""
    import threading

    status = StatusFile(tmp_path / "status.json", max_steps=10, every_s=0.1)
    status.start()
    first = json.loads((tmp_path / "status.json").read_text())["updated_at"]
    moved = False
    for _ in range(100):  # bounded wait, at most ~5 s
        threading.Event().wait(0.05)
        if json.loads((tmp_path / "status.json").read_text())["updated_at"] != first:
            moved = True
            break
    status.stop()
    assert moved


def test_steps_by_slice_groups_step_lines_by_the_slice_that_logged_them() -> None:
    """A `start` line begins a slice; slices that logged no step are left out; other lines are ignored."""
    from trainer.reporting import format_line, steps_by_slice

    lines = [
        format_line("start", {"pid": 1}),
        format_line("step", {"step": 1}),
        format_line("step", {"step": 2}),
        "Traceback (most recent call last):",
        format_line("cap", {"step": 2}),
        format_line("start", {"pid": 2}),
        format_line("failed", {"exit_code": 1}),
        format_line("start", {"pid": 3}),
        format_line("step", {"step": 3}),
    ]
    assert [[s["step"] for s in block] for block in steps_by_slice("\n".join(lines))] == [["1", "2"], ["3"]]
