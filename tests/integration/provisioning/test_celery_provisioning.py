"""Through real Celery, Redis, the shared sim marketplace (scaled time) and real SSH: three lying
hosts are caught and the job lands on the healthy one, every decision in the ledger with evidence."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.jobfiles import train_section
from tests.support.services import CeleryWorker, wait_until

ROOT = Path(__file__).resolve().parents[3]
SCALE = 10.0  # the smoke trace's 60 s pull takes 6 wall seconds

JOB = "name: smoke-job\n" + train_section("none") + """\
needs:
  gpu: [RTX 3090]
  providers: [sim]
  disk_gb: 20
  download_gb: 3
  train_hours: 0.05
budget_usd: 5.0
"""


def test_frozen_fatal_and_stale_hosts_are_caught_and_the_job_lands_on_the_healthy_one(
    th_env: dict[str, str], tmp_path: Path,
) -> None:
    """submit -> provision -> watch_boot -> preflight over SSH: three duds destroyed and quarantined, one hand-over."""
    url_file = tmp_path / "sim-url"
    server = subprocess.Popen(
        [sys.executable, "-m", "app.cli.main", "sim", "serve", "--trace", "smoke", "--scale", str(SCALE),
         "--root", str(tmp_path / "sim"), "--url-file", str(url_file)],
        cwd=ROOT, env=th_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    worker = None
    try:
        assert wait_until(lambda: url_file.exists() or server.poll() is not None, timeout_s=60)
        assert server.poll() is None
        env = {**th_env, "TUNEHARNESS_SIM_URL": url_file.read_text().strip()}
        # No monitor queue: this test ends at the hand-over (the supervisor's e2e test goes on from there).
        worker = CeleryWorker.start(env, cwd=ROOT, concurrency=2, name="prov", queues="provision,ssh,maintenance")
        (tmp_path / "model").mkdir()
        (tmp_path / "train.jsonl").write_text('{"prompt": "a", "completion": "b"}\n')
        (tmp_path / "job.yaml").write_text(JOB)

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "app.cli.main", *args], cwd=ROOT, env=env,
                                  capture_output=True, text=True, timeout=120, check=False)

        out = cli("submit", str(tmp_path / "job.yaml"))
        assert out.returncode == 0, out.stderr
        job_id = out.stdout.strip()

        def phase() -> str:
            jobs = json.loads(cli("jobs", "--json").stdout)
            return str(jobs[0]["phase"])

        def settled() -> bool:
            return phase() in ("training", "failed")

        assert wait_until(settled, timeout_s=240, interval_s=2.0), (
            worker.log.read_text(errors="replace")[-3000:])
        assert phase() == "training", worker.log.read_text(errors="replace")[-4000:]

        rows = json.loads(cli("ledger", "show", "--json", "--job", job_id).stdout)
        destroyed = {r["machine"]: r for r in rows if r["kind"] == "instance_destroyed"}
        assert set(destroyed) == {"m-frozen", "m-fatal", "m-stale"}
        failed = {r["machine"]: r["reason"] for r in rows if r["kind"] == "host_failed"}
        assert failed == {"m-frozen": "boot_frozen", "m-fatal": "boot_fatal", "m-stale": "no_compute"}
        assert all(r["payload"].get("evidence") for r in rows if r["kind"] in ("instance_destroyed", "host_failed"))
        handed = [r for r in rows if r["kind"] == "training_handed_over"]
        assert len(handed) == 1 and handed[0]["machine"] == "m-good"
        hosts = {h["machine_id"]: h for h in json.loads(cli("hosts", "--json").stdout)}
        assert all(hosts[m]["quarantined"] for m in ("m-frozen", "m-fatal", "m-stale"))
        assert hosts["m-good"]["preflight_passed"] == 1 and not hosts["m-good"]["quarantined"]
    finally:
        if worker is not None:
            worker.stop()
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
