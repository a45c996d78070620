"""Render docs/benchmarks.md and docs/money-benchmarks.md from the results files in bench/results/.

    python bench/report.py            # write both documents
    python bench/report.py --check    # exit 1 if either differs from what it would render

The money-safety families (MONEY_FAMILIES: fault tests at full counts, the nemesis, mutation
testing) go to docs/money-benchmarks.md; everything else to docs/benchmarks.md.

Each bench writes `bench/results/<name>.json` (`bench/_results.py`): its command line, the machine,
the load average before and after, the UTC date, and its tables. This renders one section per
bench and one table per measure, each headed by its command, machine, load and date. The recorded
GPU file (`gpu_h200_*.json`: two gpu.json reports, `run1` and `run2`, with the command and date
beside them) is rendered through bench/gpu.py's own tables. The output depends on the files only:
sections in a fixed order, files sorted by name, numbers formatted one way.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import _results  # noqa: E402

__all__ = ["DOC", "Run", "cell", "load_runs", "main", "render"]

DOC = REPO / "docs" / "benchmarks.md"
MONEY_DOC = REPO / "docs" / "money-benchmarks.md"
RESEARCH_DOC = REPO / "docs" / "research-benchmarks.md"
MAX_LINES = 400

# family: (section title, what the bench measures). Sections appear in this order; any other
# family follows, sorted by name.
SECTIONS: dict[str, tuple[str, str]] = {
    "foundation": (
        "Ledger, budget and task queue",
        "`bench/foundation.py`: appends to the hash-chained ledger, its verification and budget "
        "reservations on SQLite and PostgreSQL, and Celery round trips through Redis.",
    ),
    "campaign": (
        "Campaign simulator",
        "`bench/campaign.py`: the guarded, naive and oracle policies replayed on the simulated "
        "marketplace's traces; every number but wall time is the simulator's own receipt, and "
        "the same on every run.",
    ),
    "trainer": (
        "Trainer",
        "`bench/trainer.py`: one tiny NF4 job on the CPU run whole, as one `trainer run` process "
        "per slice, and through `trainer slices`; checkpoint I/O; speed and memory beside a plain "
        "transformers/peft loop.",
    ),
    "research": (
        "Autoresearch",
        "`bench/research.py`: a research run through the real fleet on the simulated marketplace (a tiny "
        "model on the CPU, 20-second time boxes, one lying host): the best validation loss after each "
        "iteration and what each accepted change cost to find.",
    ),
    "triage": (
        "Triage speed",
        "`bench/triage.py`: the rules stage's tails per second on one core, and the chain's time "
        "per tail with the shipped specialist.",
    ),
    "triage_real": (
        "Triage accuracy",
        "`bench/triage_real.py`: the rules and the chain without an LLM on the real excerpts "
        "from public issue threads (`data/triage/real/`), each batch split into a dev "
        "half and a test half before any classifier ran on it.",
    ),
    "gpu": (
        "GPU",
        "`bench/gpu.py` on a CUDA machine: the real preflight, and a real NF4 QLoRA job through the "
        "trainer, uninterrupted and resumed.",
    ),
    "scale": (
        "Control plane at scale",
        "`bench/scale.py`: N running jobs supervised by the real Celery workers and beat on Redis and "
        "PostgreSQL; per-job cost, poll lag, loss detection and sweep length against N. "
        "Plot: [scale.svg](scale.svg); what it means for a deployment: [deploy.md](deploy.md#running-at-scale).",
    ),
    "faults": (
        "Fault tests at full counts",
        "`bench/faults.py`: every test marked `faults` (real Redis, Celery workers and beats, "
        "databases, the vendor fakes on loopback) run with `TUNEHARNESS_FAULT_SCALE=full`, the "
        "issue's counts; `make test` runs the same tests a few rounds each.",
    ),
    "nemesis": (
        "Nemesis",
        "`bench/nemesis.py`: a seeded, randomized run interleaving process, broker and vendor faults "
        "while jobs run on the simulated marketplace, the money invariants checked after every step.",
    ),
    "mutation": (
        "Mutation testing of the money policy",
        "`make mutation` (`bench/mutation.py`): mutmut on the policy modules that decide money; "
        "every surviving mutant is listed, killed by a test or explained.",
    ),
}

# Families rendered into MONEY_DOC rather than DOC: the money-safety evidence has its own page.
MONEY_FAMILIES = ("faults", "nemesis", "mutation")
# Families rendered into RESEARCH_DOC: research runs through the fleet.
RESEARCH_FAMILIES = ("research",)


@dataclass(frozen=True)
class Run:
    """One bench run as rendered: where it came from and its tables."""

    family: str
    source: str  # the results file, relative to the repository
    label: str  # "" for a file holding one run, else the run's key in it
    command: str  # markdown: the command line in backticks, and how it was pinned
    machine: dict[str, Any]
    date: str
    load_before: list[float] | None
    load_after: list[float] | None
    tables: list[dict[str, Any]]
    note: str = ""


def cell(value: Any) -> str:
    """One table cell: numbers formatted by magnitude, the same way every time."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, list | tuple):
        return ", ".join(cell(v) for v in value)
    return str(value).replace("|", "\\|").replace("\n", " ")


