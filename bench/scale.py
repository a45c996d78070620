"""The control plane at fleet scale: N running jobs supervised by the real Celery workers and beat.

    python bench/scale.py                       # N = 100, 1000, 5000, 10000
    python bench/scale.py --quick               # N = 100, 1000
    python bench/scale.py --n 1000 --seconds 120 --workers 2

Per N, on a private redis-server and a brand-new PostgreSQL database: one job is provisioned by
the real provisioning service (on the simulated marketplace, virtual clock) and handed to the
supervisor, which launches its trainer; its rows (job, provisioning state, rental, reservation,
budget cap, supervision) are then copied N times, each copy its own job, instance and machine.
Every job's monitor chain is armed with its first poll spread over one poll period, and the
product's workers (`celery -A bench.scale_worker worker -Q monitor,maintenance`) and beat run
them for `--seconds`. Hosts: up to `--real-ssh-max` jobs (100) are probed over real SSH (one
OpenSSH sshd, each job's own key, status files refreshed by the bench); above that, the probe is
answered at the SSH port's edge from the simulated host's truth (`bench/scale_worker.py`), and the
cost of a real probe (connect, exec, read, close), measured here against the sshd, is stated
beside the totals. 2% of the hosts vanish and 1% hang (step frozen, GPU idle) at random moments.
Every sweep (reaper, reconciler, idle watchdog, budget monitor, ...) is run once mid-window.

Measured after a warm-up, per N: control-plane CPU (workers, beat, the private Redis, and the
PostgreSQL backends serving this database) per job-hour; Redis commands per job-minute (INFO
commandstats); database rows and bytes written per job-hour, and the ledger's share; poll lag
(the message's due time to the task's start) p50/p99; loss and hang detection p99 (the truth's
moment to the `host_lost` ledger event); the longest sweep; and the worker processes N needs,
from the CPU one poll costs. Writes bench/results/scale.json and docs/scale.svg.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import _results
from bench.scale_worker import STEP_EVERY_S, instance_of, job_of, machine_of

REPO = Path(__file__).resolve().parents[1]
PG_ADMIN_URL = os.environ.get("TUNEHARNESS_TEST_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
POLL_S = 30.0  # the supervisor's monitor period (SupervisorConfig.monitor_s)
TEMPLATE_JOB = "scale-template"
LOSS_SHARE = 0.02
HANG_SHARE = 0.01
SWEEPS = (
    "reaper",
    "reconcile",
    "idle_watchdog",
    "budget_monitor",
    "sweep_holds",
    "redrive",
    "rearm_monitors",
    "answer_price_increases",
)
# The tables one training job holds rows in, copied per job (the ledger's history is not).
CLONED_TABLES = (
    "jobs",
    "provisioning_state",
    "rentals",
    "rental_sends",
    "budget_caps",
    "budget_reservations",
    "supervision",
    "machine_reputation",
    "gpu_speed",
    "pull_rates",
    "risk_spans",
)
JOB_TEXT = """name: scale
train:
  base_model: model
  task: causal_lm
  train_file: train.jsonl
  max_steps: 1000000
  checkpoint_every: 1000000
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
  train_hours: 1000
