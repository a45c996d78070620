"""Workers on two machines: each its own TUNEHARNESS_HOME and HOME, sharing only Redis, PostgreSQL
and the artifact store. Real processes throughout: Redis, PostgreSQL, two Celery workers,
`tuneharness sim serve` with a real sshd per host, and the real trainer on the CPU.

Worker A provisions a job and supervises its training; A is killed and its machine's disk is
deleted; worker B, which never saw A's home, re-arms the job's monitor, supervises it, recovers it
onto a new host from the checkpoints in the shared store when its host vanishes, idle-watches and
reaps through the shared state, and the job finishes with every step trained."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.services import CeleryWorker, celery_client, wait_until
from tests.support.simserve import RTX3090_LISTED, rtx3090_hosts, sim_serve, write_trace

ROOT = Path(__file__).resolve().parents[3]
SCALE = 5.0  # simulated seconds per wall second
MAX_STEPS = 32
CHECKPOINT_EVERY = 8
SLICE_STEPS = 16
TRAIN_STEP_S = 10.0  # simulated seconds per step: 2 s of wall time each at SCALE

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

JOB = f"""\
name: two-homes
train:
  base_model: model
  task: causal_lm
  train_file: train.jsonl
  max_steps: {MAX_STEPS}
  checkpoint_every: {CHECKPOINT_EVERY}
  seed: 1
  learning_rate: 1.0e-2
  batch_size: 4
  max_seq_len: 64
  lora: {{r: 4, alpha: 8, dropout: 0.0, target_modules: [q_proj, v_proj]}}
  quantization: none
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
    return write_trace(
        path,
        name="two-homes",
        workload={"jobs": 1, "image_gb": 0.2, "model_gb": 0.1, "disk_gb": 20, "budget_usd": 5.0},
        hosts=rtx3090_hosts(4, offer=RTX3090_LISTED, price_digits=None),
    )


def _machine(tmp_path: Path, name: str, base: dict[str, str]) -> dict[str, str]:
    """A machine's environment: its own state directory and its own user home, nothing else of its own."""
    root = tmp_path / name
    (root / "user").mkdir(parents=True)
    return {**base, "TUNEHARNESS_HOME": str(root / "home"), "HOME": str(root / "user")}


