"""Broker faults through real Celery workers, a real redis-server and the Vast HTTP fake on loopback.

- Redis killed and restarted (same port, same append-only file) while jobs wait on their boot-watch
  wake-ups: the workers consume again, the jobs whose messages the restart stranded are re-driven by
  `redrive`, and every rental is created once at the vendor.
- The worker cut off from Redis (a TCP proxy between them, its connections reset) while its create
  waits at the vendor: Celery puts the message back, another worker runs it and must not create again.

Redis persists as docker-compose.yml runs it (append-only file, fsync every second): what Redis
acknowledged before SIGKILL survives the restart, and so do the messages a worker held unacknowledged
(they come back only after the visibility timeout, two hours; `redrive` is what steps their jobs).
A worker whose broker vanishes may exit (kombu fails to restore its unacknowledged messages to a dead
server, "Unrecoverable error"); the deployment restarts it (`restart: unless-stopped`), and so does
the test (`SupervisedWorker`).
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import redis
from sqlalchemy import Engine

from app.db import init_db, make_engine
from app.market import LaunchSpec, OfferQuery
from app.rentals import Rentals
from app.services.guardrails import sweep_reconcile
from app.settings import load_settings
from providers.fakes import FakeVast
from providers.fakes.base import Reply
from providers.vast import VastMarket
from support.faultlab import record, rounds
from support.services import CeleryWorker, celery_client, free_port, wait_until
from support.tcpproxy import TcpProxy

REPO = Path(__file__).resolve().parents[3]
SPEC = LaunchSpec(image="img", disk_gb=20, label="", ssh_public_key="ssh-ed25519 AAAA t")
CREATE = "/api/v0/asks/"


class HeldVast(FakeVast):
    """Vast whose creates wait at the door while `open` is clear (a slow vendor), so that a test can
    break things while a create is in flight; `arrived` counts the creates that reached the door."""

    def __init__(self) -> None:
        super().__init__(offers=[])
        self.open = threading.Event()
        self.open.set()
        self.arrived = 0

    def handle(self, method: str, raw_path: str, headers: dict[str, str], raw_body: bytes) -> Reply:
        if method == "PUT" and raw_path.startswith(CREATE):
            with self.lock:
                self.arrived += 1
            self.open.wait(timeout=60)
        return super().handle(method, raw_path, headers, raw_body)


def _creates(vast: FakeVast) -> int:
    return sum(1 for c in vast.calls_to(CREATE) if c.method == "PUT")


def _plan(rentals: Rentals, vast: FakeVast, market: VastMarket, job: str) -> str:
    oid = vast.add_offer()
    offer = next(o for o in market.search_offers(OfferQuery(limit=1000)) if o.offer_id == oid)
    return rentals.plan(
        job=job,
        attempt=1,
        offer=offer,
        disk_gb=20,
        ttl_s=3600,
        now=time.time(),
        reserve_usd=1.0,
        budget_name="default",
        spec=SPEC,
    ).id


def _settled(broker_url: str) -> bool:
    """Every message delivered and acknowledged: nothing queued, nothing held unacknowledged (B's
    retry, with its countdown, is held by whichever worker took it until it ran)."""
    r = redis.Redis.from_url(broker_url)
    return r.llen("provision") == 0 and r.hlen("unacked") == 0


def _rentals(env: dict[str, str]) -> Rentals:
    engine = make_engine(load_settings(env).db_url)
    init_db(engine)
    rentals = Rentals(engine)
    rentals.budget.set_cap("default", 1000.0)
    return rentals


def _cut_off_during_create(
    rid: str, env: dict[str, str], *, vast: HeldVast, proxy: TcpProxy, worker_a: CeleryWorker
) -> float:
    """Send `rid`'s rent task; once worker A's create waits at the vendor, start worker B and cut A off
    from Redis; B must run the redelivered message and back off without a create. Seconds from the cut
    to the redelivery."""
    vast.open.clear()
    arrived, creates = vast.arrived, _creates(vast)
    celery_client(env).send_task("tuneharness.provision.rent", args=[rid], queue="provision")
    assert wait_until(lambda: vast.arrived > arrived, timeout_s=60), worker_a.log.read_text()[-2000:]
    # A is inside the create; B is up, idle, straight on Redis
    worker_b = CeleryWorker.start(env, cwd=REPO, queues="provision", name="elsewhere", app="support.rent_task")
    try:
        cut_at = time.time()
        proxy.cut()  # A's connections reset: Celery restores A's unacknowledged message
        proxy.restore()
        assert wait_until(lambda: b"received" in worker_b.log.read_bytes(), timeout_s=60), worker_a.log.read_text()[
            -3000:
        ]
        redelivered_s = time.time() - cut_at
        # B ran the create step while A's create still waits at the vendor: B must back off
        assert wait_until(lambda: b"retry" in worker_b.log.read_bytes(), timeout_s=60), worker_b.log.read_text()[-3000:]
        assert vast.arrived == arrived + 1 and _creates(vast) == creates, "B sent a second create"
        vast.open.set()
        assert wait_until(lambda: _settled(env["TUNEHARNESS_BROKER_URL"]), timeout_s=90), worker_b.log.read_text()[
            -3000:
        ]
    finally:
        vast.open.set()
        worker_b.stop()
    return redelivered_s


@pytest.mark.faults
@pytest.mark.slow
def test_a_worker_cut_off_from_redis_during_a_create_never_lets_a_redelivery_create_again(
    th_env: dict[str, str],
) -> None:
    """Worker A reaches Redis through a proxy that is cut while A's create waits at the vendor; Celery
    puts the unacknowledged message back and worker B runs it while A still holds the create: B sends
    no second create, and each rental ends created once, with nothing at the vendor left unknown."""
    n = rounds(ci=1, full=5)
    broker = th_env["TUNEHARNESS_BROKER_URL"]
    port, db = int(broker.rsplit(":", 1)[1].split("/")[0]), broker.rsplit("/", 1)[1]
    redelivered_s: list[float] = []
    vast = HeldVast()
    with vast, TcpProxy("127.0.0.1", port) as proxy:
        env = {**th_env, "VAST_API_URL": vast.url, "VAST_API_KEY": vast.api_key, "TUNEHARNESS_PROVIDER_BACKOFF_S": "0"}
        rentals = _rentals(env)
        market = VastMarket(api_key=vast.api_key, api_url=vast.url)
        worker_a = CeleryWorker.start(
            {**env, "TUNEHARNESS_BROKER_URL": f"redis://127.0.0.1:{proxy.port}/{db}"},
            cwd=REPO,
            queues="provision",
            name="cutoff",
            app="support.rent_task",
        )
        ids: list[str] = []
        try:
            for k in range(n):
                rid = _plan(rentals, vast, market, f"cut{k}")
                ids.append(rid)
                redelivered_s.append(_cut_off_during_create(rid, env, vast=vast, proxy=proxy, worker_a=worker_a))
                r = rentals.get(rid)
                assert r is not None and r.state == "active" and r.instance_id in vast.instances
        finally:
            vast.open.set()
            worker_a.stop()
        creates = _creates(vast)
        assert creates == n and vast.arrived == n
        for rid in ids:
            r = rentals.get(rid)
            assert r is not None and len(rentals.ledger.rows(job=r.job, kind="instance_created")) == 1
            assert [i.instance_id for i in market.list_instances(r.label)] == [r.instance_id]
        report = sweep_reconcile(rentals, {"vast": market}, now=time.time() + 3600, orphan_grace_s=0)
        assert report.stopped == [] and report.adopted == [] and report.lost == []
        assert rentals.ledger.verify().ok
    record(
        "worker_cut_off_from_redis_during_create",
        criterion="a worker cut off from Redis mid-create and its message run again elsewhere: one create per rental",
        rounds=n,
        rentals=len(ids),
        redeliveries=len(redelivered_s),
        vendor_creates=creates,
        duplicate_creates=creates - len(ids),
        redelivered_after_cut_s=[round(x, 2) for x in redelivered_s],
    )


# -- Redis restarted with work in flight ----------------------------------------------------------------

JOBS_PER_RESTART = 2
# A live chain wakes its job at its wake-up (plus queue latency); a job this far past it has lost its task.
LOST_AFTER_S = 8.0


def _redis_server(port: int, data_dir: Path) -> subprocess.Popen[bytes]:
    """redis-server persisting as the deployment's does (docker-compose.yml: append-only file, fsync
    every second, no eviction), on `port` with its files in `data_dir`."""
    proc = subprocess.Popen(
        ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--dir", str(data_dir),
         "--appendonly", "yes", "--appendfsync", "everysec", "--save", "", "--maxmemory-policy", "noeviction"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip

    def up() -> bool:
        try:
            return bool(redis.Redis(port=port, socket_connect_timeout=0.2).ping())
        except redis.RedisError:
            return False

    assert wait_until(up, timeout_s=30), "redis-server did not start"
    return proc


class SupervisedWorker:
    """A worker started again whenever it exits, as the deployment's `restart: unless-stopped` does."""

    def __init__(self, env: dict[str, str], *, queues: str, concurrency: int) -> None:
        self.env, self.queues, self.concurrency = env, queues, concurrency
        self.current: CeleryWorker | None = None
        self.starts = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._supervise, name="supervised-worker", daemon=True)

    def start(self) -> SupervisedWorker:
        self._thread.start()
        assert wait_until(lambda: self.current is not None, timeout_s=120), "the worker never became ready"
        return self

    def _supervise(self) -> None:
        while not self._stop.is_set():
            try:
                worker = CeleryWorker.start(
                    self.env, cwd=REPO, queues=self.queues, concurrency=self.concurrency, name="restarted"
                )
            except RuntimeError:  # the broker is still down: try again, as a restart policy does
                self._stop.wait(1.0)
                continue
            self.current, self.starts = worker, self.starts + 1
            while worker.proc.poll() is None and not self._stop.is_set():
                self._stop.wait(0.2)
            if self._stop.is_set():
                worker.stop()

    def logs(self, tail: int = 3000) -> str:
        return "" if self.current is None else self.current.log.read_text(errors="replace")[-tail:]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        if self.current is not None:
            self.current.stop()