budget_usd: 5000.0
"""


def _percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100.0 * len(s)) - 1))]


# -- the private services ------------------------------------------------------------------------
@contextmanager
def _redis(tmp: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    import socket

    import redis

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    proc = subprocess.Popen(
        [
            *("redis-server", "--bind", "127.0.0.1", "--port", str(port), "--dir", str(tmp)),
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis(port=port, socket_connect_timeout=0.2).ping()
                break
            except redis.RedisError:
                if time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0", proc
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@contextmanager
def _database() -> Iterator[tuple[str, str]]:
    import psycopg

    name = f"th_scale_{os.getpid()}_{int(time.time())}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=3) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}".replace("postgresql://", "postgresql+psycopg://", 1), name
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=3) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _pg(dbname: str) -> Any:
    import psycopg

    return psycopg.connect(PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + dbname, autocommit=True)


# -- the fleet -----------------------------------------------------------------------------------
def _seed_template(db_url: str, tmp: Path) -> None:
    """One job provisioned by the real services on the simulated marketplace and handed over."""
    from app.alerts import InMemoryNotifier
    from app.artifacts import LocalArtifactStore
    from app.budget import Budget
    from app.db import init_db, make_engine
    from app.jobs import JobStore, parse_job_text
    from app.ledger import Ledger
    from app.market import LaunchSpec
    from app.policy.preflight import PreflightReport
    from app.policy.provisioning import PreflightResult
    from app.policy.ranking import JobShape, Requirements
    from app.ports import CommandResult
    from app.services.provisioning import ProvisioningService
    from app.services.supervisor import Bundle, SupervisorService
    from providers.sim.clock import VirtualClock
    from providers.sim.market import SimMarket
    from providers.sim.trace import load_trace

    engine = make_engine(db_url)
    init_db(engine)
    offer = {"gpu_name": "RTX 3090", "num_gpus": 1, "gpu_ram_gb": 24, "inet_down_mbps": 800, "reliability": 0.995}
    trace = tmp / "trace.json"
    host = {"machine_id": "m-0", "offer": {**offer, "dph": 0.1}, "truth": {}}
    doc = {"format": "tuneharness-market-trace/1", "name": "scale", "workload": {"image_gb": 2, "model_gb": 1}}
    trace.write_text(json.dumps({**doc, "hosts": [host]}), encoding="utf-8")
    clock = VirtualClock(time.time() - 120)
    market = SimMarket(load_trace(trace), clock)
    jobs = JobStore(engine)
    jobs.add(parse_job_text(JOB_TEXT, check_files=False), job_id=TEMPLATE_JOB, now=clock.now())
    Budget(engine, Ledger(engine)).set_cap(TEMPLATE_JOB, 5000.0)

    def preflight(_m: Any, _job: str, instance_id: str) -> PreflightResult:
        raw = market.referee.preflight_report(instance_id)
        assert raw is not None
        return PreflightResult(PreflightReport.from_mapping(raw))

    spec = LaunchSpec(image="img", disk_gb=20, label="", ssh_public_key="ssh-ed25519 k")
    prov = ProvisioningService(
        engine, market_for=lambda _n: market, clock=clock, run_preflight=preflight, launch_spec_for=lambda _j: spec
    )
    prov.ttl_s = 48 * 3600.0
    step = prov.start(TEMPLATE_JOB, req=Requirements(), shape=JobShape(download_gb=3.0, train_s=3600.0, disk_gb=20.0))
    for _ in range(500):
        if step.handed_over:
            break
        if step.preflight_instance:
            step = prov.preflight(step.job_id, step.preflight_instance)
            continue
        assert step.wake_at is not None
        clock.set(max(clock.now(), step.wake_at))
        step = prov.step(step.job_id)
    if step.handed_over != "sim-1":
        raise RuntimeError(f"the template job was not handed over: {step}")
    jobs.set_phase(TEMPLATE_JOB, "training", detail="on sim-1")

    class Launch:
        def run(self, command: str, *, timeout_s: float = 60.0, max_output_bytes: int = 0) -> CommandResult:
            return CommandResult(0, "", "")

        def put(self, local: Path, remote: str) -> None:
            return None

        def get(self, remote: str, local: Path, *, max_bytes: int | None = None) -> None:
            raise FileNotFoundError(remote)

        def listdir(self, remote: str) -> list[str]:
            raise FileNotFoundError(remote)

        def close(self) -> None:
            return None

    sup = SupervisorService(
        engine,
        provisioning=prov,
        shell_for=lambda _i, _j: Launch(),
        store=LocalArtifactStore(tmp / "template-store"),
        staging=tmp / "template-staging",
        bundle_for=lambda _j: Bundle({"max_steps": 1_000_000}, ()),
        trainer_dir=REPO / "trainer",
        notifier=InMemoryNotifier(),
        triage=lambda _j, _l: None,  # type: ignore[arg-type,return-value]
        jobs=jobs,
    )
    first = sup.poll(TEMPLATE_JOB, sup.arm(TEMPLATE_JOB, "sim-1"))
    if first.detail != "trainer started":
        raise RuntimeError(f"the template's trainer did not start: {first}")
    engine.dispose()


def _clone(dbname: str, n: int) -> dict[str, str]:
    """Copy the template's rows into `n` jobs; drop the template. Returns instance -> rental label."""
    labels: dict[str, str] = {}
    with _pg(dbname) as conn:
        reservation = conn.execute("SELECT id FROM budget_reservations WHERE job = %s", (TEMPLATE_JOB,)).fetchone()[0]
        for table in CLONED_TABLES:
            cur = conn.execute(f'SELECT * FROM "{table}"')
            cols = [d.name for d in cur.description]
            rows = cur.fetchall()
            if not rows:
                continue
            out = []
            for i in range(n):
                subs = (
                    (TEMPLATE_JOB, job_of(i)),
                    ("sim-1", instance_of(i)),
                    ("m-0", machine_of(i)),
                    (reservation, f"res-s{i:05d}"),
                )
                for row in rows:
                    new = []
                    for v in row:
                        if isinstance(v, str):
                            for a, b in subs:
                                v = v.replace(a, b)
                        new.append(v)
                    out.append(new)
                    if table == "rentals":
                        labels[instance_of(i)] = new[cols.index("label")]
            placeholders = ", ".join(["%s"] * len(cols))
            names = ", ".join(f'"{c}"' for c in cols)
            with conn.cursor() as c:
                c.executemany(f'INSERT INTO "{table}" ({names}) VALUES ({placeholders})', out)
            key = "name" if table == "budget_caps" else "id" if table in ("pull_rates", "risk_spans") else None
            if table in ("machine_reputation", "gpu_speed"):
                conn.execute(f"DELETE FROM \"{table}\" WHERE machine_id = 'm-0'")
            elif key == "name":
                conn.execute(f'DELETE FROM "{table}" WHERE name = %s', (TEMPLATE_JOB,))
            elif key == "id":
                conn.execute(f"DELETE FROM \"{table}\" WHERE id = 'sim:sim-1'")
            elif table == "rental_sends":
                conn.execute(f"DELETE FROM \"{table}\" WHERE rental_id LIKE '{TEMPLATE_JOB}:%'")
            elif table in ("budget_reservations", "rentals"):
                conn.execute(f'DELETE FROM "{table}" WHERE job = %s', (TEMPLATE_JOB,))
            else:
                conn.execute(f'DELETE FROM "{table}" WHERE job_id = %s', (TEMPLATE_JOB,))
        conn.execute("VACUUM ANALYZE")
    return labels


