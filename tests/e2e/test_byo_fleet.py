"""End to end, real processes: Redis, a Celery worker, `tuneharness sim serve` with a real sshd per
host, and the user's own training as a `kind: command` job: a plain `transformers.Trainer` script
and a TRL SFT script on a tiny random model (CPU). The job runs in slices, its host is destroyed
mid-run, the job resumes on another host from the newest pulled checkpoint and finishes; its final
adapter equals an uninterrupted run's."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.support.byo import job_json, max_abs_diff, write_project
from tests.support.services import CeleryWorker, wait_until
from tests.support.simserve import RTX3090_LISTED, rtx3090_hosts, sim_serve, write_trace

ROOT = Path(__file__).resolve().parents[2]
SCALE = 5.0
MAX_STEPS = 24
SAVE_STEPS = 4
SLICE_STEPS = 10

JOB = f"""\
name: byo-survives-a-loss
train:
  kind: command
  script: sft.py
  args: [--model, base_model, --data, train.jsonl, --max-steps, "{MAX_STEPS}", --save-steps, "{SAVE_STEPS}",
         --seed, "{{seed}}"]
  base_model: base_model
  train_file: train.jsonl
  max_steps: {MAX_STEPS}
  seed: 1
  grace_s: 30
needs:
  gpu: [RTX 3090]
  providers: [sim]
  disk_gb: 20
  download_gb: 0.3
  train_hours: 0.05
budget_usd: 5.0
"""


def _trace(path: Path) -> Path:
    """Four healthy RTX 3090 hosts (two are needed)."""
    workload = {"jobs": 1, "image_gb": 0.2, "model_gb": 0.1, "train_seconds": 120, "checkpoint_every_s": 60}
    return write_trace(
        path,
        name="byo",
        description="healthy hosts for a recovery",
        workload={**workload, "disk_gb": 20, "budget_usd": 5.0},
        hosts=rtx3090_hosts(4, offer=RTX3090_LISTED, price_digits=None),
    )


@pytest.mark.slow
@pytest.mark.parametrize("script", ["trainer", pytest.param("trl", marks=pytest.mark.long)])
def test_a_trainer_based_command_job_survives_its_host_vanishing_and_ends_as_an_uninterrupted_run(
    script: str, th_env: dict[str, str], tmp_path: Path
) -> None:
    """Destroy the training host after a slice boundary and a pulled checkpoint: the job resumes on
    another machine, finishes with max_steps steps, and its adapter equals an uninterrupted run's."""
    if script == "trl" and importlib.util.find_spec("trl") is None:
        pytest.skip("trl is not installed (pip install -e '.[dev]')")
    from sqlalchemy import select

    from app.db import make_engine
    from app.jobs import JobRow
    from app.ledger import Ledger
    from providers.sim.client import SimClientMarket

    project = write_project(tmp_path / "project", script=script)
    (project / "job.yaml").write_text(JOB)
    env0 = {**th_env, "HF_DATASETS_CACHE": str(tmp_path / "datasets")}

    # The reference: the job.json a host gets, run locally without interruption.
    ref = tmp_path / "ref"
    ref.mkdir()
    for name in ("base_model", "train.jsonl", "sft.py"):
        (ref / name).symlink_to(project / name)
    (ref / "job.json").write_text(json.dumps(job_json(max_steps=MAX_STEPS, save_steps=SAVE_STEPS, seed=1)))
    reference = subprocess.Popen(
        [sys.executable, "-m", "trainer", "run", "--job-dir", str(ref)],
        cwd=ROOT,
        env=env0,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    with ExitStack() as stack:
        stack.callback(reference.kill)  # a no-op once it has exited
        url = stack.enter_context(sim_serve(env0, tmp_path, trace=_trace(tmp_path / "trace.json"), scale=SCALE))
        env = {
            **env0,
            "TUNEHARNESS_SIM_URL": url,
            "TUNEHARNESS_MONITOR_S": "5",
            "TUNEHARNESS_REPOLL_S": "3",
            "TUNEHARNESS_SLICE_STEPS": str(SLICE_STEPS),
        }
        worker = CeleryWorker.start(env, cwd=ROOT, concurrency=2, name="supervisor")
        stack.callback(worker.stop)
        out = subprocess.run(
            [sys.executable, "-m", "app.cli.main", "submit", str(project / "job.yaml")],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert out.returncode == 0, out.stderr
        job_id = out.stdout.strip()
        engine = make_engine(f"sqlite:///{Path(th_env['TUNEHARNESS_HOME']) / 'tuneharness.db'}")
        ledger = Ledger(engine)

        def events(kind: str) -> list[Any]:
            return ledger.rows(job=job_id, kind=kind)

        def log_tail() -> str:
            return worker.log.read_text(errors="replace")[-4000:]

        def ready_to_kill() -> bool:
            """The first host is in its second slice and a checkpoint past the first slice is pulled."""
            starts = events("training_started")
            pulled = [int(e.payload["step"]) for e in events("checkpoint_pulled")]
            return len(starts) >= 2 and any(p > SLICE_STEPS for p in pulled)

        assert wait_until(ready_to_kill, timeout_s=400, interval_s=0.5), log_tail()
        instance = events("training_started")[-1].instance
        SimClientMarket(url).destroy(instance)

        def done() -> bool:
            with engine.connect() as conn:
                t = JobRow.__table__  # type: ignore[attr-defined]
                phase = conn.execute(select(t.c.phase).where(t.c.job_id == job_id)).scalar_one()
            return phase in ("evaluating", "done", "failed")

        assert wait_until(done, timeout_s=500, interval_s=0.5), log_tail()
        assert events("adapter_pulled"), log_tail()
        recs = events("recovery")
        assert [e.instance for e in events("host_lost")] == [instance]
        assert len(recs) == 1 and int(recs[0].payload["resume_step"]) > SLICE_STEPS
        machines = {e.machine for e in events("training_started")}
        assert len(machines) == 2, machines

        adapter = Path(th_env["TUNEHARNESS_HOME"]) / "artifacts" / "jobs" / job_id / "adapter"
        meta = json.loads((adapter / "trainer_meta.json").read_text())
        assert meta["steps"] == MAX_STEPS
        assert reference.wait(timeout=300) == 0
        diff = max_abs_diff(adapter, ref / "adapter")
        assert diff == 0.0, diff
        print(f"{script}: resumed at step {recs[0].payload['resume_step']}, adapter max abs diff {diff:.2e}")