def _states(engine: Engine) -> dict[str, tuple[int, float | None]]:
    """job -> (state version, wake-up) of every provisioning job."""
    from sqlalchemy import select

    from app.services.provisioning.state import ProvisioningStateRow

    t = ProvisioningStateRow.__table__  # type: ignore[attr-defined]
    with engine.connect() as conn:
        return {
            r.job_id: (int(r.version), r.wake_at) for r in conn.execute(select(t.c.job_id, t.c.version, t.c.wake_at))
        }


def _pass_redrive_grace(engine: Engine, jobs: list[str]) -> None:
    """Move these jobs' wake-ups back by redrive's grace: ten minutes pass for them, not for the test."""
    from sqlalchemy import update

    from app.services.provisioning.state import ProvisioningStateRow
    from workers.provisioning import REDRIVE_GRACE_S

    t = ProvisioningStateRow.__table__  # type: ignore[attr-defined]
    with engine.begin() as conn:
        conn.execute(update(t).where(t.c.job_id.in_(jobs)).values(wake_at=t.c.wake_at - REDRIVE_GRACE_S - 1))


class RedisRestarts:
    """Jobs provisioning on the Vast fake through a supervised worker, and the Redis under them killed."""

    def __init__(self, env: dict[str, str], server: subprocess.Popen[bytes], port: int, data_dir: Path) -> None:
        from app.jobs import JobStore

        self.env, self.server, self.port, self.data_dir = env, server, port, data_dir
        self.broker = env["TUNEHARNESS_BROKER_URL"]
        self.rentals = _rentals(env)
        self.jobs = JobStore(self.rentals.engine)
        self.client = celery_client(env)
        self.worker = SupervisedWorker(env, queues="provision,maintenance", concurrency=2)

    def states(self) -> dict[str, tuple[int, float | None]]:
        return _states(self.rentals.engine)

    def booting(self, jobs: list[str]) -> bool:
        """Each job has its instance and waits on a boot-watch wake-up."""
        st = self.states()
        return all(j in st and st[j][1] is not None and self.rentals.all(job=j, states=("active",)) for j in jobs)

    def stepped_or_lost(self, jobs: list[str], before: dict[str, tuple[int, float | None]]) -> bool:
        now, st = time.time(), self.states()
        return all(st[j][0] > before[j][0] or (st[j][1] or now) < now - LOST_AFTER_S for j in jobs)

    def once(self, jobs: list[str]) -> tuple[float, list[str]]:
        """Provision `jobs`, kill Redis while they wait on their boot watches, start it again: (seconds
        from Redis back to a task consumed, the jobs whose wake-ups the restart stranded, re-driven)."""
        for job_id in jobs:
            self.client.send_task("tuneharness.provision.provision", args=[job_id], queue="provision")
        assert wait_until(lambda: self.booting(jobs), timeout_s=120), self.worker.logs()
        # the boot watches' countdowns are held by the worker, unacknowledged, when Redis dies
        assert wait_until(lambda: redis.Redis.from_url(self.broker).hlen("unacked") >= len(jobs), timeout_s=60)
        before = self.states()
        self.server.kill()
        self.server.wait(timeout=10)
        assert wait_until(lambda: "Connection to broker lost" in self.worker.logs(tail=10**6), timeout_s=60)
        self.server = _redis_server(self.port, self.data_dir)
        up_at = time.time()
        self.client.send_task("tuneharness.maintenance.ping", args=["back"], queue="maintenance").get(timeout=60)
        resume_s = time.time() - up_at
        assert wait_until(lambda: self.stepped_or_lost(jobs, before), timeout_s=120)
        st = self.states()
        lost = sorted(j for j in jobs if st[j][0] == before[j][0])
        if lost:
            _pass_redrive_grace(self.rentals.engine, lost)
            sent = self.client.send_task("tuneharness.maintenance.redrive", queue="maintenance").get(timeout=120)
            assert sorted(sent["watch_boot"]) == lost
            assert wait_until(lambda: all(self.states()[j][0] > before[j][0] for j in lost), timeout_s=120), (
                self.worker.logs()
            )
        return resume_s, lost

    def close(self) -> None:
        self.worker.stop()
        self.server.kill()
        self.server.wait(timeout=10)


