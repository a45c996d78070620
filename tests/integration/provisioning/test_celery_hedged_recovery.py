"""Through real Celery, Redis, the shared sim marketplace (scaled time) and real SSH: a job with
`standby_hosts: 0` loses its host; the recovery's own create lands on a slow host and hedge standby
jobs start beside it; the first verified host takes the job, the other verified hosts are held,
and beat's `sweep_holds` releases them once their hold ends (destroyed: they never held work)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.services import CeleryWorker, wait_until

ROOT = Path(__file__).resolve().parents[3]
SCALE = 60.0  # the 10-min hold of the extras is 10 s of wall time

JOB = """\
name: hedge-job
train:
  base_model: model
  task: causal_lm
  train_file: train.jsonl
  max_steps: 20
  checkpoint_every: 10
  seed: 1
  learning_rate: 2.0e-4
  batch_size: 4
  max_seq_len: 64
  lora: {r: 8, alpha: 16, target_modules: [q_proj, v_proj]}
  quantization: none
needs:
  gpu: [RTX 3090]
  providers: [sim]
  disk_gb: 20
  download_gb: 3
  train_hours: 0.05
  standby_hosts: 0
budget_usd: 5.0
"""

# What `monitor_training` does on the poll that finds the host gone: the supervisor's own poll
# (provider says gone -> host_lost -> the state machine re-queues) and the shell's scheduling
# (watch_boot on the provision queue). Run here because this test's worker has no monitor queue
# (the trainer itself is the e2e test's business).
SUPERVISOR_POLL = """
import json, sys
from app import bootstrap
from workers.supervisor import _schedule
job, instance = sys.argv[1], sys.argv[2]
sup = bootstrap.supervisor()
found = sup.watch(job)
assert found is not None, "no supervision row: the hand-over did not arm the monitor"
bootstrap.market("sim").destroy(instance)
step = sup.poll(job, found[1])
print(json.dumps(_schedule(step, sup.clock)))
"""


SWEEP = """
from workers.celery_app import app
import workers.provisioning  # noqa: F401  (registers the task)
print(app.send_task("tuneharness.maintenance.sweep_holds", queue="maintenance").id)
"""


def test_a_hedged_recovery_takes_the_first_verified_host_and_the_sweep_releases_the_extras(
    th_env: dict[str, str], tmp_path: Path
) -> None:
    """submit (standby_hosts: 0) -> training on m-0 -> host destroyed -> the recovery rents slow m-1
    and starts hedges (`standby_wanted`) -> the first verified host trains the job -> the extras
    are held (`host_held`) -> after the hold, `sweep_holds` releases them (stopped if they held
    work, destroyed otherwise), and only the training host is left running."""
    offer = {"gpu_name": "RTX 3090", "num_gpus": 1, "gpu_ram_gb": 24, "inet_down_mbps": 800, "reliability": 0.995}
    truth = {"pull_mbps": 400, "status_every_s": 10}
    hosts = [{"machine_id": f"m-{i}", "offer": {**offer, "dph": round(0.10 + 0.01 * i, 2)},
              "truth": {**truth, "pull_mbps": 30} if i == 1 else truth} for i in range(9)]
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"format": "tuneharness-market-trace/1", "name": "hedge",
                                 "workload": {"image_gb": 2, "model_gb": 1}, "hosts": hosts}))
    url_file = tmp_path / "sim-url"
    server = subprocess.Popen(
        [sys.executable, "-m", "app.cli.main", "sim", "serve", "--trace", str(trace), "--scale", str(SCALE),
         "--root", str(tmp_path / "sim"), "--url-file", str(url_file)],
        cwd=ROOT, env=th_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    worker = None
    try:
        assert wait_until(lambda: url_file.exists() or server.poll() is not None, timeout_s=60)
        assert server.poll() is None
        env = {**th_env, "TUNEHARNESS_SIM_URL": url_file.read_text().strip()}
        worker = CeleryWorker.start(env, cwd=ROOT, concurrency=2, name="hedge", queues="provision,ssh,maintenance")
        (tmp_path / "model").mkdir()
        (tmp_path / "train.jsonl").write_text('{"prompt": "a", "completion": "b"}\n')
        (tmp_path / "job.yaml").write_text(JOB)

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "app.cli.main", *args], cwd=ROOT, env=env,
                                  capture_output=True, text=True, timeout=120, check=False)

        def log() -> str:
            assert worker is not None
            return worker.log.read_text(errors="replace")[-4000:]

        out = cli("submit", str(tmp_path / "job.yaml"))
        assert out.returncode == 0, out.stderr
        job_id = out.stdout.strip()

        def ledger(kind: str | None = None) -> list[dict[str, Any]]:
            rows = json.loads(cli("ledger", "show", "--json", "--job", job_id).stdout)
            return [r for r in rows if kind is None or r["kind"] == kind]

        assert wait_until(lambda: len(ledger("training_handed_over")) == 1, timeout_s=120, interval_s=1.0), log()
        first = ledger("training_handed_over")[0]
        assert first["machine"] == "m-0"

        poll = subprocess.run([sys.executable, "-c", SUPERVISOR_POLL, job_id, first["instance"]], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120, check=False)
        assert poll.returncode == 0, poll.stderr[-3000:]
        assert len(ledger("host_lost")) == 1

        assert wait_until(lambda: len(ledger("training_handed_over")) == 2, timeout_s=120, interval_s=1.0), log()
        rows = ledger()
        wanted = [r for r in rows if r["kind"] == "standby_wanted"]
        assert len(wanted) == 1 and wanted[0]["payload"]["purpose"] == "hedge" and wanted[0]["payload"]["count"] >= 2
        second = [r for r in rows if r["kind"] == "training_handed_over"][1]
        assert second["machine"] not in ("m-0", "m-1")  # a hedge's host, verified before the slow one
        adopted = [r for r in rows if r["kind"] == "host_adopted"]
        assert [a["instance"] for a in adopted] == [second["instance"]] and adopted[0]["payload"]["standby"]
        assert len([r for r in rows if r["kind"] == "attempt_handed_over"]) == 1  # the slow m-1 went on as standby

        def running() -> set[str]:
            rows = ledger()
            created = {r["instance"] for r in rows if r["kind"] == "instance_created"}
            ended = {r["instance"] for r in rows if r["kind"] in ("instance_destroyed", "instance_stopped")}
            return created - ended - {first["instance"]}

        def swept() -> bool:
            """Beat's job, every 2 s here: sweep until only the training host runs."""
            sent = subprocess.run([sys.executable, "-c", SWEEP], cwd=ROOT, env=env, capture_output=True,
                                  text=True, timeout=60, check=False)
            assert sent.returncode == 0, sent.stderr[-3000:]
            return running() == {second["instance"]}

        assert wait_until(swept, timeout_s=90, interval_s=2.0), log()
        rows = ledger()
        held = {r["instance"]: r for r in rows if r["kind"] == "host_held"}
        released = {r["instance"]: r for r in rows if r["kind"] == "host_released"}
        assert len(held) >= 2 and "m-1" in {r["machine"] for r in held.values()}  # the hedges and the slow attempt
        assert second["instance"] in held  # it waited, held, until the recovery adopted it
        extras = set(held) - {second["instance"]}
        assert set(released) == extras
        for inst in extras:
            want = "stopped" if held[inst]["payload"]["held_work"] else "destroyed"
            assert released[inst]["payload"]["action"] == want and released[inst]["reason"] == "hold expired"
            assert any(r["kind"] == f"instance_{want}" and r["instance"] == inst for r in rows)
        jobs = json.loads(cli("jobs", "--json").stdout)
        assert [j["phase"] for j in jobs if j["job_id"] == job_id] == ["training"]
    finally:
        if worker is not None:
            worker.stop()
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
