"""The fleet a research run needs on the simulated marketplace, shared by the research smoke test and
`bench/research.py`: a tiny model and its data, a base job file, a trace of RTX 3090 hosts with one
liar, `tuneharness sim serve`, a Celery worker on every queue, and the CLI to start and read a run."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support import simserve
from tests.support.services import CeleryWorker, wait_until

ROOT = Path(__file__).resolve().parents[2]
SCALE = 5.0  # simulated seconds per wall second

BASE_JOB = """\
name: research-base
train:
  base_model: model
  task: causal_lm
  train_file: train.jsonl
  max_steps: 100000
  checkpoint_every: 100
  seed: 1
  learning_rate: 1.0e-3
  lr_schedule: constant
  warmup_steps: 0
  batch_size: 8
  max_seq_len: 48
  lora: {r: 4, alpha: 8, target_modules: [q_proj, v_proj]}
  quantization: none
needs:
  gpu: [RTX 3090]
  providers: [sim]
  disk_gb: 20
  download_gb: 0.3
  train_hours: 0.05
"""


def research_text(*, name: str, iterations: int, mutations: int, axes: str, budget_usd: float) -> str:
    """A research file over BASE_JOB: a 20-second time box on the RTX 3090 tier, a two-seed baseline."""
    return f"""\
name: {name}
job: job.yaml
axes:
{axes}time_box_s: 20
val_fraction: 0.25
tier: RTX 3090
iterations: {iterations}
mutations: {mutations}
parallelism: 2
baseline_seeds: [1, 2]
seeds: [1]
noise_sigmas: 2
budget_usd: {budget_usd}
job_budget_usd: 0.5
"""


def write_trace(path: Path, *, healthy: int = 5) -> Path:
    """`healthy` RTX 3090 offers and, cheapest of all, one liar whose card is really an RTX 3060."""
    liar = {
        "machine_id": "m-liar",
        "offer": {**simserve.RTX3090_LISTED, "dph": 0.08},
        "truth": {"status_every_s": 10, "actual_gpu_name": "RTX 3060", "actual_gpu_ram_gb": 12},
    }
    return simserve.write_trace(
        path,
        name="research",
        description="healthy RTX 3090 hosts and one liar",
        workload={"jobs": 1, "image_gb": 0.2, "model_gb": 0.1, "train_seconds": 60, "disk_gb": 20},
        hosts=[liar, *simserve.rtx3090_hosts(healthy, offer=simserve.RTX3090_LISTED)],
    )


def write_inputs(directory: Path, research: str) -> Path:
    """The tiny model, 96 learnable rows, the base job file and the research file; the research file's path."""
    from trainer.testing import causal_rows, write_jsonl
    from trainer.tiny import write_tiny_causal_lm

    write_tiny_causal_lm(directory / "model")
    write_jsonl(directory / "train.jsonl", causal_rows(96, seed=1))
    (directory / "job.yaml").write_text(BASE_JOB)
    (directory / "research.yaml").write_text(research)
    return directory / "research.yaml"


@dataclass
class ResearchFleet:
    env: dict[str, str]
    worker: CeleryWorker
    home: Path

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "app.cli.main", *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def log_tail(self) -> str:
        return self.worker.log.read_text(errors="replace")[-6000:]

    def run_dir(self, run_id: str) -> Path:
        return self.home / "research" / run_id

    def state(self, run_id: str) -> dict[str, Any] | None:
        """The run's policy state, read from the fleet's database (None before its first tick)."""
        from app.db import make_engine
        from app.research import research_root
        from app.researchstore import ResearchRunStore

        engine = make_engine(self.env.get("TUNEHARNESS_DB_URL") or f"sqlite:///{self.home / 'tuneharness.db'}")
        try:
            return ResearchRunStore(engine, research_root(self.home), run_id).state()
        finally:
            engine.dispose()

    def wait_finished(self, run_id: str, *, timeout_s: float) -> bool:
        return wait_until(
            lambda: (self.state(run_id) or {}).get("phase") == "finished", timeout_s=timeout_s, interval_s=1.0
        )

    def experiments(self, run_id: str) -> list[dict[str, Any]]:
        text = (self.run_dir(run_id) / "experiments.jsonl").read_text()
        return [json.loads(line) for line in text.splitlines()]


@contextmanager
def research_fleet(th_env: dict[str, str], work: Path, *, healthy: int = 5) -> Iterator[ResearchFleet]:
    """`sim serve` on `write_trace`, a worker on every queue with short monitor and tick periods;
    both stopped on the way out."""
    trace = write_trace(work / "trace.json", healthy=healthy)
    with simserve.sim_serve(th_env, work, trace=trace, scale=SCALE) as url:
        fleet = None
        try:
            env = {
                **th_env,
                "TUNEHARNESS_SIM_URL": url,
                "TUNEHARNESS_MONITOR_S": "5",
                "TUNEHARNESS_REPOLL_S": "3",
                "TUNEHARNESS_RESEARCH_TICK_S": "2",
            }
            worker = CeleryWorker.start(env, cwd=ROOT, concurrency=3, name="research")
            fleet = ResearchFleet(env=env, worker=worker, home=Path(th_env["TUNEHARNESS_HOME"]))
            yield fleet
        finally:
            if fleet is not None:
                fleet.worker.stop()  # the one running now (a test may have replaced it)
