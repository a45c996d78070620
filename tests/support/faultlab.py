"""Fault tests at two scales: a few rounds in `make test`, the issue's full counts in `bench/faults.py`.

A fault test (marked `faults`) asks `rounds(ci=..., full=...)` how many times to repeat its fault,
asserts its pass criterion, then calls `record(...)` with what it measured. `bench/faults.py` runs
every fault test with TUNEHARNESS_FAULT_SCALE=full and TUNEHARNESS_FAULT_REPORT pointing at a
directory, and turns the records into the table in docs/benchmarks.md. In `make test` neither
variable is set: the small counts run and `record` writes nothing.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

__all__ = ["REPORT_VAR", "SCALE_VAR", "full_scale", "record", "rounds"]

SCALE_VAR = "TUNEHARNESS_FAULT_SCALE"  # "ci" (the default) or "full"
REPORT_VAR = "TUNEHARNESS_FAULT_REPORT"  # a directory for the records; unset: nothing is written


def full_scale() -> bool:
    """True when bench/faults.py runs the fault tests at the issue's full counts."""
    scale = os.environ.get(SCALE_VAR, "ci")
    if scale not in ("ci", "full"):
        raise ValueError(f"{SCALE_VAR}={scale!r}: use 'ci' or 'full'")
    return scale == "full"


def rounds(*, ci: int, full: int) -> int:
    """How many times a fault test repeats its fault at this scale."""
    return full if full_scale() else ci


def record(scenario: str, *, criterion: str, rounds: int, **measured: Any) -> None:
    """Write one fault test's outcome (after its assertions passed) for bench/faults.py.

    `measured` holds the counts the criterion is about (creates, orphans, seconds to failover...);
    values must be JSON numbers, strings, booleans, lists of those, or None.
    """
    out = os.environ.get(REPORT_VAR)
    if not out:
        return
    if not re.fullmatch(r"[a-z0-9_]+", scenario):
        raise ValueError(f"scenario {scenario!r}: lower-case letters, digits and underscores only")
    doc = {"scenario": scenario, "criterion": criterion, "rounds": rounds, "measured": measured}
    path = Path(out) / f"{scenario}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)
