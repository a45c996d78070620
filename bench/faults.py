"""The fault tests at the issue's full counts: `pytest -m faults` with TUNEHARNESS_FAULT_SCALE=full.

    python bench/faults.py                 # every fault test, one after another
    python bench/faults.py -k reaper       # only those whose name matches (pytest's -k)

Each fault test (tests/integration/faults/ and the others marked `faults`) repeats its fault
`rounds(ci=..., full=...)` times (`tests/support/faultlab.py`), asserts its pass criterion, and
records what it measured. This runs them at full scale through pytest, reads the records and
pytest's own outcome per test, and writes bench/results/faults.json: one row per scenario with its
criterion, rounds, the measured counts and passed/failed. `make test` runs the same tests at the
small CI scale. Exits 1 when any fault test failed (the table still says which).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import _results

REPO = Path(__file__).resolve().parents[1]


def _outcomes(junit: Path) -> list[dict[str, Any]]:
    """Each test pytest ran: its node name, outcome and seconds, from the JUnit XML it wrote."""
    out: list[dict[str, Any]] = []
    if not junit.is_file():
        return out
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            if case.find(tag) is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
        out.append(
            {
                "test": f"{case.get('classname', '')}::{case.get('name', '')}",
                "outcome": outcome,
                "seconds": round(float(case.get("time", "0") or 0), 1),
            }
        )
    return out


def _measured(values: dict[str, Any]) -> str:
    return ", ".join(f"{k} {json.dumps(v) if isinstance(v, list | dict) else v}" for k, v in sorted(values.items()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-k", dest="keyword", default="", help="only the fault tests matching this pytest -k expression")
    ap.add_argument("--name", default="faults", help="the results file's name (bench/results/NAME.json)")
    args = ap.parse_args(argv)
    started = _results.start()
    with tempfile.TemporaryDirectory(prefix="th-faults-") as tmp:
        records, junit = Path(tmp) / "records", Path(tmp) / "junit.xml"
        env = {**os.environ, "TUNEHARNESS_FAULT_SCALE": "full", "TUNEHARNESS_FAULT_REPORT": str(records)}
        cmd = [sys.executable, "-m", "pytest", "-q", "-m", "faults", "-p", "no:cacheprovider", f"--junitxml={junit}"]
        if args.keyword:
            cmd += ["-k", args.keyword]
        print("running:", " ".join(cmd[2:]), flush=True)
        t0 = time.monotonic()
        rc = subprocess.call(cmd, cwd=REPO, env=env)
        wall = time.monotonic() - t0
        outcomes = _outcomes(junit)
        recs = [json.loads(p.read_text()) for p in sorted(records.glob("*.json"))] if records.is_dir() else []
    rows = [[r["scenario"], r["criterion"], r["rounds"], _measured(r["measured"]), "passed"] for r in recs]
    failed = [o for o in outcomes if o["outcome"] in ("failed", "error")]
    rows += [[o["test"], "see the test", None, "-", o["outcome"]] for o in failed]
    tables = [
        _results.table(
            "Fault scenarios",
            ["scenario", "pass criterion", "rounds", "measured", "result"],
            rows,
            note=f"{len(outcomes)} fault tests, {len(failed)} failed, {wall:.0f} s in all, one after another.",
        ),
        _results.table(
            "Fault tests' wall time",
            ["test", "outcome", "s"],
            [[o["test"], o["outcome"], o["seconds"]] for o in outcomes],
        ),
    ]
    _results.write(args.name, tables, started=started, raw={"records": recs, "outcomes": outcomes, "pytest_rc": rc})
    print(f"{len(recs)} scenarios recorded, {len(failed)} failed; wrote bench/results/{args.name}.json")
    return 1 if failed or rc not in (0, 5) else 0


if __name__ == "__main__":
    raise SystemExit(main())
