"""status.json (the heartbeat) and train.log (the line format triage reads).

train.log line grammar (one event per line; see docs/trainer.md):

    <UTC ISO-8601 with ms and Z> <event> key=value key=value ...

Values never contain spaces except inside double quotes (`reason="..."`). Lines that do not
start with a timestamp are traceback text belonging to the `failed` line that follows them.
"""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from trainer.fsutil import atomic_write_json

__all__ = ["PHASES", "StatusFile", "TrainLog", "format_line", "parse_line", "steps_by_slice", "utc_stamp"]

PHASES = ("loading", "training", "checkpointing", "finished", "failed")


def utc_stamp(t: float | None = None) -> str:
    dt = datetime.fromtimestamp(time.time() if t is None else t, UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def _value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}" if abs(v) >= 1e-3 or v == 0 else f"{v:.3e}"
    s = str(v)
    if not s or any(c.isspace() or c in '"=' for c in s):
        return json.dumps(" ".join(s.split()))
    return s


def format_line(event: str, fields: dict[str, Any], *, t: float | None = None) -> str:
    parts = [utc_stamp(t), event] + [f"{k}={_value(v)}" for k, v in fields.items()]
    return " ".join(parts)


def parse_line(line: str) -> tuple[str, str, dict[str, str]] | None:
    """(timestamp, event, fields) of a log line, or None for traceback text."""
    head = line.split(" ", 2)
    if len(head) < 2 or not (len(head[0]) == 24 and head[0].endswith("Z") and head[0][4] == "-"):
        return None
    rest = head[2] if len(head) == 3 else ""
    fields: dict[str, str] = {}
    i = 0
    while i < len(rest):
        eq = rest.index("=", i)
        key = rest[i:eq]
        if rest[eq + 1 : eq + 2] == '"':
            value, end = json.JSONDecoder().raw_decode(rest, eq + 1)
        else:
            end = rest.find(" ", eq + 1)
            end = len(rest) if end < 0 else end
            value = rest[eq + 1 : end]
        fields[key] = str(value)
        i = end + 1
    return head[0], head[1], fields


def steps_by_slice(text: str) -> list[list[dict[str, str]]]:
    """The fields of train.log's `step` lines, one list per slice that logged any (each slice's
    process begins with a `start` line): what the benchmarks read rates off."""
    slices: list[list[dict[str, str]]] = [[]]
    for parsed in map(parse_line, text.splitlines()):
        if parsed is None:
            continue
        if parsed[1] == "start":
            slices.append([])
        elif parsed[1] == "step":
            slices[-1].append(parsed[2])
    return [steps for steps in slices if steps]


class TrainLog:
    """Appends lines to DIR/train.log, flushed and fsynced per line (a kill loses nothing written)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh = open(path, "a", encoding="utf-8")  # noqa: SIM115 - lives as long as the run

    def event(self, event: str, durable: bool = True, **fields: Any) -> str:
        """Append one line; `durable=False` (step lines) flushes without fsync, which survives
        a killed process but not a host crash."""
        line = format_line(event, fields)
        self._write(line + "\n", durable=durable)
        return line

    def raw(self, text: str) -> None:
        """Traceback text: written as is, so fatal patterns (CUDA errors, OOM) stay greppable."""
        self._write(text if text.endswith("\n") else text + "\n")

    def _write(self, text: str, *, durable: bool = True) -> None:
        self._fh.write(text)
        self._fh.flush()
        if durable:
            os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()


class StatusFile:
    """DIR/status.json, rewritten atomically on every change and by a heartbeat thread."""

    def __init__(self, path: Path, *, max_steps: int, every_s: float = 5.0) -> None:
        self.path = path
        self.every_s = every_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._state: dict[str, Any] = {
            "step": 0,
            "max_steps": max_steps,
            "loss": None,
            "tokens_per_s": None,
            "samples_per_s": None,
            "last_checkpoint_step": None,
            "phase": "loading",
            "pid": os.getpid(),
            "updated_at": None,
            "error": None,
            "exit_code": None,
            "eval": None,
        }
        self._thread = threading.Thread(target=self._beat, name="status-heartbeat", daemon=True)

    def start(self) -> None:
        self.update()
        self._thread.start()

    def update(self, **fields: Any) -> None:
        with self._lock:
            if "phase" in fields and fields["phase"] not in PHASES:
                raise ValueError(f"unknown phase {fields['phase']!r}")
            self._state.update(fields)
            self._write_locked()

    def set(self, **fields: Any) -> None:
        """Change fields in memory; the heartbeat (or the next update) writes them."""
        with self._lock:
            self._state.update(fields)

    def _write_locked(self) -> None:
        self._state["updated_at"] = utc_stamp()
        try:
            atomic_write_json(self.path, self._state)
        except OSError:
            # A full disk must not kill the heartbeat thread; the failure is reported elsewhere.
            if threading.current_thread() is not self._thread:
                raise

    def _beat(self) -> None:
        while not self._stop.wait(self.every_s):
            with self._lock:
                self._write_locked()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    @property
    def state(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._state)
