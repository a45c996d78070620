"""docs/triage.md's generated accuracy block is what `python -m app.triage.report` measures now
(slow: the chain loads the shipped specialist once for every labelled row)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from app.triage.specialist import minilm_base_dir, promoted

REPO = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.slow


def test_the_docs_accuracy_block_is_current() -> None:
    """`python -m app.triage.report --check` exits 0: no rule, data or adapter change left the block stale."""
    if minilm_base_dir() is None or not promoted():
        pytest.skip("needs the MiniLM package and the promoted shipped specialist")
    proc = subprocess.run(
        [sys.executable, "-m", "app.triage.report", "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, (
        "docs/triage.md's block is stale: run `python -m app.triage.report`",
        proc.stderr[-1000:],
    )