def _float(x: float) -> str:
    """Thousands and up as whole numbers with separators; below, four significant digits without
    trailing zeros (31.17, 1.155, 0.0096, 0.0001615)."""
    if not math.isfinite(x):
        return "-"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if x == 0:
        return "0"
    decimals = max(0, 3 - math.floor(math.log10(abs(x))))
    text = f"{x:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def family_of(bench: str) -> str:
    """The section a bench's results belong to: `triage_chain` -> triage, `campaign_sweep` -> campaign."""
    matches = [f for f in SECTIONS if bench == f or bench.startswith(f + "_")]
    return max(matches, key=len) if matches else bench


def _date(started: str, finished: str) -> str:
    """`2026-12-04, 23:28-23:36 UTC` from two ISO stamps (one time when both fall in one minute)."""
    day, start = started[:10], started[11:16]
    end = finished[11:16] if finished[:10] == day else finished[:16].replace("T", " ")
    return f"{day}, {start} UTC" if end == start else f"{day}, {start}-{end} UTC"


def _command(doc: dict[str, Any]) -> str:
    """The command line in backticks, and the CPUs it was pinned to (`taskset -c`) if not all."""
    command, cpus, cores = f"`{doc['command']}`", doc.get("cpu_affinity"), doc["machine"].get("cores")
    if cpus and cores and len(cpus) < cores:
        command += f", pinned to CPU {','.join(str(c) for c in cpus)} (`taskset -c {','.join(str(c) for c in cpus)}`)"
    return command


def _from_results(doc: dict[str, Any], source: str) -> list[Run]:
    return [
        Run(
            family=family_of(doc["bench"]),
            source=source,
            label="",
            command=_command(doc),
            machine=doc["machine"],
            date=_date(doc["started_utc"], doc["finished_utc"]),
            load_before=doc["load_before"],
            load_after=doc["load_after"],
            tables=doc["tables"],
        )
    ]


def _from_recorded_gpu(doc: dict[str, Any], source: str) -> list[Run]:
    """A recorded GPU file: gpu.json reports under run keys, with the command and date beside them."""
    from bench.gpu import result_tables

    runs = []
    for key in sorted(k for k, v in doc.items() if isinstance(v, dict) and "versions" in v):
        report = doc[key]
        versions = report["versions"]
        first = (report.get("preflight") or {"runs": [{"report": {}}]})["runs"][0]["report"]
        machine = {
            "gpu": versions.get("device"),
            "driver": first.get("driver"),
            "cuda": versions.get("cuda"),
            "python": versions.get("python"),
            "torch": versions.get("torch"),
        }
        runs.append(
            Run(
                family="gpu",
                source=source,
                label=key,
                command=f"`{doc['command']}`",
                machine=machine,
                date=f"{doc['date_utc']}, time not recorded",
                load_before=None,
                load_after=None,
                tables=result_tables(report),
                note=doc.get("notes", {}).get(key, ""),
            )
        )
    return runs


