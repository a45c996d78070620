"""`pip wheel .` ships what triage runs (the rules, the promoted adapter and its decision) and none of
the labelled data (real excerpts, corpus, hand-written excerpts, gate trial); installed without the
repository, a command that needs that data says so in one line and exits 2.

The wheel is built from a copy of the project (package folders, data/ included, and the top-level
files), so the shared checkout gets no build/ or egg-info, and data/ lying beside the packages is
shown not to leak in."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
PACKAGES = ("app", "workers", "providers", "trainer", "gate", "data")
ADAPTER = ("adapter_config.json", "adapter_model.safetensors", "labels.json", "trainer_meta.json")
LABELLED_DATA = re.compile(
    r"(^|/)(data/triage/|corpus/|log_doctor_trial/|trial/)|(^|/)(dev|test)\d*\.jsonl$"
    r"|(^|/)(handwritten\.txt|COLLECTING\.md)$"
)

pytestmark = pytest.mark.slow


def _copy_project(dest: Path) -> Path:
    dest.mkdir()
    for entry in REPO.iterdir():
        if entry.is_file():
            shutil.copy2(entry, dest / entry.name)
    for name in PACKAGES:
        shutil.copytree(REPO / name, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("wheel")
    src = _copy_project(root / "src")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            ".",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(root / "dist"),
            "-q",
        ],
        cwd=src,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    [built] = (root / "dist").glob("tuneharness-*.whl")
    return built


def test_the_wheel_ships_the_rules_and_the_promoted_adapter_but_no_labelled_data(wheel: Path) -> None:
    """No real excerpt, corpus, trial or hand-written file is in the wheel; the rules, the adapter and
    its decision are."""
    names = zipfile.ZipFile(wheel).namelist()
    assert [n for n in names if LABELLED_DATA.search(n)] == []
    assert "app/triage/rules.py" in names
    assert {f"app/triage/log_doctor/adapter/{f}" for f in ADAPTER} <= set(names)
    assert {"app/triage/log_doctor/decision.json", "app/triage/log_doctor/metrics.json"} <= set(names)


def test_installed_without_the_repository_the_specialist_runs_and_data_commands_say_what_is_missing(
    wheel: Path, tmp_path: Path
) -> None:
    """Installed alone, the package finds its promoted specialist; the report and train-specialist
    exit 2 with one line."""
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    env = {**os.environ, "PYTHONPATH": str(target), "TUNEHARNESS_HOME": str(tmp_path / "home")}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False
        )

    where = run("-c", "import app.triage.specialist as s; print(s.__file__); print(s.promoted())")
    assert where.returncode == 0, where.stderr
    assert where.stdout.splitlines() == [str(target / "app" / "triage" / "specialist.py"), "True"]
    for args in (
        ("-m", "app.triage.report", "--check"),
        ("-m", "app.cli.main", "triage", "train-specialist", "--out", str(tmp_path / "out")),
    ):
        proc = run(*args)
        assert proc.returncode == 2, (args, proc.stderr[-2000:])
        assert proc.stderr.count("\n") == 1 and "triage data missing" in proc.stderr and "Fix: " in proc.stderr, args
        assert str(target / "data" / "triage") in proc.stderr
