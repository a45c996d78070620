"""Through real Celery, Redis, the shared sim marketplace (scaled time) and real SSH: a job with
`standby_hosts: 1` keeps a verified standby host; when its training host vanishes, the
supervisor's loss path re-queues it and the recovery adopts the standby host (no create, no
pull, no preflight for the recovery itself)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.services import CeleryWorker, wait_until

ROOT = Path(__file__).resolve().parents[3]
SCALE = 10.0

JOB = """\
name: standby-job
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
  standby_hosts: 1
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


def test_a_recovery_adopts_the_verified_standby_host(th_env: dict[str, str], tmp_path: Path) -> None:
    """submit (standby_hosts: 1) -> training + one held standby host -> host destroyed -> the
    supervisor's poll re-queues -> watch_boot adopts the standby host, under the job's own budget."""
    offer = {"gpu_name": "RTX 3090", "num_gpus": 1, "gpu_ram_gb": 24, "inet_down_mbps": 800, "reliability": 0.995}
    truth = {"pull_mbps": 400, "status_every_s": 10}
    hosts = [{"machine_id": f"m-{i}", "offer": {**offer, "dph": round(0.10 + 0.01 * i, 2)}, "truth": truth}
             for i in range(4)]
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"format": "tuneharness-market-trace/1", "name": "standby",
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
        worker = CeleryWorker.start(env, cwd=ROOT, concurrency=2, name="standby", queues="provision,ssh,maintenance")
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

        def held() -> list[dict[str, Any]]:
            return [h for h in json.loads(cli("hosts", "held", "--json").stdout) if h["standby"]]

        assert wait_until(lambda: len(ledger("training_handed_over")) == 1, timeout_s=240, interval_s=2.0), log()
        first = ledger("training_handed_over")[0]
        assert wait_until(lambda: len(held()) == 1, timeout_s=240, interval_s=2.0), log()
        (standby,) = held()
        assert standby["owner"] == job_id and standby["machine_id"] != first["machine"]
        # the standby host was rented under the job's name: its label, its budget
        created = {r["instance"]: r for r in ledger("instance_created")}
        assert standby["instance_id"] in created
        assert created[standby["instance_id"]]["payload"]["attempt"] > 1000

        poll = subprocess.run([sys.executable, "-c", SUPERVISOR_POLL, job_id, first["instance"]], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120, check=False)
        assert poll.returncode == 0, poll.stderr[-3000:]
        assert json.loads(poll.stdout.strip().splitlines()[-1])["next"] == "provision"
        assert len(ledger("host_lost")) == 1

        assert wait_until(lambda: len(ledger("training_handed_over")) == 2, timeout_s=120, interval_s=1.0), log()
        second = ledger("training_handed_over")[1]
        assert second["instance"] == standby["instance_id"]
        adopted = ledger("host_adopted")
        assert len(adopted) == 1 and adopted[0]["instance"] == standby["instance_id"]
        assert adopted[0]["payload"]["standby"] is True
        lost_seq = ledger("host_lost")[0]["seq"]
        # nothing was rented for the recovery itself (only for the standby pool's refill)
        assert all(r["payload"].get("standby_job") for r in ledger("offer_chosen") if r["seq"] > lost_seq)
        jobs = json.loads(cli("jobs", "--json").stdout)
        assert [j["phase"] for j in jobs if j["job_id"] == job_id] == ["training"]
        receipt = json.loads(cli("receipt", "--json").stdout)
        assert set(receipt["by_job"]) == {job_id}
    finally:
        if worker is not None:
            worker.stop()
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