def load_runs(results_dir: Path) -> list[Run]:
    """Every run in the results directory, in the order they are rendered."""
    runs: list[Run] = []
    for path in sorted(results_dir.glob("*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        source = str(path.relative_to(REPO)) if path.is_relative_to(REPO) else path.name
        if doc.get("schema") == _results.RESULTS_SCHEMA:
            runs += _from_results(doc, source)
        elif "command" in doc and "date_utc" in doc:
            runs += _from_recorded_gpu(doc, source)
        else:
            raise ValueError(
                f"{path}: neither a results file ({_results.RESULTS_SCHEMA}) nor a recorded "
                "gpu.json with `command` and `date_utc`; rerun its bench"
            )
    order = list(SECTIONS)
    return sorted(
        runs, key=lambda r: (order.index(r.family) if r.family in order else len(order), r.family, r.source, r.label)
    )


def _machine(m: dict[str, Any]) -> str:
    parts = []
    if m.get("cpu"):
        parts.append(f"{m['cpu']}, {m.get('cores')} cores, {cell(m.get('ram_gib'))} GiB RAM")
    if m.get("gpu"):
        extra = ", ".join(f"{name} {m[k]}" for k, name in (("driver", "driver"), ("cuda", "CUDA")) if m.get(k))
        parts.append(f"{m['gpu']}" + (f" ({extra})" if extra else ""))
    if not m.get("cpu"):
        parts.append("CPU not recorded")
    if m.get("os"):
        parts.append(m["os"])
    parts += [f"{name} {m[key]}" for key, name in (("python", "Python"), ("torch", "torch")) if m.get(key)]
    return "; ".join(parts)


def _load(run: Run) -> str:
    if run.load_before is None or run.load_after is None:
        return "not recorded"
    return (
        f"{', '.join(f'{x:.2f}' for x in run.load_before)} before; "
        f"{', '.join(f'{x:.2f}' for x in run.load_after)} after"
    )


def anchor(heading: str) -> str:
    """The fragment GitHub gives a heading."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def _heading(run: Run, table: dict[str, Any]) -> str:
    return table["measure"] + (f" ({run.label})" if run.label else "")


def _table(run: Run, table: dict[str, Any]) -> list[str]:
    out = [
        f"### {_heading(run, table)}",
        "",
        f"- Command: {run.command}",
        f"- Machine: {_machine(run.machine)}",
        f"- Load average (1, 5, 15 min): {_load(run)}",
        f"- Date: {run.date}; results: `{run.source}`" + (f", `{run.label}`" if run.label else ""),
        "",
    ]
    if run.note:
        out += [run.note, ""]
    out.append("| " + " | ".join(cell(c) for c in table["columns"]) + " |")
    out.append("|" + "---|" * len(table["columns"]))
    out += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table["rows"]]
    if table.get("note"):
        out += ["", cell(table["note"])]
    return [*out, ""]


INTRO = """\
# Benchmarks

What the benches in `bench/` measured, one table per measure, each with the command that produced
it, the machine it ran on, the load average before and after the run, and the date. This file is
written by `bench/report.py` from the results files in `bench/results/`: do not edit it by hand.

- **Regenerate** (CPU): `make bench` runs the CPU benches one after another (each writes its
  `bench/results/<name>.json`), then `python bench/report.py`. A bench run on its own rewrites only
  its own file; `python bench/report.py` then renders them all.
- **GPU**: `python bench/gpu.py --out DIR` on a CUDA machine writes `bench/results/gpu.json`;
  bring that file back and run `python bench/report.py`.
- `python bench/report.py --check` exits 1 when this file differs from what the results render; a
  unit test runs the same comparison. Tests assert behaviour, never timings: these numbers describe
  one machine at one time, and the load average beside each says how busy it was.
- The money-safety evidence (fault tests at full counts, the nemesis, mutation testing) is in
  [money-benchmarks.md](money-benchmarks.md), research runs in [research-benchmarks.md](research-benchmarks.md),
  both written the same way.
"""

MONEY_INTRO = """\
# Money-safety benchmarks

The fault tests at the issue's full counts, the nemesis and mutation testing of the money policy,
one table per measure with its command, machine, load and date. Written by `bench/report.py` from
`bench/results/` like [benchmarks.md](benchmarks.md): do not edit it by hand.
"""


RESEARCH_INTRO = """\
# Research benchmarks

Research runs (docs/research.md) through the real fleet, one table per measure with its command,
machine, load and date. Written by `bench/report.py` from `bench/results/` like
[benchmarks.md](benchmarks.md): do not edit it by hand.
"""


def render(runs: list[Run]) -> str:
    """docs/benchmarks.md for these runs (all but the money-safety and research families)."""
    return _render(INTRO, [r for r in runs if r.family not in (*MONEY_FAMILIES, *RESEARCH_FAMILIES)])


def render_research(runs: list[Run]) -> str:
    """docs/research-benchmarks.md: the research families only."""
    return _render(RESEARCH_INTRO, [r for r in runs if r.family in RESEARCH_FAMILIES])


def render_money(runs: list[Run]) -> str:
    """docs/money-benchmarks.md: the money-safety families only."""
    return _render(MONEY_INTRO, [r for r in runs if r.family in MONEY_FAMILIES])


def _render(intro: str, runs: list[Run]) -> str:
    links: dict[str, list[str]] = {}  # section title -> its measures, linked
    body: list[str] = []
    for run in runs:
        title, about = SECTIONS.get(run.family, (run.family, ""))
        if title not in links:
            links[title] = []
            body += [f"## {title}", "", *([about, ""] if about else [])]
        for table in run.tables:
            heading = _heading(run, table)
            links[title].append(f"[{heading}](#{anchor(heading)})")
            body += _table(run, table)
    contents = [f"- {title}: " + "; ".join(measures) for title, measures in links.items()]
    return "\n".join([*intro.splitlines(), "", "Measures:", "", *contents, "", *body]).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 if the document differs from the results")
    ap.add_argument("--results", type=Path, default=_results.RESULTS_DIR, help="the results directory")
    ap.add_argument("--out", type=Path, default=DOC, help="the document to write or check")
    ap.add_argument(
        "--money-out", type=Path, default=None, help=f"the money-safety page (default: {MONEY_DOC.name} beside --out)"
    )
    args = ap.parse_args(argv)
    runs = load_runs(args.results)
    money_out = args.money_out or args.out.with_name(MONEY_DOC.name)
    research_out = args.out.with_name(RESEARCH_DOC.name)
    docs = ((args.out, render(runs)), (money_out, render_money(runs)), (research_out, render_research(runs)))
    if args.check:
        stale = [out for out, text in docs if (out.read_text(encoding="utf-8") if out.is_file() else "") != text]
        for out in stale:
            print(f"{out} differs from what {args.results} renders: run `python bench/report.py`", file=sys.stderr)
        return 1 if stale else 0
    for out, text in docs:
        lines = text.count("\n")
        if lines > MAX_LINES:
            print(f"warning: {out} is {lines} lines (at most {MAX_LINES} wanted)", file=sys.stderr)
        out.write_text(text, encoding="utf-8")
        print(f"wrote {out} ({lines} lines)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
