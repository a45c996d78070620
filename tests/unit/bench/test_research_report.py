"""docs/research-benchmarks.md: the research family renders there, never in docs/benchmarks.md."""

from __future__ import annotations

import json
from pathlib import Path

from bench import report
from tests.unit.bench.test_money_report import _doc

REPO = Path(__file__).resolve().parents[3]


def test_research_goes_to_its_own_page_and_the_rest_stays(tmp_path: Path) -> None:
    """A research results file renders on the research page only; `--check` covers that page too."""
    results = tmp_path / "results"
    results.mkdir()
    for bench, measure in (("research", "Research run"), ("trainer", "Slices")):
        (results / f"{bench}.json").write_text(json.dumps(_doc(bench, measure)), encoding="utf-8")
    runs = report.load_runs(results)
    main, research = report.render(runs), report.render_research(runs)
    assert "### Slices" in main and "### Research run" not in main and "(research-benchmarks.md)" in main
    assert "### Research run" in research and "## Autoresearch" in research and "### Slices" not in research
    args = ["--results", str(results), "--out", str(tmp_path / "benchmarks.md")]
    assert report.main(args) == 0 and report.main([*args, "--check"]) == 0
    (tmp_path / "research-benchmarks.md").write_text("# stale\n", encoding="utf-8")
    assert report.main([*args, "--check"]) == 1


def test_docs_research_benchmarks_is_what_the_committed_results_render() -> None:
    """The committed page equals the rendering of bench/results/*.json."""
    expected = report.render_research(report.load_runs(REPO / "bench" / "results"))
    assert (REPO / "docs" / "research-benchmarks.md").read_text(encoding="utf-8") == expected, (
        "docs/research-benchmarks.md is stale: run `python bench/report.py`"
    )
