"""What every benchmark records beside its numbers: the command, the machine, its load, the date.

A bench calls `started = start()` before it measures and `write(name, tables, started=started)`
after, which writes `bench/results/<name>.json` (schema `RESULTS_SCHEMA`):

    {"schema": ..., "bench": "foundation", "command": ".venv/bin/python bench/foundation.py ...",
     "cpu_affinity": [0], "started_utc": "2026-12-04T23:12:05Z", "finished_utc": ...,
     "machine": {"cpu": ..., "cores": 2, "ram_gib": 23.5, "os": ..., "python": ..., "torch": ...},
     "load_before": [1, 5, 15 min], "load_after": [...],
     "tables": [{"measure": ..., "columns": [...], "rows": [[...], ...], "note": ...}],
     "raw": {...}}

A table cell is a string (rendered as is), a number, a boolean, a list or null; `bench/report.py`
formats numbers the same way every time. `raw` keeps what the bench measured, unrendered.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["RESULTS_DIR", "RESULTS_SCHEMA", "Started", "machine", "start", "table", "to_json", "write"]

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO / "bench" / "results"
RESULTS_SCHEMA = "tuneharness-bench-results/1"


@dataclass(frozen=True)
class Started:
    """The moment a bench began measuring: its command line, the date and the load then."""

    command: str
    started_utc: str
    load_before: tuple[float, float, float]


def _utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _load() -> tuple[float, float, float]:
    one, five, fifteen = os.getloadavg()
    return round(one, 2), round(five, 2), round(fifteen, 2)


def _repo_relative(path: str) -> str:
    p = Path(path).absolute()
    return str(p.relative_to(REPO)) if p.is_relative_to(REPO) else path


def command_line(argv: list[str] | None = None) -> str:
    """The command as typed from the repository root: interpreter, script, arguments."""
    argv = sys.argv if argv is None else argv
    return shlex.join([_repo_relative(sys.executable), _repo_relative(argv[0]), *argv[1:]])


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _ram_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _os_name() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return f"{line.split('=', 1)[1].strip().strip(chr(34))}, Linux {platform.release()}"
    except OSError:
        pass
    return platform.platform()


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def machine() -> dict[str, Any]:
    """The machine a bench runs on: CPU model, cores, RAM, OS, Python and torch versions."""
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "ram_gib": _ram_gib(),
        "os": _os_name(),
        "python": platform.python_version(),
        "torch": _version("torch"),
    }


def start() -> Started:
    """Call before measuring: records the command line, the date and the load average."""
    return Started(command=command_line(), started_utc=_utc_now(), load_before=_load())


def table(measure: str, columns: list[str], rows: list[list[Any]], *, note: str = "") -> dict[str, Any]:
    """One measure's table, as `bench/report.py` renders it."""
    if any(len(r) != len(columns) for r in rows):
        raise ValueError(f"table {measure!r}: every row needs {len(columns)} cells")
    return {"measure": measure, "columns": columns, "rows": rows, "note": note}


def to_json(value: Any, depth: int = 0) -> str:
    """JSON with sorted keys, one key a line, and each list of plain values (a table row) on one
    line: the results files read and diff like the tables they hold."""
    pad = " " * depth
    if isinstance(value, dict) and value:
        items = [f"{pad} {json.dumps(str(k))}: {to_json(value[k], depth + 1)}" for k in sorted(value)]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(value, list) and any(isinstance(v, dict | list) for v in value):
        return "[\n" + ",\n".join(f"{pad} {to_json(v, depth + 1)}" for v in value) + f"\n{pad}]"
    return json.dumps(value, ensure_ascii=False)


def write(
    name: str,
    tables: list[dict[str, Any]],
    *,
    started: Started,
    raw: Any = None,
    machine_extra: dict[str, Any] | None = None,
    results_dir: Path | None = None,
) -> Path:
    """Write `<results_dir>/<name>.json` (atomically) and return its path. The directory defaults
    to $BENCH_RESULTS_DIR, else bench/results/ (a trial run elsewhere leaves the committed files be)."""
    results_dir = results_dir or Path(os.environ.get("BENCH_RESULTS_DIR") or RESULTS_DIR)
    doc = {
        "schema": RESULTS_SCHEMA,
        "bench": name,
        "command": started.command,
        "cpu_affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "started_utc": started.started_utc,
        "finished_utc": _utc_now(),
        "machine": {**machine(), **(machine_extra or {})},
        "load_before": list(started.load_before),
        "load_after": list(_load()),
        "tables": tables,
        "raw": raw,
    }
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(to_json(doc) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    print(f"\nwrote {_repo_relative(str(path))}", file=sys.stderr)
    return path
