"""End to end, real processes: Redis, a Celery worker, `tuneharness sim serve` (scaled time) with a
real sshd per host, and the real trainer on the CPU. The job's host is destroyed twice during
training; the job completes on a third host and its adapter equals an uninterrupted run's."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.support.services import CeleryWorker, wait_until
from tests.support.simserve import RTX3090_LISTED, rtx3090_hosts, sim_serve, write_trace

ROOT = Path(__file__).resolve().parents[2]
SCALE = 5.0  # simulated seconds per wall second (a preflight gets 36 wall seconds on a busy machine)
MAX_STEPS = 40
CHECKPOINT_EVERY = 8
SLICE_STEPS = 12  # slices end (exit 3) and restart on the same host along the way

JOB = f"""\
name: survives-two-losses
train:
  base_model: model
  task: causal_lm
  train_file: train.jsonl
  max_steps: {MAX_STEPS}
  checkpoint_every: {CHECKPOINT_EVERY}
  seed: 1
  learning_rate: 1.0e-2
  lr_schedule: cosine
  warmup_steps: 2
  batch_size: 4
  grad_accum: 2
  max_seq_len: 64
  lora: {{r: 4, alpha: 8, dropout: 0.1, target_modules: [q_proj, v_proj]}}
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
    """Five healthy RTX 3090 hosts (three are needed) with a 3-second (simulated) pull."""
    return write_trace(
        path,
        name="vanish",
        description="healthy hosts for recovery",
        workload={
            "jobs": 1,
            "image_gb": 0.2,
            "model_gb": 0.1,
            "train_seconds": 120,
            "checkpoint_every_s": 60,
            "disk_gb": 20,
            "budget_usd": 5.0,
        },
        hosts=rtx3090_hosts(5, offer=RTX3090_LISTED, price_digits=None),
    )


def _last_step(train_log: Path) -> int:
    """The last step the trainer logged on a host."""
    step = 0
    for line in train_log.read_text(errors="replace").splitlines():
        if line[24:30] == " step ":
            step = int(line.split(" step=")[1].split()[0])
    return step


