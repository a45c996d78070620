"""Through real Celery workers: an error a worker meets on a job's behalf reaches the job.

- The shipped example job (providers vast, runpod, sim) with no vendor key, on the shared simulated
  marketplace: vast and runpod are skipped with a warning and both training runs rent on sim
  (before, the worker logged a traceback and both runs sat in `provisioning` for ever).
- A job whose only provider refuses the key: the job is `blocked` with the reason and the fix, an
  alert says so, `doctor` lists it and names the refused key; once the key is right, `resume`
  provisions it.
- No provider the job allows is usable here: submit refuses it in one line (exit 2), writes nothing.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from sqlalchemy import text

from providers.fakes import FakeVast, sample_vast_offers
from tests.support.jobfiles import train_section
from tests.support.recovery_fleet import sim_fleet
from tests.support.services import CeleryWorker, wait_until

ROOT = Path(__file__).resolve().parents[3]
REDRIVE_NOW = """
import json
import workers.provisioning as p
from app import bootstrap
p.REDRIVE_GRACE_S = 0.0
overdue = bootstrap.provisioning().overdue(grace_wall_s=0.0)
print(json.dumps([overdue, p.redrive.run()]))
"""


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


class Home:
    """The fleet's database read in this process (the workers and the CLI write it): polling it costs
    no interpreter start per look."""

    def __init__(self, env: dict[str, str]) -> None:
        from app.db import make_engine

        self.engine = make_engine(f"sqlite:///{Path(env['TUNEHARNESS_HOME']) / 'tuneharness.db'}")

    def ledger(self, job: str, kind: str | None = None) -> list[Any]:
        from app.ledger import Ledger

        return Ledger(self.engine).rows(job=job, kind=kind)

    def job(self, job_id: str) -> Any:
        from app.jobs import JobStore

        return JobStore(self.engine).get(job_id)

    def alerts(self, kind: str) -> list[dict[str, Any]]:
        with self.engine.connect() as conn:
            rows = conn.execute(text("SELECT kind, job, summary FROM alert_outbox WHERE kind = :k"), {"k": kind})
            return [dict(r._mapping) for r in rows]


def test_the_example_job_without_vendor_keys_skips_them_and_rents_on_sim(
    th_env: dict[str, str], tmp_path: Path
) -> None:
    """Given no VAST_API_KEY nor RUNPOD_API_KEY, the shipped example job's two runs both rent on the
    shared simulated marketplace, each run's ledger names the two skipped providers, and the worker
    logs no traceback."""
    for item in ("data", "gate.json"):
        src = ROOT / "examples" / item
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / item)
    (tmp_path / "models" / "tiny-causal").mkdir(parents=True)
    shipped = (ROOT / "examples" / "job.yaml").read_text()
    assert "  providers: [sim] " in shipped  # the example rents nothing real unless the renter edits it
    example = shipped.replace("  providers: [sim] ", "  providers: [vast, runpod, sim] ")  # the renter did
    with sim_fleet(th_env, tmp_path, trace="smoke", scale=10.0, name="silent", job_text=example) as fleet:
        home = Home(fleet.env)
        runs = [f"{fleet.job_id}-seed-1", f"{fleet.job_id}-seed-2"]
        submitted = home.ledger(fleet.job_id, "job_submitted")
        assert set(submitted[0].payload["skipped_providers"]) == {"vast", "runpod"}

        def rented_on_sim(run: str) -> bool:
            return any(r.provider == "sim" for r in home.ledger(run, "instance_created"))

        assert wait_until(lambda: all(rented_on_sim(r) for r in runs), timeout_s=180, interval_s=0.5), fleet.log()
        for run in runs:
            assert {r.provider for r in home.ledger(run, "provider_skipped")} == {"vast", "runpod"}
            assert home.job(run).phase in ("provisioning", "training")
        assert sorted(a["job"] for a in home.alerts("provider_skipped")) == sorted(runs * 2)
        assert "Traceback" not in fleet.worker.log.read_text(errors="replace")


def test_a_refused_key_blocks_the_job_with_the_fix_and_resume_goes_on(th_env: dict[str, str], tmp_path: Path) -> None:
    """Given the job's only provider refuses the worker's key, the job is blocked (reason, fix), an
    alert and doctor say so, redrive leaves it alone; after the key is accepted, resume provisions it."""
    worker_key = "worker-key-0123456789"
    with FakeVast(api_key="the-right-key-987654", offers=sample_vast_offers()) as vast:
        env = {**th_env, "VAST_API_KEY": worker_key, "VAST_API_URL": vast.url}
        (tmp_path / "model").mkdir()
        (tmp_path / "train.jsonl").write_text('{"prompt": "a", "completion": "b"}\n')
        (tmp_path / "job.yaml").write_text(
            "name: refused\n"
            + train_section("none")
            + "needs:\n  gpu: [RTX 3090]\n  providers: [vast]\n  disk_gb: 20\n  train_hours: 0.05\nbudget_usd: 5.0\n"
        )
        worker = CeleryWorker.start(env, cwd=ROOT, name="refused", queues="provision,ssh,maintenance")
        home = Home(env)
        try:
            out = _cli(env, "submit", str(tmp_path / "job.yaml"))
            assert out.returncode == 0, out.stderr
            job = out.stdout.strip()
            assert wait_until(lambda: home.job(job).phase == "blocked", timeout_s=90, interval_s=0.2), (
                worker.log.read_text(errors="replace")[-3000:]
            )
            detail = home.job(job).detail
            assert "vast" in detail and "refused" in detail and f"tuneharness resume {job}" in detail, detail
            blocked = home.ledger(job, "job_blocked")
            assert len(blocked) == 1 and blocked[0].payload["task"] == "tuneharness.provision.provision"
            alerts = home.alerts("job_blocked")
            assert [a["job"] for a in alerts] == [job]
            assert worker_key not in json.dumps(alerts) and worker_key not in detail
            log = worker.log.read_text(errors="replace")
            assert "Traceback" not in log and worker_key not in log

            doctor = {c["name"]: c for c in json.loads(_cli(env, "doctor", "--json").stdout)}
            assert doctor["jobs"]["ok"] is False and job in doctor["jobs"]["detail"]
            assert doctor["vendor vast"]["ok"] is False and "refused" in doctor["vendor vast"]["detail"]
            assert doctor["vendor runpod"]["ok"] is True  # no key: not configured, not a failure

            # redrive at once (no grace): the blocked job's wake-up is past, yet nothing is sent for it
            redrive = subprocess.run(
                [sys.executable, "-c", REDRIVE_NOW],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
                check=True,
            )
            overdue, sent = json.loads(redrive.stdout.strip().splitlines()[-1])
            assert job in overdue and job not in sent["watch_boot"] and job not in sent["provision"]

            vast.api_key = worker_key  # the operator fixed the key
            resumed = _cli(env, "resume", job)
            assert resumed.returncode == 0, resumed.stderr

            def rented() -> bool:
                return any(r.provider == "vast" for r in home.ledger(job, "instance_created"))

            assert wait_until(rented, timeout_s=90, interval_s=0.2), worker.log.read_text(errors="replace")[-3000:]
            assert home.job(job).phase == "provisioning"
        finally:
            worker.stop()


def test_submit_refuses_a_job_none_of_whose_providers_is_usable(th_env: dict[str, str], tmp_path: Path) -> None:
    """Given no vendor key, a job allowing only vast and runpod is refused at submit in one line, exit
    2, and nothing is written."""
    (tmp_path / "model").mkdir()
    (tmp_path / "train.jsonl").write_text('{"prompt": "a", "completion": "b"}\n')
    (tmp_path / "job.yaml").write_text(
        "name: nokeys\n" + train_section("none") + "needs:\n  gpu: [RTX 3090]\n  providers: [vast, runpod]\n"
    )
    out = _cli(th_env, "submit", str(tmp_path / "job.yaml"))
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("error: none of the job's providers can be used")
    assert "VAST_API_KEY" in out.stderr and "RUNPOD_API_KEY" in out.stderr
    assert not (Path(th_env["TUNEHARNESS_HOME"]) / "tuneharness.db").exists()  # nothing written
