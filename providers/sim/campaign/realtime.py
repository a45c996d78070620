"""A campaign through the real-time path: the same trace the virtual driver replays, run by the
fleet production runs, so that both drivers' receipts can be compared.

`tuneharness sim campaign --driver celery --trace FILE` starts, in a private state directory:
`tuneharness sim serve` on the trace in scaled time (a real `sshd` per running host), a private
redis-server, a Celery worker and one beat (`app.stack.Stack`), and the SQLite database; it sets the
campaign's budget as the default cap, submits the trace's jobs (a tiny model, trained by the real
trainer on the CPU, each step taking the simulated time the trace's workload gives it on that
card), waits until every job is done or failed, and asks the marketplace's referee for the receipt
of what the control plane's ledger says it did. Only the guarded policy runs in production.

Slow by nature: the campaign's simulated seconds pass at `scale` per wall second, plus the
processes' start-up.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from app.errors import UserError
from providers.sim.campaign.driver import CampaignResult
from providers.sim.campaign.trainer import TRAINER_START_S
from providers.sim.clock import ScaledClock
from providers.sim.trace import Trace, load_trace

__all__ = ["DEFAULT_SCALE", "STEPS_PER_JOB", "run_campaign_realtime"]

DEFAULT_SCALE = 3.0  # simulated seconds per wall second: the real processes' own overheads stay small
STEPS_PER_JOB = 24  # each job's training, cut into this many paced steps
_ROOT = Path(__file__).resolve().parents[3]
_OWN_VARS = ("TUNEHARNESS_", "VAST_", "RUNPOD_")

Progress = Callable[[str], None]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(until: Callable[[], bool], *, timeout_s: float, every_s: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if until():
            return True
        time.sleep(every_s)
    return until()


def _job_yaml(name: str, trace: Trace, *, steps: int) -> str:
    w = trace.workload
    every = max(1, round(steps * w.checkpoint_every_s / max(w.train_seconds, 1e-9)))
    return f"""\
name: {name}
train:
  base_model: model
  task: causal_lm
  train_file: train.jsonl
  max_steps: {steps}
  checkpoint_every: {every}
  seed: 1
  learning_rate: 1.0e-3
  batch_size: 4
  max_seq_len: 64
  lora: {{r: 4, alpha: 8, target_modules: [q_proj, v_proj]}}
  quantization: none
needs:
  providers: [sim]
  disk_gb: {w.disk_gb:g}
  download_gb: {w.download_gb:g}
  train_hours: {w.train_seconds / 3600.0:.6f}
"""


class _Run:
    """One real-time campaign's processes and state directory."""

    def __init__(self, trace_ref: str, trace: Trace, *, scale: float, home: Path, progress: Progress) -> None:
        self.trace_ref = trace_ref
        self.trace = trace
        self.scale = scale
        self.home = home
        self.say = progress
        self.server: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.env: dict[str, str] = {k: v for k, v in os.environ.items() if not k.startswith(_OWN_VARS)}
        self.env.update(
            {
                # the state (every job's SSH key) apart from the job files beside it: nothing under
                # TUNEHARNESS_HOME may be shipped to a host (app/shipguard.py)
                "TUNEHARNESS_HOME": str(home / "state"),
                "TUNEHARNESS_DB_URL": f"sqlite:///{home / 'tuneharness.db'}",
                "TUNEHARNESS_BROKER_URL": f"redis://127.0.0.1:{_free_port()}/0",  # nothing there: a private redis
                "TUNEHARNESS_PROVIDERS": "sim",
                "TUNEHARNESS_SIM_SCALE": f"{scale:g}",  # beat's periods in simulated seconds
                "TUNEHARNESS_SLICE_S": str(max(3600.0, 10 * trace.workload.train_seconds)),
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
                "PYTHONPATH": os.pathsep.join(p for p in (str(_ROOT), os.environ.get("PYTHONPATH", "")) if p),
            }
        )

    def cli(self, *args: str, timeout_s: float = 120.0) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "app.cli.main", *args],
            cwd=_ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if done.returncode != 0:
            raise UserError(f"`tuneharness {' '.join(args)}` failed: {(done.stderr or done.stdout).strip()[-400:]}")
        return done.stdout

    def submit(self, paths: list[str]) -> list[str]:
        """Submit the job files from one process (`app.api.submit`, what `tuneharness submit` calls)."""
        code = (
            "import sys\nfrom app.api import submit\nfrom app.jobs import load_job_file\n"
            "for p in sys.argv[1:]:\n    print(submit(load_job_file(p)))\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", code, *paths],
            cwd=_ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if done.returncode != 0:
            raise UserError(f"submitting the campaign's jobs failed: {done.stderr.strip()[-400:]}")
        return done.stdout.split()

    def serve(self, *, train_step_s: float, train_start_s: float) -> None:
        url_file = self.home / "sim-url"
        log = (self.home / "sim-serve.log").open("wb")
        self.server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "app.cli.main",
                "sim",
                "serve",
                "--trace",
                self.trace_ref,
                "--scale",
                str(self.scale),
                "--root",
                str(self.home / "sim"),
                "--url-file",
                str(url_file),
                "--train-step-s",
                str(train_step_s),
                "--train-start-s",
                str(train_start_s),
            ],
            cwd=_ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        if (
            not _wait(lambda: url_file.exists() or self.server is None or self.server.poll() is not None, timeout_s=60)
            or not url_file.exists()
        ):
            raise UserError(f"sim serve did not start; see {self.home / 'sim-serve.log'}")
        self.url = url_file.read_text().strip()
        self.env["TUNEHARNESS_SIM_URL"] = self.url

    def clock(self) -> ScaledClock:
        c = httpx.get(f"{self.url}/v1/health", timeout=10).json()["clock"]
        return ScaledClock(scale=float(c["scale"]), epoch_s=float(c["epoch_s"]))

    def stop_server(self) -> None:
        if self.server is not None and self.server.poll() is None:
            self.server.send_signal(signal.SIGTERM)
            try:
                self.server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.server.pid, signal.SIGKILL)
                self.server.wait(timeout=10)