@pytest.mark.faults
@pytest.mark.slow
def test_redis_restarted_with_jobs_in_flight_resumes_redrives_the_stranded_and_rents_once(
    th_env: dict[str, str], tmp_path: Path
) -> None:
    """Jobs wait on their boot-watch wake-ups (messages the worker holds) when Redis is killed with
    SIGKILL and started again on its port and files: a task sent after the restart runs within 60 s,
    each job is stepped again (by its own chain or, stranded, by `redrive`), and the vendor sees one
    create per rental."""
    from app.jobs import parse_job_text
    from app.ledger import Ledger
    from providers.fakes.vast import sample_vast_offers
    from support.jobfiles import train_section

    n = rounds(ci=1, full=5)
    port, data_dir = free_port(), tmp_path / "redis-data"
    data_dir.mkdir()
    needs = "needs:\n  gpu: [RTX 3090, RTX 4090]\n  providers: [vast]\n  disk_gb: 20\n  download_gb: 3\n"
    job_text = train_section() + needs + "  train_hours: 0.05\nbudget_usd: 5.0\n"
    resume_s: list[float] = []
    stranded: list[str] = []
    vast = FakeVast(offers=sample_vast_offers())
    with vast:
        env = {**th_env, "TUNEHARNESS_BROKER_URL": f"redis://127.0.0.1:{port}/0", "VAST_API_URL": vast.url,
               "VAST_API_KEY": vast.api_key, "TUNEHARNESS_PROVIDER_BACKOFF_S": "0"}  # fmt: skip
        fleet = RedisRestarts(env, _redis_server(port, data_dir), port, data_dir)
        try:
            fleet.worker.start()
            for k in range(n):
                for _ in range(4 * JOBS_PER_RESTART):  # hosts that never boot are replaced: offers to spare
                    vast.add_offer()
                text = parse_job_text(f"name: r{k}\n{job_text}", check_files=False)
                took_s, lost = fleet.once([fleet.jobs.add(text) for _ in range(JOBS_PER_RESTART)])
                resume_s.append(took_s)
                stranded += lost
        finally:
            fleet.close()
        ledger = Ledger(fleet.rentals.engine)
        redriven = sorted(e.job or "" for e in ledger.rows(kind="job_redriven"))
        labels = Counter(c.body.get("label") for c in vast.calls_to(CREATE) if isinstance(c.body, dict))
        at_vendor = {iid: rec.get("label") for iid, rec in vast.instances.items()}
        recorded = {r.instance_id: r.label for r in fleet.rentals.all() if r.instance_id is not None}
    assert redriven == sorted(stranded)
    assert all(k == 1 for k in labels.values()), f"creates sent twice for one rental: {labels}"
    assert at_vendor == recorded  # each instance at the vendor is one rental's, each rental has one
    assert ledger.verify().ok
    record(
        "redis_restarted_with_jobs_in_flight",
        criterion="Redis killed and restarted with jobs in flight: consumption resumes within 60 s, stranded jobs "
        "are re-driven, one vendor create per rental",
        rounds=n,
        jobs=n * JOBS_PER_RESTART,
        resume_s=[round(x, 2) for x in resume_s],
        resume_s_max=round(max(resume_s), 2),
        stranded_jobs=len(stranded),
        redriven_jobs=len(redriven),
        worker_starts=fleet.worker.starts,
        vendor_creates=sum(labels.values()),
        duplicate_creates=sum(k - 1 for k in labels.values()),
    )