@pytest.mark.slow
@pytest.mark.long
def test_a_job_survives_its_host_vanishing_twice_and_ends_bit_identical(th_env: dict[str, str], tmp_path: Path) -> None:
    """Destroy the training host twice: the job finishes with max_steps steps (over several slices),
    loses at most one checkpoint interval per loss, and its adapter equals an uninterrupted run's (<= 1e-6)."""
    from safetensors.torch import load_file
    from sqlalchemy import select

    from app.alerts import AlertOutboxRow
    from app.db import make_engine
    from app.ledger import Ledger
    from app.services.supervisor import bundle_for_spec
    from providers.sim.client import SimClientMarket
    from trainer.tiny import write_tiny_causal_lm

    started = time.monotonic()
    write_tiny_causal_lm(tmp_path / "model")
    rows = [{"prompt": f"w{i} x{i % 7} ->", "completion": f" x{i % 7} w{i}"} for i in range(64)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "job.yaml").write_text(JOB)

    # The reference: the same job.json the hosts get, trained locally without interruption.
    from app.jobs import load_job_file

    spec = load_job_file(tmp_path / "job.yaml")
    bundle = bundle_for_spec(spec.train, base_dir=spec.base_dir)
    ref = tmp_path / "ref"
    (ref / "data").mkdir(parents=True)
    (ref / "base_model").symlink_to(tmp_path / "model")
    (ref / "data" / "train.jsonl").write_text((tmp_path / "train.jsonl").read_text())
    (ref / "job.json").write_text(json.dumps(dict(bundle.job_json)))
    reference = subprocess.Popen(
        [sys.executable, "-m", "trainer", "run", "--job-dir", str(ref)],
        cwd=ROOT,
        env={**th_env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    sim_root = tmp_path / "sim"  # where sim_serve keeps the hosts
    with ExitStack() as stack:
        stack.callback(reference.kill)  # a no-op once it has exited
        url = stack.enter_context(sim_serve(th_env, tmp_path, trace=_trace(tmp_path / "trace.json"), scale=SCALE))
        env = {
            **th_env,
            "TUNEHARNESS_SIM_URL": url,
            "TUNEHARNESS_MONITOR_S": "5",
            "TUNEHARNESS_REPOLL_S": "3",
            "TUNEHARNESS_SLICE_STEPS": str(SLICE_STEPS),
        }
        worker = CeleryWorker.start(env, cwd=ROOT, concurrency=2, name="supervisor")
        stack.callback(worker.stop)
        out = subprocess.run(
            [sys.executable, "-m", "app.cli.main", "submit", str(tmp_path / "job.yaml")],
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
        market = SimClientMarket(url)

        def events(kind: str) -> list[Any]:
            return ledger.rows(job=job_id, kind=kind)

        def log_tail() -> str:
            return worker.log.read_text(errors="replace")[-4000:]

        sim_clock = market.clock()
        destroyed_at: dict[str, float] = {}
        killed: list[tuple[str, int]] = []  # (instance, step the host had reached when destroyed)
        for loss in range(2):
            # Wait until the current host trains and a checkpoint newer than its resume point is pulled
            # (on the first host: in its second slice, so a slice boundary has been crossed there).
            def ready_to_kill(loss: int = loss) -> bool:
                starts = events("training_started")
                instances = list(dict.fromkeys(e.instance for e in starts))
                if len(instances) != loss + 1 or len(events("recovery")) < loss:
                    return False
                inst = instances[-1]
                mine = [e for e in starts if e.instance == inst]
                resume = int(mine[0].payload["resume_step"])
                pulled = [int(e.payload["step"]) for e in events("checkpoint_pulled") if e.instance == inst]
                if loss == 0:
                    return len(mine) >= 2 and any(p >= SLICE_STEPS + 4 for p in pulled)
                return any(p >= resume + CHECKPOINT_EVERY for p in pulled)

            assert wait_until(ready_to_kill, timeout_s=150, interval_s=0.2), log_tail()
            instance = events("training_started")[-1].instance
            destroyed_at[instance] = sim_clock.now()
            market.destroy(instance)
            host_log = sim_root / "hosts" / instance / "sandbox" / "tuneharness-jobs" / job_id / "job" / "train.log"
            killed.append((instance, _last_step(host_log)))

        def done() -> bool:
            with engine.connect() as conn:
                from app.jobs import JobRow

                t = JobRow.__table__  # type: ignore[attr-defined]
                phase = conn.execute(select(t.c.phase).where(t.c.job_id == job_id)).scalar_one()
            return phase in ("evaluating", "done", "failed")

        assert wait_until(done, timeout_s=150, interval_s=0.5), log_tail()
        assert events("adapter_pulled"), log_tail()

        # Two losses, each detected and recovered; work lost per loss at most one checkpoint interval.
        lost = events("host_lost")
        recs = events("recovery")
        assert [e.instance for e in lost] == [k[0] for k in killed]
        assert len(recs) == 2
        for (_inst, reached), rec in zip(killed, recs, strict=True):
            assert reached - int(rec.payload["resume_step"]) <= CHECKPOINT_EVERY, rec.payload
            assert rec.payload["recovery_s"] > 0
        machines = [e.machine for e in events("training_started")]
        assert len(set(machines)) == 3, machines  # the lost machines were excluded
        assert len(machines) > 3  # and at least one slice ended (exit 3) and restarted on its host
        for e in lost:  # detected within 60 (simulated) seconds of the destroy
            assert 0 < e.payload["detected_at"] - destroyed_at[e.instance] <= 60.0, e.payload
        with engine.connect() as conn:
            t = AlertOutboxRow.__table__  # type: ignore[attr-defined]
            kinds = [r.kind for r in conn.execute(select(t.c.kind).where(t.c.job == job_id))]
        assert kinds.count("host_lost") == 2 and kinds.count("running_again") == 2

        # The final adapter: max_steps steps, equal to the uninterrupted run.
        adapter = Path(th_env["TUNEHARNESS_HOME"]) / "artifacts" / "jobs" / job_id / "adapter"
        meta = json.loads((adapter / "trainer_meta.json").read_text())
        assert meta["steps"] == MAX_STEPS
        assert reference.wait(timeout=240) == 0
        got = load_file(str(adapter / "adapter_model.safetensors"))
        want = load_file(str(ref / "adapter" / "adapter_model.safetensors"))
        assert set(got) == set(want)
        diff = max(float((got[k] - want[k]).abs().max()) for k in want)
        assert diff <= 1e-6, diff

        # Automation destroyed no host that held work: the finished host is held (then stopped by the
        # hold sweep), the lost ones were stopped; only standby hosts of the hedged recoveries that
        # never trained may have been destroyed when the job no longer needed them.
        from app.rentals import Rentals

        destroyed = [e for e in events("instance_destroyed") if e.payload.get("by") == "automation"]
        rentals = Rentals(engine)
        assert all(not rentals.by_instance("sim", e.instance).held_work for e in destroyed), destroyed  # type: ignore[union-attr]
        trained = {e.instance for e in events("training_started")}
        assert not trained & {e.instance for e in destroyed}
        status = subprocess.run(
            [sys.executable, "-m", "app.cli.main", "status", "--json"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert status.returncode == 0, status.stderr
        summary = json.loads(status.stdout)["interruptions"]
        assert summary["count"] == 2 and summary["resumed"] == 2 and summary["recovery_median_s"] is not None
        print(
            f"wall {time.monotonic() - started:.1f}s; detection (sim s): "
            f"{[round(e.payload['detected_at'] - destroyed_at[e.instance], 1) for e in lost]}; recoveries (sim s): "
            f"{[round(r.payload['recovery_s'], 1) for r in recs]}; lost steps: "
            f"{[k[1] - int(r.payload['resume_step']) for k, r in zip(killed, recs, strict=True)]}; "
            f"adapter max abs diff {diff:.2e}"
        )