def run_campaign_realtime(
    trace_ref: str,
    *,
    scale: float = DEFAULT_SCALE,
    jobs: int | None = None,
    timeout_s: float | None = None,
    workdir: Path | None = None,
    progress: Progress | None = None,
    monitor_s: float | None = None,
) -> CampaignResult:
    """Run the trace's campaign through Celery in scaled time; the referee's receipt of it.

    `monitor_s`: the supervisor's poll period (TUNEHARNESS_MONITOR_S; default 30 simulated s). A
    job's end is seen at the poll after it: a shorter period narrows how far that lands from the
    virtual driver's poll, for a comparison of the two."""
    from app.settings import load_settings
    from app.stack import Stack

    if not 0 < scale < float("inf"):
        raise UserError(f"--scale must be a positive number, got {scale}. Fix: e.g. --scale 5")
    trace = load_trace(trace_ref)
    n_jobs = jobs if jobs is not None else trace.workload.jobs
    say = progress or (lambda _msg: None)
    home = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="tuneharness-campaign-"))
    home.mkdir(parents=True, exist_ok=True)
    run = _Run(trace_ref, trace, scale=scale, home=home, progress=say)
    if monitor_s is not None:
        run.env["TUNEHARNESS_MONITOR_S"] = f"{monitor_s:g}"
    w = trace.workload
    budget = w.budget_usd if w.budget_usd is not None else 1000.0
    stack: Stack | None = None
    try:
        # the trainer model's start-up and speed, so a job takes the simulated time it takes there
        run.serve(train_step_s=w.train_seconds / STEPS_PER_JOB, train_start_s=TRAINER_START_S)
        say(f"sim market on {run.url} ({scale:g}x); state in {home}")
        jobdir = home / "job"
        jobdir.mkdir(exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "trainer", "make-tiny-model", str(jobdir / "model")],
            cwd=_ROOT,
            env=run.env,
            check=True,
            capture_output=True,
            timeout=300,
        )
        rows = [{"prompt": f"w{i} x{i % 7} ->", "completion": f" x{i % 7} w{i}"} for i in range(64)]
        (jobdir / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        run.cli("budget", "set", "default", "--cap-usd", f"{budget:.6f}")
        stack = Stack(
            load_settings(run.env),
            run_dir=home / "run",
            flower=False,
            beat=True,
            worker_concurrency=4,
            extra_env=run.env,
        )
        stack.start()
        run.env["TUNEHARNESS_BROKER_URL"] = run.env["TUNEHARNESS_RESULT_URL"] = stack.broker_url
        paths = []
        for i in range(n_jobs):
            path = jobdir / f"job-{i + 1}.yaml"
            path.write_text(_job_yaml(f"job-{i + 1}", trace, steps=STEPS_PER_JOB))
            paths.append(str(path))
        clock = run.clock()
        t0 = clock.now()
        ids = run.submit(paths)  # all at once, as the campaign starts every job at its first instant
        say(f"submitted {len(ids)} job(s): {', '.join(ids)}")
        phases = _await_jobs(run, ids, stack, timeout_s=timeout_s, sim_budget_s=_sim_estimate(trace), say=say)
        end = clock.now()
        stack.stop()
        stack = None
        facts = _facts(run, ids, phases, clock, t0=t0, end=end, budget_usd=w.budget_usd)
        got = httpx.post(f"{run.url}/v1/referee/receipt", json=facts, timeout=60)
        got.raise_for_status()
        receipt = dict(got.json())
        return CampaignResult(receipt=receipt, ledger=_ledger_rows(run), unfinished=dict(facts["unfinished"]))
    finally:
        if stack is not None:
            stack.stop()
        run.stop_server()


def _sim_estimate(trace: Trace) -> float:
    """A generous bound on the campaign's simulated length: every job's pull and training, twice
    over, plus a dud's worth of boot watching per host."""
    w = trace.workload
    pull = w.download_gb * 8000.0 / 200.0
    return 2.0 * w.jobs * (pull + w.train_seconds) + 300.0 * min(len(trace.hosts), 20)


def _await_jobs(
    run: _Run, ids: list[str], stack: Any, *, timeout_s: float | None, sim_budget_s: float, say: Progress
) -> dict[str, tuple[str, str]]:
    """Wait until every job is done or failed (or the wall-clock bound passes); (phase, detail) each."""
    from app.db import make_engine
    from app.jobs import JobStore

    store = JobStore(make_engine(run.env["TUNEHARNESS_DB_URL"]))
    bound = timeout_s if timeout_s is not None else 120.0 + sim_budget_s / run.scale
    deadline = time.monotonic() + bound
    last = ""
    while True:
        stack.check_alive()
        recs = {j: store.get(j) for j in ids}
        phases = {j: (r.phase, r.detail) if r is not None else ("unknown", "") for j, r in recs.items()}
        line = ", ".join(f"{j}: {p}" for j, (p, _) in phases.items())
        if line != last:
            say(line)
            last = line
        if all(p in ("done", "failed") for p, _ in phases.values()):
            return phases
        if time.monotonic() > deadline:
            return {
                j: (p, d) if p in ("done", "failed") else ("failed", f"unfinished in phase {p} after {bound:.0f} s")
                for j, (p, d) in phases.items()
            }
        time.sleep(1.0)


def _ledger_rows(run: _Run) -> list[dict[str, Any]]:
    from app.db import make_engine
    from app.ledger import Ledger

    return [r.as_dict() for r in Ledger(make_engine(run.env["TUNEHARNESS_DB_URL"])).rows()]


def _facts(
    run: _Run,
    ids: list[str],
    phases: Mapping[str, tuple[str, str]],
    clock: ScaledClock,
    *,
    t0: float,
    end: float,
    budget_usd: float | None,
) -> dict[str, Any]:
    """What the control plane did, from its ledger and tables, in the simulated clock's seconds."""
    from app.db import make_engine
    from app.rentals import Rentals
    from app.services.pool import Pool

    rows = _ledger_rows(run)
    engine = make_engine(run.env["TUNEHARNESS_DB_URL"])

    def sim(at: str) -> float:
        return clock.from_wall(datetime.fromisoformat(at).timestamp())

    # The campaign begins at its first decision and ends when its last job's end is decided, as in
    # the simulator: not when this process, polling the job table, happened to look.
    started = [sim(r["at"]) for r in rows if r["kind"] == "provisioning_started"]
    ended = [sim(r["at"]) for r in rows if r["kind"] in ("provisioning_finished", "provisioning_failed")]
    if started:
        t0 = min(started)
    if ended and len(ended) >= len(ids):
        end = min(end, max(ended))

    destroyed = [
        r["instance"]
        for r in rows
        if r["kind"] == "instance_destroyed" and r["instance"] and "verdict" in (r.get("payload") or {})
    ]
    trainers: list[list[float]] = []
    for job in ids:
        mine = [r for r in rows if r["job"] == job]
        start: float | None = None
        for r in mine:
            if r["kind"] == "training_handed_over":
                start = sim(r["at"])
            elif start is not None and r["kind"] in ("host_lost", "adapter_pulled", "provisioning_failed"):
                p = r.get("payload") or {}
                if r["kind"] == "host_lost" and p.get("last_good_at") is not None:
                    good = float(p["last_good_at"])
                    idle = max(0.0, float(p.get("detected_at", good)) - good) if p.get("cause") == "hang" else 0.0
                    trainers.append([max(0.0, good - start), idle])
                else:
                    trainers.append([max(0.0, sim(r["at"]) - start), 0.0])
                start = None
        if start is not None:
            trainers.append([max(0.0, end - start), 0.0])
    # The policy's Recovered (the replacement handed the job), as the campaign simulator records it.
    recoveries = [
        {
            "job": r["job"],
            "machine_id": r["payload"].get("machine_id"),
            "cause": r["payload"].get("cause"),
            "lost_at_s": round(float(r["payload"]["lost_at"]) - t0, 3),
            "resumed_at_s": round(float(r["payload"]["resumed_at"]) - t0, 3),
        }
        for r in rows
        if r["kind"] == "provisioning_recovered"
    ]
    standby: dict[str, list[float | None]] = {}
    adopted = {h.instance_id: h.ended_at for h in Pool(engine).held(states=("adopted",))}
    for rental in Rentals(engine).all():
        if rental.attempt >= 1000 and rental.instance_id:  # a standby job's rental
            stop = adopted.get(rental.instance_id) or rental.stopped_at or rental.ended_at
            standby[rental.instance_id] = [rental.created_at, stop]
    unfinished = {j: d or f"ended {p}" for j, (p, d) in phases.items() if p != "done"}
    return {
        "policy": "guarded",
        "trace": run.trace_ref,
        "t0": t0,
        "end": end,
        "destroyed_on_failure": destroyed,
        "trainers": trainers,
        "recoveries": recoveries,
        "finished": sum(1 for p, _ in phases.values() if p == "done"),
        "unfinished": unfinished,
        "real_jobs": ids,
        "budget_usd": budget_usd,
        "standby_hosts": 0,
        "standby_spans": standby,
    }
