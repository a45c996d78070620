"""The nemesis at full scale: 500 jobs or more through the production money and control code in
virtual time, with process, broker and vendor faults interleaved and every invariant checked after
every step (tests/support/nemesis.py says what is driven and what each invariant means).

    .venv/bin/python bench/nemesis.py [--seed S] [--jobs N] [--pg URL]

Prints progress and writes bench/results/nemesis.json (`bench/report.py` renders it). A violation
is printed with the seed and the step that replay it and recorded (each distinct one once); the
run goes on so that its counts are written, and exits 1.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from bench import _results  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    from support.nemesis import InvariantViolation, Nemesis, NemesisConfig, scratch_dir

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=500)
    ap.add_argument("--hosts", type=int, default=80, help="machines in the simulated marketplace")
    ap.add_argument("--pg", default=None, help="a PostgreSQL URL (a fresh database) instead of a SQLite file")
    args = ap.parse_args(argv)
    started = _results.start()
    with scratch_dir() as tmp:
        nemesis = Nemesis(
            NemesisConfig(seed=args.seed, jobs=args.jobs, hosts=args.hosts, db_url=args.pg, stop_at_violation=False),
            tmp,
            progress=lambda line: print(line, file=sys.stderr, flush=True),
        )
        try:
            result = nemesis.run()
        except InvariantViolation as exc:
            print(f"VIOLATION: {exc}", file=sys.stderr)
            return 1
    c = result.counts()
    print(c)
    database = "PostgreSQL" if args.pg else "SQLite file"
    tables = [
        _results.table(
            "nemesis run (seed, jobs, steps, checks)",
            ["seed", "jobs", "steps", "invariant checks", "violations", "virtual hours", "wall s", "database"],
            [
                [
                    c["seed"],
                    c["jobs"],
                    c["steps"],
                    c["invariant_checks"],
                    c["violations"],
                    c["virtual_hours"],
                    c["wall_s"],
                    database,
                ]
            ],
            note="every invariant checked after every step: vendor instances known, reserved + spent <= cap, "
            "ledger verifies, one create per (job, attempt), no job without a future wake-up",
        ),
        _results.table(
            "nemesis outcomes",
            [
                "completed",
                "failed",
                "cancelled",
                "poisoned",
                "creates",
                "duplicates",
                "orphans stopped",
                "crashed creates adopted",
                "rentals live at the end",
            ],
            [
                [
                    c["completed"],
                    c["failed"],
                    c["cancelled"],
                    c["poisoned"],
                    c["creates"],
                    c["duplicates"],
                    c["orphans_stopped"],
                    c["crashed_creates_adopted"],
                    len(c["live_rentals_at_end"]),
                ]
            ],
            note="failed: budget caps reached (5% of jobs get a cap below one attempt) or a poisoned message; "
            "duplicates must be 0",
        ),
        _results.table(
            "nemesis faults injected, by kind",
            ["fault", "count"],
            [[k, v] for k, v in c["faults"].items()],
            note=f"{c['faults_total']} faults in all; vendor faults are counted when they fire",
        ),
    ]
    if c["violation_messages"]:
        tables.append(
            _results.table(
                "nemesis violations (each distinct one once)",
                ["violation"],
                [[m] for m in c["violation_messages"]],
                note="each names the seed and the step that replay it",
            )
        )
    _results.write("nemesis", tables, started=started, raw=c)
    return 1 if c["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
