"""docs/money-benchmarks.md: the money-safety families render there, never in docs/benchmarks.md."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench import _results, report

REPO = Path(__file__).resolve().parents[3]


def _doc(bench: str, measure: str) -> dict[str, Any]:
    return {
        "schema": _results.RESULTS_SCHEMA,
        "bench": bench,
        "command": f".venv/bin/python bench/{bench}.py",
        "cpu_affinity": [0, 1],
        "started_utc": "2026-12-05T21:00:00Z",
        "finished_utc": "2026-12-05T21:10:00Z",
        "machine": {"cpu": "AMD EPYC", "cores": 2, "ram_gib": 23.5, "os": "Debian", "python": "3.11.7"},
        "load_before": [1.0, 1.0, 1.0],
        "load_after": [1.5, 1.2, 1.1],
        "tables": [{"measure": measure, "columns": ["scenario", "result"], "rows": [["x", "passed"]], "note": ""}],
    }


def test_faults_nemesis_and_mutation_go_to_the_money_page_and_the_rest_stays(tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    for bench, measure in (("faults", "Fault scenarios"), ("nemesis", "Nemesis run"), ("trainer", "Slices")):
        (results / f"{bench}.json").write_text(json.dumps(_doc(bench, measure)), encoding="utf-8")
    runs = report.load_runs(results)
    main, money = report.render(runs), report.render_money(runs)
    assert "### Slices" in main and "### Fault scenarios" not in main and "### Nemesis run" not in main
    assert "### Fault scenarios" in money and "### Nemesis run" in money and "### Slices" not in money
    assert "## Fault tests at full counts" in money and "(money-benchmarks.md)" in main


def test_check_covers_both_pages_and_writes_the_money_page_beside_out(tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    (results / "faults.json").write_text(json.dumps(_doc("faults", "Fault scenarios")), encoding="utf-8")
    doc = tmp_path / "benchmarks.md"
    args = ["--results", str(results), "--out", str(doc)]
    assert report.main(args) == 0
    money = tmp_path / "money-benchmarks.md"
    assert "### Fault scenarios" in money.read_text(encoding="utf-8")
    assert report.main([*args, "--check"]) == 0
    money.write_text("# stale\n", encoding="utf-8")
    assert report.main([*args, "--check"]) == 1


def test_docs_money_benchmarks_is_what_the_committed_results_render() -> None:
    expected = report.render_money(report.load_runs(REPO / "bench" / "results"))
    assert (REPO / "docs" / "money-benchmarks.md").read_text(encoding="utf-8") == expected, (
        "docs/money-benchmarks.md is stale: run `python bench/report.py`"
    )
