"""trainer/Dockerfile builds where a Docker daemon answers, and the image holds the whole stack."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
TAG = "tuneharness-trainer:test"


def docker_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=30, check=False).returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not docker_answers(), reason="no Docker daemon: the trainer image is built where one answers")
def test_the_trainer_image_builds_and_its_bootstrap_finds_nothing_missing() -> None:
    """`docker build -f trainer/Dockerfile .` succeeds; in the image, the bootstrap installs nothing."""
    build = subprocess.run(
        ["docker", "build", "-f", "trainer/Dockerfile", "-t", TAG, "."],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    run = subprocess.run(
        ["docker", "run", "--rm", TAG, "python", "-m", "trainer", "bootstrap"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert (report["ok"], report["installed"], report["path"]) == (True, [], None)