@dataclass
class Hosts:
    """Real SSH for a small fleet: one sshd, each job's key authorised, status files kept fresh."""

    sshd: Any
    root: Path
    jobs: list[str]
    frozen: dict[str, float]
    t0: float
    stop: threading.Event

    def refresh(self) -> None:
        while not self.stop.wait(2.0):
            now = time.time()
            for i, job in enumerate(self.jobs):
                at = self.frozen.get(instance_of(i))
                t = at if at is not None and now >= at else now
                status = {
                    "phase": "training",
                    "step": max(1, int((t - self.t0) / STEP_EVERY_S)),
                    "max_steps": 1_000_000,
                    "loss": 1.0,
                    "updated_at": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(t)),
                }
                path = self.root / "tuneharness-jobs" / job / "job" / "status.json"
                tmp = path.with_suffix(".tmp")
                tmp.write_text(json.dumps(status), encoding="utf-8")
                os.replace(tmp, path)


def _real_hosts(n: int, env: dict[str, str], tmp: Path, hangs: dict[str, float], t0: float) -> Hosts:
    from app import bootstrap
    from app.settings import load_settings
    from providers.sim.sshd import Sshd

    s = load_settings(env)
    keys = [bootstrap.job_keypair(job_of(i), s).public_key for i in range(n)]
    work = tmp / "hosts"
    for i in range(n):
        d = work / "tuneharness-jobs" / job_of(i) / "job"
        d.mkdir(parents=True, exist_ok=True)
        (work / "tuneharness-jobs" / job_of(i) / "trainer.pid").write_text(str(os.getpid()))
    sshd = Sshd(tmp / "sshd", "\n".join(keys), workdir=work)
    sshd.start()
    hosts = Hosts(sshd, work, [job_of(i) for i in range(n)], hangs, t0, threading.Event())
    threading.Thread(target=hosts.refresh, daemon=True).start()
    return hosts


def _probe_cost(hosts: Hosts, env: dict[str, str], samples: int = 20) -> dict[str, float]:
    """One real probe as the supervisor makes it: connect, exec the probe command, read, close."""
    from app import bootstrap
    from app.market import Instance, SSHEndpoint
    from app.services.supervisor import _probe_command, remote_job_root
    from app.settings import load_settings

    s = load_settings(env)
    inst = Instance(
        "sim",
        instance_of(0),
        machine_of(0),
        None,
        "running",
        "",
        SSHEndpoint("127.0.0.1", hosts.sshd.port),
        None,
        None,
        None,
    )
    walls, cpus = [], []
    for _ in range(samples):
        w0, c0 = time.perf_counter(), time.process_time()
        shell = bootstrap.host_shell(inst, job_of(0), s)
        try:
            shell.run(_probe_command(remote_job_root(job_of(0))), timeout_s=30)
        finally:
            shell.close()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    return {
        "wall_ms_p50": round(1000 * (_percentile(walls, 50) or 0), 1),
        "client_cpu_ms_p50": round(1000 * (_percentile(cpus, 50) or 0), 1),
    }


