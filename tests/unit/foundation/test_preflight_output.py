"""Whatever a host prints instead of the preflight's JSON line is a failed preflight, not a crashed task."""

from __future__ import annotations

import pytest

from app.bootstrap import preflight_result


@pytest.mark.parametrize(
    "stdout",
    ["", "Segmentation fault\n", '{"ok": true, "gpu_name": \n', "[1, 2, 3]\n", '{"ok": tru}\n', "{not json at all}\n"],
)
def test_a_broken_report_is_a_failed_preflight(stdout: str) -> None:
    """No report, a truncated line, a JSON list or garbage after a brace: `ssh_unreachable`, with the evidence."""
    r = preflight_result(stdout, "stderr tail", 1)
    assert r.report is None and r.unreachable == "ssh_unreachable" and r.detail


def test_the_last_object_line_is_the_report() -> None:
    """Log lines before it are ignored; the last JSON object is read."""
    r = preflight_result('{"log": 1}\nnoise\n{"ok": true, "cuda_initialised": true, "gpu_name": "H200"}\n', "", 0)
    assert r.report is not None and r.report.gpu_name == "H200"
