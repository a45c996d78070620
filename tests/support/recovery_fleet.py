"""The fleet the Celery provisioning and recovery integration tests share: `sim serve` on a trace
(for the recovery tests, one of identical RTX 3090 offers), a real Celery worker (provision, ssh,
maintenance queues), a submitted job, and the commands a test drives it with (the CLI, the ledger,
the supervisor's poll that finds the host gone). The trainer itself is the e2e test's business:
the worker has no monitor queue."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.jobfiles import sim_needs_section, train_section
from tests.support.services import CeleryWorker
from tests.support.simserve import rtx3090_hosts, sim_serve, write_trace

ROOT = Path(__file__).resolve().parents[2]

TRUTH = {"pull_mbps": 400, "status_every_s": 10}


def job_yaml(name: str, standby_hosts: int) -> str:
    return f"name: {name}\n{train_section('none')}" + sim_needs_section(standby_hosts=standby_hosts)


# What `monitor_training` does on the poll that finds the host gone: the supervisor's own poll
# (provider says gone -> host_lost -> the state machine re-queues) and the shell's scheduling
# (watch_boot on the provision queue).
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


def hosts(n: int, *, truth_of: dict[int, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """`n` healthy hosts m-0, m-1, ... priced 0.10, 0.11, ... (cheapest first); `truth_of` overrides some."""
    return rtx3090_hosts(n, truth=TRUTH, truth_of=truth_of)


@dataclass
class Fleet:
    env: dict[str, str]
    worker: CeleryWorker
    job_id: str = ""

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

    def log(self) -> str:
        return self.worker.log.read_text(errors="replace")[-4000:]

    def ledger(self, kind: str | None = None) -> list[dict[str, Any]]:
        rows = json.loads(self.cli("ledger", "show", "--json", "--job", self.job_id).stdout)
        return [r for r in rows if kind is None or r["kind"] == kind]

    def phase(self) -> str | None:
        jobs = json.loads(self.cli("jobs", "--json").stdout)
        return next((j["phase"] for j in jobs if j["job_id"] == self.job_id), None)

    def python(self, code: str, *args: str) -> str:
        """Run `code` as a program in the fleet's environment; its stdout (it must exit 0)."""
        done = subprocess.run(
            [sys.executable, "-c", code, *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    def lose_host(self, instance: str) -> dict[str, Any]:
        """Destroy the training host behind the fleet's back and run the supervisor's poll; its schedule."""
        return dict(json.loads(self.python(SUPERVISOR_POLL, self.job_id, instance).strip().splitlines()[-1]))


@contextmanager
def sim_fleet(
    th_env: dict[str, str], tmp_path: Path, *, trace: str, scale: float, name: str, job_text: str
) -> Iterator[Fleet]:
    """`sim serve` on `trace` (a file or a shipped trace's name), a worker on the provision, ssh
    and maintenance queues, and `job_text` submitted; everything stopped on the way out."""
    with sim_serve(th_env, tmp_path, trace=trace, scale=scale) as url:
        env = {**th_env, "TUNEHARNESS_SIM_URL": url}
        # No monitor queue: the trainer is the e2e tests' business.
        worker = CeleryWorker.start(env, cwd=ROOT, concurrency=2, name=name, queues="provision,ssh,maintenance")
        try:
            (tmp_path / "model").mkdir()
            (tmp_path / "train.jsonl").write_text('{"prompt": "a", "completion": "b"}\n')
            (tmp_path / "job.yaml").write_text(job_text)
            fleet = Fleet(env=env, worker=worker)
            out = fleet.cli("submit", str(tmp_path / "job.yaml"))
            assert out.returncode == 0, out.stderr
            fleet.job_id = out.stdout.strip()
            yield fleet
        finally:
            worker.stop()


@contextmanager
def recovery_fleet(
    th_env: dict[str, str],
    tmp_path: Path,
    trace_hosts: list[dict[str, Any]],
    *,
    name: str,
    scale: float,
    standby_hosts: int,
) -> Iterator[Fleet]:
    """Serve a trace of `trace_hosts`, start a worker, submit the job (`sim_fleet`)."""
    trace = write_trace(tmp_path / "trace.json", name=name, hosts=trace_hosts, workload={"image_gb": 2, "model_gb": 1})
    with sim_fleet(
        th_env, tmp_path, trace=str(trace), scale=scale, name=name, job_text=job_yaml(f"{name}-job", standby_hosts)
    ) as fleet:
        yield fleet