@pytest.fixture
def sim_url(th_env: dict[str, str], tmp_path: Path) -> Iterator[str]:
    """The shared simulated marketplace, run from a directory of its own."""
    env = {**th_env, "TUNEHARNESS_HOME": str(tmp_path / "market")}  # its image cache stays under the user's HOME
    trace = _trace(tmp_path / "trace.json")
    # A paced trainer: the host is still training when the test destroys it, however loaded the machine.
    paced = ("--train-step-s", str(TRAIN_STEP_S))
    with sim_serve(env, tmp_path, trace=trace, scale=SCALE, extra_args=paced) as url:
        yield url


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app.cli.main", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.long
def test_a_job_outlives_its_worker_and_its_machines_disk(
    th_env: dict[str, str], pg_url: str, sim_url: str, tmp_path: Path
) -> None:
    """Kill worker A and delete its machine's disk mid-training: worker B, with a home of its own,
    supervises, recovers, idle-watches and reaps the job through Redis, PostgreSQL and the shared store."""
    from app.db import make_engine
    from app.hostkeys import HostKeyPinRow, JobKeyRow
    from app.jobs import JobStore
    from app.ledger import Ledger
    from providers.sim.client import SimClientMarket
    from trainer.tiny import write_tiny_causal_lm

    shared = tmp_path / "shared-artifacts"  # the network volume every machine mounts
    fleet = {
        **th_env,
        "TUNEHARNESS_DB_URL": pg_url,
        "TUNEHARNESS_ARTIFACTS": str(shared),
        "TUNEHARNESS_SIM_URL": sim_url,
        "TUNEHARNESS_MONITOR_S": "5",
        "TUNEHARNESS_REPOLL_S": "3",
        "TUNEHARNESS_SLICE_STEPS": str(SLICE_STEPS),
    }
    job_dir = tmp_path / "job"  # the job's model and data, where every worker reads them
    write_tiny_causal_lm(job_dir / "model")
    rows = [{"prompt": f"w{i} x{i % 7} ->", "completion": f" x{i % 7} w{i}"} for i in range(64)]
    (job_dir / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (job_dir / "job.yaml").write_text(JOB)

    machine_a = _machine(tmp_path, "machine-a", fleet)
    machine_b = _machine(tmp_path, "machine-b", fleet)
    operator = _machine(tmp_path, "operator", fleet)
    engine = make_engine(pg_url)
    ledger, jobs, market = Ledger(engine), JobStore(engine), SimClientMarket(sim_url)
    workers: list[CeleryWorker] = []
    try:
        a = CeleryWorker.start(machine_a, cwd=ROOT, concurrency=2, name="a", node="a@machine-a")
        workers.append(a)
        out = _cli(operator, "submit", str(job_dir / "job.yaml"))
        assert out.returncode == 0, out.stderr
        job_id = out.stdout.strip()

        def events(kind: str) -> list[Any]:
            return ledger.rows(job=job_id, kind=kind)

        # A trains the job on a host and has pulled a checkpoint into the shared store.
        assert wait_until(lambda: events("checkpoint_pulled"), timeout_s=180, interval_s=0.5), a.log.read_text()[-4000:]
        first_host = events("training_started")[-1].instance
        a.kill9()
        shutil.rmtree(tmp_path / "machine-a")  # A's machine, its disk and every file it wrote, is gone
        with engine.connect() as conn:  # what A recorded of the host is in the database
            pinned = {r.pin_id for r in conn.execute(HostKeyPinRow.__table__.select())}  # type: ignore[attr-defined]
        assert f"sim/{first_host}" in pinned

        # A worker pointed at an artifact store of its own machine is refused at start, in one line.
        local_store = {**_machine(tmp_path, "machine-c", fleet), "TUNEHARNESS_ARTIFACTS": str(tmp_path / "c-local")}
        refused = subprocess.run(
            [
                *(sys.executable, "-m", "celery", "-A", "workers.celery_app", "worker", "-Q", "maintenance"),
                *("--concurrency", "1", "-n", "c@machine-c", "--without-gossip", "--without-mingle"),
            ],
            cwd=ROOT,
            env=local_store,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert refused.returncode != 0
        refusal = [ln for ln in refused.stderr.splitlines() if ln.startswith("error: ")]
        assert len(refusal) == 1 and str(shared) in refusal[0] and "TUNEHARNESS_ARTIFACTS" in refusal[0], refused.stderr
        assert not (tmp_path / "c-local").exists()

        b = CeleryWorker.start(machine_b, cwd=ROOT, concurrency=2, name="b", node="b@machine-b")
        workers.append(b)
        client = celery_client(fleet)

        def log_b() -> str:
            return b.log.read_text(errors="replace")[-4000:]

        # Beat's backstop, run on B: the chain that died with A is re-armed once it is overdue.
        def rearmed() -> bool:
            got = client.send_task("tuneharness.maintenance.rearm_monitors", queue="maintenance").get(timeout=60)
            return job_id in got

        assert wait_until(rearmed, timeout_s=120, interval_s=2.0), log_b()
        # B supervises the host A rented: it pulls a newer checkpoint off it with the job's key from the
        # database (a key of B's own would be refused there, and the job would move to another host).
        pulled_by_a = max(int(e.payload["step"]) for e in events("checkpoint_pulled"))
        assert wait_until(
            lambda: any(
                e.instance == first_host and int(e.payload["step"]) > pulled_by_a for e in events("checkpoint_pulled")
            ),
            timeout_s=180,
            interval_s=0.5,
        ), log_b()
        assert not events("host_lost") and not events("recovery"), log_b()

        sweeps = {
            name: client.send_task(f"tuneharness.maintenance.{name}", queue="maintenance").get(timeout=120)
            for name in ("idle_watchdog", "reaper")
        }
        for name, report in sweeps.items():
            assert report["examined"] >= 1 and report["errors"] == [], (name, report)

        # The host vanishes: B recovers the job onto a new host from the checkpoints in the shared store.
        market.destroy(first_host)

        def finished() -> bool:
            rec = jobs.get(job_id)
            return rec is not None and rec.phase in ("done", "failed", "blocked")

        assert wait_until(finished, timeout_s=300, interval_s=0.5), log_b()
        record = jobs.get(job_id)
        assert record is not None and record.phase == "done", (record, log_b())
        recoveries = events("recovery")
        assert len(recoveries) == 1 and int(recoveries[0].payload["resume_step"]) >= CHECKPOINT_EVERY
        assert [e.instance for e in events("host_lost")] == [first_host]
        hosts = list(dict.fromkeys(e.instance for e in events("training_started")))
        assert hosts[0] == first_host and len(hosts) == 2
        meta = json.loads((shared / "jobs" / job_id / "adapter" / "trainer_meta.json").read_text())
        assert meta["steps"] == MAX_STEPS

        # What both workers needed was in the database; nothing of it was written on B's disk.
        with engine.connect() as conn:
            keys = conn.execute(JobKeyRow.__table__.select()).all()  # type: ignore[attr-defined]
            pins = {r.pin_id for r in conn.execute(HostKeyPinRow.__table__.select())}  # type: ignore[attr-defined]
        assert [k.job_id for k in keys] == [job_id]
        assert {f"sim/{h}" for h in hosts} <= pins
        assert not (Path(machine_b["TUNEHARNESS_HOME"]) / "keys").exists()
        assert not (tmp_path / "machine-a").exists()
        assert not [p for p in Path(machine_b["TUNEHARNESS_HOME"]).rglob("*") if "id_ed25519" in p.name]
        assert not (Path(machine_b["TUNEHARNESS_HOME"]) / "artifacts").exists()
    finally:
        for w in workers:
            w.stop()
        engine.dispose()
