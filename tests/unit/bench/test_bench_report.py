"""docs/benchmarks.md: rendered by bench/report.py from the results files the benches write.

Behaviour only: no bench runs here and no timing is asserted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench import _results, report

REPO = Path(__file__).resolve().parents[3]

FOUNDATION: dict[str, Any] = {
    "schema": _results.RESULTS_SCHEMA,
    "bench": "foundation",
    "command": ".venv/bin/python bench/foundation.py -n 10",
    "cpu_affinity": [0],
    "started_utc": "2026-12-04T23:20:05Z",
    "finished_utc": "2026-12-04T23:21:40Z",
    "machine": {
        "cpu": "AMD EPYC",
        "cores": 2,
        "ram_gib": 23.5,
        "os": "Debian GNU/Linux 12 (bookworm)",
        "python": "3.11.7",
        "torch": "2.13.0+cpu",
    },
    "load_before": [0.5, 0.4, 0.3],
    "load_after": [0.61, 0.45, 0.312],
    "tables": [
        {
            "measure": "Ledger and budget throughput",
            "columns": ["operation", "unit", "SQLite"],
            "rows": [
                ["ledger append", "events/s", 1575.4],
                ["ledger verify", "rows/s", 87763],
                ["checkpoint save s", "s", 0.0096],
            ],
            "note": "10 appends.",
        }
    ],
    "raw": None,
}

EXPECTED_TABLE = """\
### Ledger and budget throughput

- Command: `.venv/bin/python bench/foundation.py -n 10`, pinned to CPU 0 (`taskset -c 0`)
- Machine: AMD EPYC, 2 cores, 23.5 GiB RAM; Debian GNU/Linux 12 (bookworm); Python 3.11.7; torch 2.13.0+cpu
- Load average (1, 5, 15 min): 0.50, 0.40, 0.30 before; 0.61, 0.45, 0.31 after
- Date: 2026-12-04, 23:20-23:21 UTC; results: `foundation.json`

| operation | unit | SQLite |
|---|---|---|
| ledger append | events/s | 1,575 |
| ledger verify | rows/s | 87,763 |
| checkpoint save s | s | 0.0096 |

10 appends.
"""


def _write(directory: Path, name: str, doc: dict[str, Any]) -> None:
    (directory / f"{name}.json").write_text(json.dumps(doc), encoding="utf-8")


def test_a_results_file_renders_as_a_table_headed_by_its_command_machine_load_and_date(tmp_path: Path) -> None:
    """A results file becomes a section with one table per measure, its provenance above it."""
    _write(tmp_path, "foundation", FOUNDATION)
    text = report.render(report.load_runs(tmp_path))
    assert EXPECTED_TABLE in text
    assert "## Ledger, budget and task queue" in text
    assert "[Ledger and budget throughput](#ledger-and-budget-throughput)" in text


def test_rendering_is_independent_of_the_order_the_files_were_written(tmp_path: Path) -> None:
    """Sections come in a fixed order (foundation before triage), whatever the files' order on disk."""
    triage = dict(
        FOUNDATION,
        bench="triage_chain",
        tables=[
            {
                "measure": "Triage chain time per tail",
                "columns": ["measure", "value"],
                "rows": [["ms per tail", 5.2]],
                "note": "",
            }
        ],
    )
    _write(tmp_path, "triage_chain", triage)
    _write(tmp_path, "foundation", FOUNDATION)
    text = report.render(report.load_runs(tmp_path))
    assert text.index("## Ledger, budget and task queue") < text.index("## Triage speed")
    assert text == report.render(report.load_runs(tmp_path))


def test_numbers_are_formatted_one_way() -> None:
    """Thousands get separators; smaller floats four significant digits; missing values a dash."""
    cells = [report.cell(v) for v in (12955, 14675.8, 31.17, 1.155, 458.0, 0.0001614, 0.0, None, True, [3, 3, 0])]
    assert cells == ["12,955", "14,676", "31.17", "1.155", "458", "0.0001614", "0", "-", "yes", "3, 3, 0"]


def test_a_written_results_file_reads_back_and_renders(tmp_path: Path) -> None:
    """What `_results.write` records (this machine, its load, the date) is what the report reads."""
    table = _results.table("Celery round trip", ["what", "tasks/s"], [["ping", 581.2]])
    started = _results.Started(
        command=".venv/bin/python bench/foundation.py", started_utc="2026-12-04T23:20:05Z", load_before=(0.5, 0.4, 0.3)
    )
    path = _results.write("foundation", [table], started=started, raw={"n": 1}, results_dir=tmp_path)
    assert json.loads(path.read_text())["raw"] == {"n": 1}
    text = report.render(report.load_runs(tmp_path))
    assert "| ping | 581.2 |" in text and "0.50, 0.40, 0.30 before" in text


def test_check_fails_when_the_document_differs_from_the_results(tmp_path: Path) -> None:
    """`report.py --check` exits 1 on a stale document and 0 once it is rewritten."""
    results = tmp_path / "results"
    results.mkdir()
    _write(results, "foundation", FOUNDATION)
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# stale\n")
    args = ["--results", str(results), "--out", str(doc)]
    assert report.main([*args, "--check"]) == 1
    assert report.main(args) == 0
    assert report.main([*args, "--check"]) == 0


def test_the_recorded_gpu_file_renders_with_its_own_command_machine_and_date() -> None:
    """The recorded H200 file renders both runs with the command and date it records, load not recorded."""
    runs = [r for r in report.load_runs(REPO / "bench" / "results") if r.family == "gpu" and r.label]
    assert [r.label for r in runs] == ["run1", "run2"]
    text = report.render(runs)
    assert "python bench/gpu.py --out DIR --offer-gpu H200 --offer-vram-gb 141" in text
    assert "NVIDIA H200 (driver 580.159.04, CUDA 13.0)" in text and "2026-12-04" in text
    assert "Load average (1, 5, 15 min): not recorded" in text
    assert "| 4,096 | 0 | 3.82 | 683.7 | pass: NVIDIA H200: 683.7 bf16 TFLOP/s (96% of expected) |" in text


def test_docs_benchmarks_is_what_the_committed_results_render() -> None:
    """docs/benchmarks.md equals the rendering of bench/results/*.json, so it cannot drift from them."""
    expected = report.render(report.load_runs(REPO / "bench" / "results"))
    assert (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8") == expected, (
        "docs/benchmarks.md is stale: run `python bench/report.py`"
    )
    assert expected.count("\n") <= report.MAX_LINES
