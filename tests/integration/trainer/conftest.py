"""Fixtures for the trainer's integration tests: a tiny real model and the trainer as a program."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen2 causal LM with a byte-level tokenizer, written once per session."""
    from trainer.tiny import write_tiny_causal_lm

    return write_tiny_causal_lm(tmp_path_factory.mktemp("tiny-model"))


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNEHARNESS_")}
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(REPO)}, **extra)
    return env


@pytest.fixture
def trainer_env() -> Callable[..., dict[str, str]]:
    """Build the environment of a trainer process (no TUNEHARNESS_* leaking in), plus extras."""
    return _env


@pytest.fixture
def run_trainer() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run `python -m trainer ARGS` as a separate process and return its result."""

    def _run(*args: str, env: dict[str, str] | None = None, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "trainer", *args],
            cwd=REPO,
            env=env or _env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    return _run