# -- measuring -----------------------------------------------------------------------------------
def _cpu_of(pids: Sequence[int]) -> float:
    import psutil

    total = 0.0
    seen: set[int] = set()
    for pid in pids:
        try:
            p = psutil.Process(pid)
            procs = [p, *p.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for q in procs:
            if q.pid in seen:
                continue
            seen.add(q.pid)
            try:
                t = q.cpu_times()
                total += t.user + t.system
            except psutil.NoSuchProcess:
                continue
    return total


@dataclass
class Snapshot:
    at: float
    cpu_python: float
    cpu_redis: float
    cpu_db: float
    redis_calls: int
    rows: int
    ledger_rows: int
    db_bytes: int
    ledger_bytes: int


def _snapshot(py_pids: Sequence[int], redis_pid: int, redis_url: str, dbname: str) -> Snapshot:
    import psutil
    import redis

    r = redis.Redis.from_url(redis_url)
    stats = r.info("commandstats")
    calls = sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")
    with _pg(dbname) as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
        ins, upd, dele = conn.execute(
            "SELECT sum(n_tup_ins), sum(n_tup_upd), sum(n_tup_del) FROM pg_stat_user_tables"
        ).fetchone()
        ledger = conn.execute("SELECT n_tup_ins FROM pg_stat_user_tables WHERE relname = 'ledger_events'").fetchone()[0]
        size = conn.execute("SELECT pg_database_size(current_database())").fetchone()[0]
        lsize = conn.execute("SELECT pg_total_relation_size('ledger_events')").fetchone()[0]
        backends = [
            int(p)
            for (p,) in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchall()
        ]
    db_cpu = 0.0
    for pid in backends:
        try:
            t = psutil.Process(pid).cpu_times()
            db_cpu += t.user + t.system
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return Snapshot(
        at=time.time(),
        cpu_python=_cpu_of(py_pids),
        cpu_redis=_cpu_of([redis_pid]),
        cpu_db=db_cpu,
        redis_calls=calls,
        rows=int(ins or 0) + int(upd or 0) + int(dele or 0),
        ledger_rows=int(ledger or 0),
        db_bytes=int(size),
        ledger_bytes=int(lsize),
    )


def _start(env: dict[str, str], args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as fh:
        return subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "bench.scale_worker", *args],
            env=env,
            cwd=REPO,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def _wait_ready(log: Path, proc: subprocess.Popen[bytes], timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while b"ready." not in log.read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"worker did not start: {log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.2)


def run_one(
    n: int, *, seconds: float, warmup_s: float, workers: int, concurrency: int, real_ssh_max: int
) -> dict[str, Any]:
    """Run N jobs for `seconds` and return what was measured."""
    tmp = Path(tempfile.mkdtemp(prefix=f"th-scale-{n}-"))
    rng = random.Random(n)
    try:
        with _redis(tmp) as (redis_url, redis_proc), _database() as (db_url, dbname):
            env = {
                **os.environ,
                "TUNEHARNESS_HOME": str(tmp / "home"),
                "TUNEHARNESS_DB_URL": db_url,
                "TUNEHARNESS_BROKER_URL": redis_url,
                "HF_HUB_OFFLINE": "1",
                "PYTHONPATH": str(REPO),
            }
            env.pop("TUNEHARNESS_SIM_URL", None)
            (tmp / "home").mkdir()
            t_seed = time.monotonic()
            _seed_template(db_url, tmp)
            labels = _clone(dbname, n)
            seed_s = time.monotonic() - t_seed
            t0 = time.time()
            # losses and hangs at random moments inside the measured window, leaving time to detect them
            lo, hi = t0 + warmup_s, t0 + max(warmup_s + 1.0, seconds - 90.0)
            picked = rng.sample(range(n), max(1, round(n * (LOSS_SHARE + HANG_SHARE))))
            n_loss = max(1, round(n * LOSS_SHARE))
            losses = {instance_of(i): rng.uniform(lo, hi) for i in picked[:n_loss]}
            hangs = {instance_of(i): rng.uniform(lo, hi) for i in picked[n_loss:]}
            edge = n > real_ssh_max
            hosts = None if edge else _real_hosts(n, env, tmp, hangs, t0)
            truth = {
                "n": n,
                "t0": t0,
                "edge": edge,
                "losses": losses,
                "hangs": hangs,
                "labels": labels,
                "dir": str(tmp),
                "ssh": None if hosts is None else {"host": "127.0.0.1", "port": hosts.sshd.port, "user": "root"},
            }
            (tmp / "truth.json").write_text(json.dumps(truth), encoding="utf-8")
            env["TUNEHARNESS_SCALE_TRUTH"] = str(tmp / "truth.json")
            probe = _probe_cost(hosts, env) if hosts is not None else None
            procs = []
            for w in range(workers):
                log = tmp / f"worker-{w}.log"
                p = _start(
                    env,
                    [
                        *("worker", "-Q", "monitor,maintenance", "-c", str(concurrency), "--pool", "prefork"),
                        *("-n", f"scale{w}@%h", "--without-heartbeat", "--without-gossip", "--without-mingle"),
                        *("--loglevel", "INFO"),
                    ],
                    log,
                )
                procs.append(p)
                _wait_ready(log, p)
            beat = _start(env, ["beat", "-s", str(tmp / "beat-schedule"), "--loglevel", "WARNING"], tmp / "beat.log")
            procs.append(beat)
            client = _client(env)
            sent0 = time.time()
            with client.connection_for_write() as conn:
                for i in range(n):
                    client.send_task(
                        "tuneharness.monitor.monitor_training",
                        args=[job_of(i), 2],
                        countdown=rng.uniform(0, POLL_S),
                        queue="monitor",
                        connection=conn,
                    )
            arm_s = time.time() - sent0
            time.sleep(max(0.0, t0 + warmup_s - time.time()))
            before = _snapshot([p.pid for p in procs], redis_proc.pid, redis_url, dbname)
            sweep_at = t0 + warmup_s + (seconds - warmup_s) / 2
            time.sleep(max(0.0, sweep_at - time.time()))
            for verb in SWEEPS:
                client.send_task(f"tuneharness.maintenance.{verb}", queue="maintenance")
            time.sleep(max(0.0, t0 + seconds - time.time()))
            after = _snapshot([p.pid for p in procs], redis_proc.pid, redis_url, dbname)
            backlog = _backlog(redis_url)
            for p in procs:
                _stop(p)
            if hosts is not None:
                hosts.stop.set()
                hosts.sshd.stop()
            detect = _detections(dbname, losses, hangs)
            tasks = _task_lines(tmp)
            log_errors = _log_errors(tmp)
            errors = _errors(dbname)
        return _summarise(
            n=n,
            before=before,
            after=after,
            tasks=tasks,
            detect=detect,
            window=(before.at, after.at),
            workers=workers,
            concurrency=concurrency,
            edge=edge,
            probe=probe,
            seed_s=seed_s,
            arm_s=arm_s,
            backlog=backlog,
            errors=errors,
            log_errors=log_errors,
            injected=(len(losses), len(hangs)),
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _client(env: dict[str, str]) -> Any:
    from celery import Celery

    from app.settings import load_settings
    from workers.config import build_config

    app = Celery("scale-bench")
    app.conf.update(build_config(load_settings(env)))
    return app


def _backlog(redis_url: str) -> dict[str, int]:
    import redis

    r = redis.Redis.from_url(redis_url)
    return {
        "monitor_queued": int(r.llen("monitor")),
        "unacked": int(r.hlen("unacked")),
    }


def _detections(dbname: str, losses: dict[str, float], hangs: dict[str, float]) -> dict[str, Any]:
    with _pg(dbname) as conn:
        rows = conn.execute("SELECT instance, at FROM ledger_events WHERE kind = 'host_lost' ORDER BY seq").fetchall()
    seen: dict[str, float] = {}
    for inst, at in rows:
        if inst is not None and inst not in seen:
            seen[inst] = datetime.fromisoformat(str(at)).timestamp()
    out: dict[str, Any] = {}
    for name, injected in (("loss", losses), ("hang", hangs)):
        delays = [seen[i] - t for i, t in injected.items() if i in seen]
        out[name] = {"injected": len(injected), "detected": len(delays), "delays_s": sorted(delays)}
    return out


def _errors(dbname: str) -> int:
    with _pg(dbname) as conn:
        return int(conn.execute("SELECT count(*) FROM ledger_events WHERE kind = 'supervisor_error'").fetchone()[0])


def _log_errors(tmp: Path) -> dict[str, Any]:
    """Errors the workers and beat logged: how many, and the first one's last lines."""
    count, first = 0, ""
    for f in sorted(tmp.glob("*.log")):
        lines = f.read_text(errors="replace").splitlines()
        for k, line in enumerate(lines):
            if ("ERROR/" in line or "Traceback" in line) and not any(
                x in "".join(lines[k : k + 40]) for x in ("WorkerShutdown", "signal 15 (SIGTERM)")
            ):
                count += 1
                if not first:
                    first = f.name + ": " + " | ".join(lines[k : k + 40])[-1500:]
    return {"count": count, "first": first}


def _task_lines(tmp: Path) -> list[dict[str, Any]]:
    out = []
    for f in tmp.glob("tasks-*.jsonl"):
        for line in f.read_text(encoding="utf-8").splitlines():
            if line.strip():
                out.append(json.loads(line))
    return out


def capacity(due_per_s: float, cpu_s_per_poll: float | None, wall_s_per_poll: float | None) -> dict[str, int] | None:
    """What keeps the lag bounded at `due_per_s` polls a second, each at 70% use: cores (CPU per poll,
    workers, Redis and PostgreSQL together) and pollers (worker children polling at once: a poll waits
    on the database and the host for most of its wall time)."""
    if not cpu_s_per_poll or not wall_s_per_poll:
        return None
    return {
        "cores": math.ceil(due_per_s * cpu_s_per_poll / 0.7),
        "pollers": math.ceil(due_per_s * wall_s_per_poll / 0.7),
    }


def _summarise(
    *,
    n: int,
    before: Snapshot,
    after: Snapshot,
    tasks: list[dict[str, Any]],
    detect: dict[str, Any],
    window: tuple[float, float],
    workers: int,
    concurrency: int,
    edge: bool,
    probe: dict[str, float] | None,
    seed_s: float,
    arm_s: float,
    backlog: dict[str, int],
    errors: int,
    log_errors: dict[str, Any],
    injected: tuple[int, int],
) -> dict[str, Any]:
    lo, hi = window
    span_s = hi - lo
    job_hours = n * span_s / 3600.0
    job_minutes = n * span_s / 60.0
    polls = [t for t in tasks if t["task"].endswith("monitor_training") and t["start"] and lo <= t["start"] <= hi]
    lags = [t["start"] - t["due"] for t in polls if t.get("due")]
    run_s = [t["end"] - t["start"] for t in polls]
    poll_cpu = [t["cpu"] for t in polls if t.get("cpu") is not None]
    sweep_cpu = sum(
        t.get("cpu") or 0.0 for t in tasks if ".maintenance." in t["task"] and lo <= (t["start"] or 0) <= hi
    )
    # Polls due inside the window that never started by its end: their lag is at least (end - due).
    sweeps: dict[str, float] = {}
    for t in tasks:
        if ".maintenance." in t["task"] and t["start"]:
            name = t["task"].rsplit(".", 1)[-1]
            sweeps[name] = max(sweeps.get(name, 0.0), t["end"] - t["start"])
    cpu_py = after.cpu_python - before.cpu_python
    cpu_all = cpu_py + (after.cpu_redis - before.cpu_redis) + (after.cpu_db - before.cpu_db)
    poll_rate = len(polls) / span_s if span_s > 0 else 0.0
    cpu_per_poll = cpu_all / len(polls) if polls else None
    needed_rate = n / POLL_S
    procs_needed = capacity(needed_rate, cpu_per_poll, _percentile(run_s, 50))
    loss = detect["loss"]
    hang = detect["hang"]
    return {
        "n": n,
        "transport": "edge" if edge else "ssh",
        "window_s": round(span_s, 1),
        "workers": workers,
        "concurrency": concurrency,
        "seed_s": round(seed_s, 1),
        "arm_s": round(arm_s, 2),
        "polls": len(polls),
        "polls_per_s": round(poll_rate, 2),
        "polls_needed_per_s": round(needed_rate, 2),
        "poll_run_ms_p50": round(1000 * (_percentile(run_s, 50) or 0), 1),
        "poll_task_cpu_ms_mean": round(1000 * sum(poll_cpu) / len(poll_cpu), 2) if poll_cpu else None,
        "sweeps_task_cpu_s": round(sweep_cpu, 2),
        "cpu_s_python": round(cpu_py, 2),
        "cpu_s_redis": round(after.cpu_redis - before.cpu_redis, 2),
        "cpu_s_db": round(after.cpu_db - before.cpu_db, 2),
        "cpu_s_per_job_hour": round(cpu_all / job_hours, 3),
        "cpu_ms_per_poll": None if cpu_per_poll is None else round(1000 * cpu_per_poll, 2),
        "redis_cmds_per_job_minute": round((after.redis_calls - before.redis_calls) / job_minutes, 2),
        "db_rows_per_job_hour": round((after.rows - before.rows) / job_hours, 1),
        "ledger_rows_per_job_hour": round((after.ledger_rows - before.ledger_rows) / job_hours, 2),
        "db_kib_per_job_hour": round((after.db_bytes - before.db_bytes) / 1024 / job_hours, 2),
        "ledger_kib_per_job_hour": round((after.ledger_bytes - before.ledger_bytes) / 1024 / job_hours, 2),
        "lag_s_p50": None if not lags else round(_percentile(lags, 50) or 0, 2),
        "lag_s_p99": None if not lags else round(_percentile(lags, 99) or 0, 2),
        "loss_detect_s_p99": None if not loss["delays_s"] else round(_percentile(loss["delays_s"], 99) or 0, 1),
        "losses": f"{loss['detected']}/{injected[0]}",
        "hang_detect_s_p99": None if not hang["delays_s"] else round(_percentile(hang["delays_s"], 99) or 0, 1),
        "hangs": f"{hang['detected']}/{injected[1]}",
        "longest_sweep_s": round(max(sweeps.values()), 2) if sweeps else None,
        "longest_sweep": max(sweeps, key=lambda k: sweeps[k]) if sweeps else None,
        "sweeps_s": {k: round(v, 3) for k, v in sorted(sweeps.items())},
        "processes_needed": procs_needed,
        "backlog": backlog,
        "supervisor_errors": errors,
        "log_errors": log_errors,
        "probe": probe,
    }


# -- the report ----------------------------------------------------------------------------------
MEASURES = (
    ("cpu_s_per_job_hour", "CPU s / job-hour"),
    ("redis_cmds_per_job_minute", "Redis cmds / job-min"),
    ("db_rows_per_job_hour", "DB rows / job-hour"),
    ("db_kib_per_job_hour", "DB KiB / job-hour"),
)


def at_due_rate(run: dict[str, Any]) -> dict[str, Any]:
    """The run's per-job measures as if every job were polled when due (N / 30 polls a second): what
    was measured per poll done, times the polls due. Where the fleet kept up this is what was
    measured; where it fell behind, the per-job-hour figures alone would hide the cost of the polls
    that never ran."""
    out = dict(run)
    polls = run.get("polls") or 0
    if not polls or "window_s" not in run:
        return out
    done_per_job_hour = polls / (run["n"] * run["window_s"] / 3600.0)
    due_per_job_hour = 3600.0 / POLL_S
    for key in ("cpu_s_per_job_hour", "db_rows_per_job_hour", "db_kib_per_job_hour", "ledger_rows_per_job_hour"):
        if run.get(key) is not None:
            out[key] = round(run[key] / done_per_job_hour * due_per_job_hour, 3)
    if run.get("redis_cmds_per_job_minute") is not None:
        out["redis_cmds_per_job_minute"] = round(
            run["redis_cmds_per_job_minute"] / done_per_job_hour * due_per_job_hour, 3
        )
    return out


def exponent(runs: Sequence[dict[str, Any]], key: str) -> float | None:
    """The growth exponent of a per-job measure's total (per-job value x N) against N, least squares
    on the logs; 1.0 is flat cost per job."""
    pts = [(math.log(r["n"]), math.log(r[key] * r["n"])) for r in runs if r.get(key)]
    if len(pts) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    den = sum((x - mx) ** 2 for x, _ in pts)
    return None if den == 0 else round(sum((x - mx) * (y - my) for x, y in pts) / den, 2)


def _needed(run: dict[str, Any]) -> str | None:
    """`cores / pollers` (`capacity`), recomputed from the run's measured poll cost."""
    got = capacity(
        run["polls_needed_per_s"],
        None if run.get("cpu_ms_per_poll") is None else run["cpu_ms_per_poll"] / 1000.0,
        None if not run.get("poll_run_ms_p50") else run["poll_run_ms_p50"] / 1000.0,
    )
    return None if got is None else f"{got['cores']} / {got['pollers']}"


def tables(runs: list[dict[str, Any]], *, design: str = "") -> list[dict[str, Any]]:
    runs = [at_due_rate(r) for r in runs]
    cols = [
        "N",
        "probe",
        "CPU s / job-hour",
        "CPU ms / poll",
        "worker CPU ms / poll task",
        "Redis cmds / job-min",
        "DB rows / job-hour",
        "ledger rows / job-hour",
        "DB KiB / job-hour",
        "lag p50 s",
        "lag p99 s",
        "loss detect p99 s",
        "hang detect p99 s",
        "longest sweep s",
        "polls / s done / due",
        "needed: cores / pollers",
    ]
    rows = []
    for r in runs:
        rows.append(
            [
                r["n"],
                r["transport"],
                r["cpu_s_per_job_hour"],
                r["cpu_ms_per_poll"],
                r.get("poll_task_cpu_ms_mean"),
                r["redis_cmds_per_job_minute"],
                r["db_rows_per_job_hour"],
                r["ledger_rows_per_job_hour"],
                r["db_kib_per_job_hour"],
                r["lag_s_p50"],
                r["lag_s_p99"],
                r["loss_detect_s_p99"],
                r["hang_detect_s_p99"],
                f"{r['longest_sweep_s']} ({r['longest_sweep']})",
                f"{r['polls_per_s']} / {r['polls_needed_per_s']}",
                _needed(r),
            ]
        )
    exps = [[label, exponent(runs, key)] for key, label in MEASURES]
    knee = next((r for r in runs if r["polls_per_s"] < 0.95 * r["polls_needed_per_s"]), None)
    if knee is None:
        verdict = "Every N kept up: the knee is above the largest N measured. "
    else:
        verdict = (
            f"The knee: at N={knee['n']} the worker did {knee['polls_per_s']} of {knee['polls_needed_per_s']} "
            "due polls a second and the lag grew without bound. "
        )
    big = max(runs, key=lambda r: r["n"])
    task_ms = big.get("poll_task_cpu_ms_mean")
    verdict += f"{big['n']} jobs need {_needed(big)} (cores / pollers) by its row"
    if task_ms:
        procs = math.ceil(big["polls_needed_per_s"] * task_ms / 1000.0 / 0.7)
        verdict += (
            f"; the worker children's own {task_ms} ms a poll alone keeps {procs} worker processes "
            "busy (one core each), PostgreSQL and the sweeps beside them"
        )
    verdict += ". "
    probe = next((r["probe"] for r in runs if r.get("probe")), None)
    note = verdict + (
        f"One worker ({runs[0]['workers']} process x {runs[0]['concurrency']} children) and beat per N, "
        f"{runs[0]['window_s']:.0f} s measured after warm-up. CPU counts the workers, beat, the private Redis and "
        "this database's PostgreSQL backends. Per-job figures are per poll done times the polls due (one per job "
        "every 30 s), sweeps included: where polls fell behind, that is what keeping up would cost. "
        "Worker CPU ms / poll task: the worker child's own CPU inside one monitor task (no sweeps, no database). "
        "'edge': probes answered at the SSH port's edge; "
    )
    if probe:
        note += (
            f"a real probe (connect, exec, read, close) measured {probe['wall_ms_p50']} ms wall and "
            f"{probe['client_cpu_ms_p50']} ms of client CPU (p50), which adds that much CPU per poll on top of "
            "the edge rows. "
        )
    note += (
        "Needed, to keep the lag bounded at N/30 polls a second: cores = polls due per second x CPU per poll / 0.7; "
        "pollers (worker children, across processes and machines) = polls due per second x wall time per poll / 0.7."
    )
    found = ", ".join(f"{r['losses']} lost and {r['hangs']} hung at N={r['n']}" for r in runs if "losses" in r)
    note += (
        f" Detected inside the window: {found}; the p99s count only those, so where polls fell behind they "
        "understate the wait."
    )
    growth = "; ".join(f"{label} {'n/a' if e is None else e}" for label, e in exps)
    note += (
        f" Growth exponents (least squares on log total against log N; 1.0 is a flat cost per job, the target "
        f"at most 1.1): {growth}."
    )
    return [_results.table("Control plane at scale" + design, cols, rows, note=note)]


def _panel(
    x0: float, title: str, ns: list[int], series: list[tuple[str, list[float | None]]], *, w: float, h: float
) -> list[str]:
    """One chart: lines against N (log scale) from `x0`, its y axis from 0 to the largest value."""
    pad, colours = 45.0, ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"]
    lx0, lx1 = math.log10(min(ns)), math.log10(max(ns))
    lx1 = lx1 if lx1 > lx0 else lx0 + 1
    ymax = max([1.0, *[y for _, ys in series for y in ys if y]]) * 1.15

    def px(n: float) -> float:
        return x0 + pad + (math.log10(n) - lx0) / (lx1 - lx0) * (w - 2 * pad)

    def py(v: float) -> float:
        return h - pad - v / ymax * (h - 2 * pad)

    out = [
        f'<text x="{x0 + pad}" y="20" font-weight="bold">{title}</text>',
        f'<line x1="{x0 + pad}" y1="{h - pad}" x2="{x0 + w - pad}" y2="{h - pad}" stroke="black"/>',
        f'<line x1="{x0 + pad}" y1="{pad}" x2="{x0 + pad}" y2="{h - pad}" stroke="black"/>',
        f'<text x="{x0 + w / 2}" y="{h - 8}" text-anchor="middle">jobs N (log scale)</text>',
    ]
    out += [f'<text x="{px(n):.1f}" y="{h - pad + 14}" text-anchor="middle">{n}</text>' for n in ns]
    out += [
        f'<text x="{x0 + pad - 4}" y="{py(v) + 4:.1f}" text-anchor="end">{v:.3g}</text>'
        for v in (0.0, ymax / 2, ymax / 1.15)
    ]
    for k, (label, ys) in enumerate(series):
        c = colours[k % len(colours)]
        pts = [(px(n), py(y)) for n, y in zip(ns, ys, strict=True) if y is not None]
        if len(pts) > 1:
            out.append(
                f'<polyline fill="none" stroke="{c}" stroke-width="2" points="'
                + " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
                + '"/>'
            )
        out += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{c}"/>' for x, y in pts]
        out.append(f'<text x="{x0 + pad + 8}" y="{pad + 4 + 14 * k}" fill="{c}">{label}</text>')
    return out


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    """A hand-written SVG, two charts against N: each per-job cost as a multiple of its value at the
    smallest N (flat is 1), and the poll lag and loss detection p99 in seconds."""
    runs = [at_due_rate(r) for r in runs]
    ns = [r["n"] for r in runs]
    costs: list[tuple[str, list[float | None]]] = []
    for key, label in MEASURES:
        base = runs[0].get(key)
        costs.append((label + " (x)", [r[key] / base if base and r.get(key) else None for r in runs]))
    times: list[tuple[str, list[float | None]]] = [
        ("poll lag p99 s", [r.get("lag_s_p99") for r in runs]),
        ("loss detect p99 s", [r.get("loss_detect_s_p99") for r in runs]),
    ]
    w, h = 400.0, 300.0
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * w:.0f}" height="{h:.0f}" font-family="sans-serif" '
        'font-size="11">',
        f'<rect width="{2 * w:.0f}" height="{h:.0f}" fill="white"/>',
        *_panel(0.0, f"per-job cost / cost at N={ns[0]}", ns, costs, w=w, h=h),
        *_panel(w, "seconds", ns, times, w=w, h=h),
        "</svg>",
    ]
    path.write_text("\n".join(out) + "\n", encoding="utf-8")


def rerender(path: Path, *, design: str = "") -> int:
    """Rewrite a results file's tables from the runs in its `raw`; nothing is measured again."""
    if not path.is_file():
        print(f"error: {path} does not exist. Fix: run bench/scale.py first, or pass its results file")
        return 2
    doc = json.loads(path.read_text(encoding="utf-8"))
    runs = (doc.get("raw") or {}).get("runs")
    if doc.get("bench", "").split("_")[0] != "scale" or not runs:
        print(f"error: {path} holds no scale runs. Fix: pass a file bench/scale.py wrote")
        return 2
    doc["tables"] = tables(runs, design=design)
    path.write_text(_results.to_json(doc) + "\n", encoding="utf-8")
    if path.name == "scale.json":
        plot(runs, REPO / "docs" / "scale.svg")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, nargs="+", default=None, help="fleet sizes (default 100 1000 5000 10000)")
    ap.add_argument("--quick", action="store_true", help="N = 100 and 1000 only")
    ap.add_argument("--seconds", type=float, default=180.0, help="wall seconds per N, warm-up included")
    ap.add_argument("--warmup", type=float, default=45.0, help="seconds before measuring")
    ap.add_argument("--workers", type=int, default=1, help="worker processes (Celery nodes)")
    ap.add_argument("--concurrency", type=int, default=2, help="children per worker")
    ap.add_argument("--real-ssh-max", type=int, default=100, help="largest N probed over real SSH")
    ap.add_argument("--no-write", action="store_true", help="print, do not write bench/results/scale.json")
    ap.add_argument(
        "--render",
        metavar="FILE",
        help="only re-render FILE's tables (and, for scale.json, the plot) from the runs it recorded",
    )
    ap.add_argument("--design", default="", help="with --render: words added to the tables' titles")
    a = ap.parse_args(argv)
    if a.render:
        return rerender(Path(a.render), design=a.design)
    ns = a.n or ([100, 1000] if a.quick else [100, 1000, 5000, 10000])
    if any(n < 1 for n in ns) or a.workers < 1 or a.concurrency < 1:
        print("error: --n, --workers and --concurrency take whole numbers of at least 1. Fix: e.g. --n 100 1000")
        return 2
    if a.seconds <= a.warmup + 30:
        print("error: --seconds must exceed --warmup by at least 30. Fix: e.g. --seconds 180 --warmup 45")
        return 2
    started = _results.start()
    runs = []
    for n in ns:
        r = run_one(
            n,
            seconds=a.seconds,
            warmup_s=a.warmup,
            workers=a.workers,
            concurrency=a.concurrency,
            real_ssh_max=a.real_ssh_max,
        )
        print(json.dumps({k: v for k, v in r.items() if k != "sweeps_s"}), flush=True)
        runs.append(r)
    if a.no_write:
        return 0
    plot(runs, REPO / "docs" / "scale.svg")
    _results.write("scale", tables(runs), started=started, raw={"runs": runs})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
