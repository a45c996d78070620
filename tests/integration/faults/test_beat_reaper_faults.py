"""Beat and reaper faults through real Celery beats and workers, real Redis and the Vast HTTP fake.

- Ten reapers at once over twenty expired instances: each is stopped once at the vendor.
- Two beats, the lock holder killed: another beat takes over, one heartbeat send per interval.
- Beat frozen (SIGSTOP) for three reaper intervals: the workers raise `beat_overdue`; it reaps on SIGCONT.
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pytest
import redis

from app.market import LaunchSpec
from app.rentals import Rentals
from beat_schedule import period_s
from providers.fakes import FakeVast
from providers.vast import VastMarket
from support.faultlab import full_scale, record, rounds
from support.services import CeleryWorker, celery_client, wait_until
from tests.integration.guardrails.test_sweeps_fleet import _offer, fleet  # noqa: F401  (the fixture, reused)
from workers.beatlock import LOCK_KEY, LOCK_TTL_S

REPO = Path(__file__).resolve().parents[3]
SPEC = LaunchSpec(image="img", disk_gb=20, label="", ssh_public_key="ssh-ed25519 AAAA t")
REAPERS = 10
ORPHANS = 20
SCALE = 60.0  # TUNEHARNESS_SIM_SCALE for the two beats: the heartbeat's 60 s period passes in one second
FROZEN_SCALE = 100.0  # and for the frozen beat: the reaper's five minutes pass in three seconds


def _expired(rentals: Rentals, vast: FakeVast, market: VastMarket, *, prefix: str, count: int) -> list[str]:
    """`count` running instances whose kill-time passed an hour ago; their instance ids."""
    long_ago = time.time() - 7200
    ids = []
    for i in range(count):
        plan = rentals.plan(
            job=f"{prefix}{i}",
            attempt=1,
            offer=_offer(vast, market),
            disk_gb=20,
            ttl_s=3600,
            now=long_ago,
            reserve_usd=1.0,
            budget_name="default",
            spec=SPEC,
        )
        r = rentals.execute(plan.id, market=market, now=long_ago)
        assert r.instance_id is not None
        vast.boot(r.instance_id)
        ids.append(r.instance_id)
    return ids


def _stop_calls(vast: FakeVast) -> Counter[str]:
    """Instance id -> how many stop requests the vendor received for it."""
    return Counter(
        c.path.rstrip("/").rsplit("/", 1)[-1]
        for c in vast.calls_to("/api/v0/instances/")
        if c.method == "PUT" and isinstance(c.body, dict) and c.body.get("state") == "stopped"
    )


@pytest.mark.faults
@pytest.mark.slow
def test_ten_reapers_at_once_stop_each_expired_instance_once_at_the_vendor(fleet) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """Ten reaper tasks race in ten worker processes over 20 instances past their kill-time: the vendor
    receives exactly one stop per instance, the ledger holds one stop event each and verifies."""
    env, vast, rentals, market = fleet
    rentals.budget.set_cap("default", 1000.0)
    n = rounds(ci=1, full=5)
    worker = CeleryWorker.start(env, cwd=REPO, queues="maintenance", concurrency=REAPERS, name="reapers")
    orphans: list[str] = []
    try:
        client = celery_client(env)
        for r in range(n):
            orphans += _expired(rentals, vast, market, prefix=f"reap{r}-", count=ORPHANS)
            results = [client.send_task("tuneharness.maintenance.reaper", queue="maintenance") for _ in range(REAPERS)]
            for res in results:
                res.get(timeout=180)
    finally:
        worker.stop()
    stops = _stop_calls(vast)
    duplicates = {iid: k for iid, k in stops.items() if k != 1}
    assert duplicates == {}, f"instances stopped more than once at the vendor: {duplicates}"
    assert sorted(stops) == sorted(orphans)
    events = Counter(e.instance for e in rentals.ledger.rows(kind="instance_stopped"))
    assert events == Counter(orphans)
    assert all(vast.instances[i]["intended_status"] == "stopped" for i in orphans)
    assert rentals.ledger.verify().ok
    record(
        "ten_reapers_over_twenty_orphans",
        criterion="ten reapers at once over 20 expired instances stop each one exactly once at the vendor",
        rounds=n,
        reapers=REAPERS,
        orphans=len(orphans),
        vendor_stops=sum(stops.values()),
        duplicate_stops=sum(k - 1 for k in stops.values()),
    )


# -- two beats, the lock holder killed ---------------------------------------------------------------

# A beat whose lock lives `ttl_s` (the product's BeatLock, its expiry shortened for the CI scale): the
# real `celery beat` of workers.celery_app otherwise, lock and schedule included.
_BEAT = textwrap.dedent(
    """
    import functools, sys
    from workers import beatlock
    ttl_s = int(sys.argv.pop(1))
    if ttl_s != beatlock.LOCK_TTL_S:
        beatlock.BeatLock = functools.partial(beatlock.BeatLock, ttl_s=ttl_s, renew_every_s=ttl_s / 4)
    from celery.__main__ import main
    sys.argv[0] = "celery"
    main()
    """
)
_SENT = re.compile(r"^\[(?P<at>[\d-]+ [\d:]+,\d+): INFO/MainProcess\] Scheduler: Sending due task beat-heartbeat ")


@dataclass
class _BeatSlot:
    """One beat machine: its beat is started again whenever it exits (`restart: unless-stopped`), so
    the beat that lost the race for the lock keeps trying, as the deployment's standby does."""

    name: str
    env: dict[str, str]
    home: Path
    ttl_s: int
    restart_after_s: float = 1.0
    proc: subprocess.Popen[bytes] | None = None
    logs: list[Path] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._supervise, name=f"beat-slot-{self.name}", daemon=True)
        self._thread.start()

    def _supervise(self) -> None:
        while not self._stop.is_set():
            log = self.home / f"{self.name}-{len(self.logs)}.log"
            self.logs.append(log)
            with log.open("wb") as fh:
                self.proc = subprocess.Popen(
                    [sys.executable, "-c", _BEAT, str(self.ttl_s), "-A", "workers.celery_app", "beat",
                     "--loglevel", "INFO", "-s", str(self.home / f"{self.name}-schedule")],
                    env=self.env, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT,
                )  # fmt: skip
            self.proc.wait()
            self._stop.wait(self.restart_after_s)

    def stop(self) -> None:
        self._stop.set()
        deadline = time.monotonic() + 30
        while self._thread is not None and self._thread.is_alive() and time.monotonic() < deadline:
            proc = self.proc  # the supervisor may have started one more beat as it was told to stop
            if proc is not None and proc.poll() is None:
                proc.terminate()
            self._thread.join(timeout=1)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def sends(self, *, skip: Path | None = None) -> list[float]:
        """Wall times of the heartbeats this slot's beats sent (from their logs), but `skip`'s."""
        out = []
        for log in list(self.logs):
            if log == skip or not log.exists():
                continue
            for line in log.read_text(errors="replace").splitlines():
                if m := _SENT.match(line):
                    out.append(datetime.strptime(m["at"], "%Y-%m-%d %H:%M:%S,%f").timestamp())
        return out


def _lock_pid(r: redis.Redis) -> int | None:
    value = r.get(LOCK_KEY)
    if value is None:
        return None
    return int((value.decode() if isinstance(value, bytes) else str(value)).rsplit(":", 1)[1])


def _kill_the_holder(r: redis.Redis, slots: list[_BeatSlot], *, ttl_s: int) -> tuple[float, float]:
    """SIGKILL the beat holding the lock once it has sent twice; wait until a beat (either machine's,
    both restart theirs) has taken over and sent three times. (when killed, seconds to the first send)"""
    assert wait_until(lambda: _lock_pid(r) is not None, timeout_s=120)
    holder_pid = _lock_pid(r)
    holder = next(s for s in slots if s.proc is not None and s.proc.pid == holder_pid)
    killed_log = holder.logs[-1]
    assert wait_until(lambda: len(holder.sends()) >= 2, timeout_s=60), killed_log.read_text()
    killed_at = time.time()
    os.kill(holder_pid, signal.SIGKILL)  # type: ignore[arg-type]

    def taken_over() -> list[float]:
        return [t for s in slots for t in s.sends(skip=killed_log) if t > killed_at]

    assert wait_until(taken_over, timeout_s=ttl_s + 120), [s.logs[-1].read_text()[-1000:] for s in slots]
    first = min(taken_over())
    assert wait_until(lambda: len(taken_over()) >= 3, timeout_s=60)  # and it goes on sending
    return killed_at, first - killed_at


@pytest.mark.faults
@pytest.mark.slow
def test_two_beats_the_holder_killed_the_standby_takes_over_one_send_per_interval(
    th_env: dict[str, str], th_home: Path
) -> None:
    """Two beat machines; the lock holder is killed with SIGKILL: a restarted beat takes the lock and
    sends on, no heartbeat interval ever gets two sends, and every failover is timed (kill to first send)."""
    n = rounds(ci=1, full=5)
    # CI: a 3 s lock and beat's periods scaled 60x (heartbeat every second); full: the product's lock.
    ttl_s = LOCK_TTL_S if full_scale() else 3
    interval_s = 60.0 / SCALE
    env = {**th_env, "TUNEHARNESS_SIM_SCALE": str(SCALE)}
    r = redis.Redis.from_url(env["TUNEHARNESS_BROKER_URL"])
    slots = {name: _BeatSlot(name, env, th_home, ttl_s) for name in ("a", "b")}
    failovers: list[float] = []
    kills: list[float] = []
    try:
        for slot in slots.values():
            slot.start()
        for _ in range(n):
            killed_at, failover_s = _kill_the_holder(r, list(slots.values()), ttl_s=ttl_s)
            kills.append(killed_at)
            failovers.append(failover_s)
    finally:
        for slot in slots.values():
            slot.stop()
    sends = sorted(t for slot in slots.values() for t in slot.sends())
    gaps = [b - a for a, b in itertools.pairwise(sends)]
    doubled = [round(g, 3) for g in gaps if g < interval_s / 2]
    assert doubled == [], f"heartbeat intervals that got two sends (gaps in s): {doubled}"
    assert len(failovers) == n
    edges = [0.0, *kills, float("inf")]
    per_holder = [sum(1 for t in sends if lo < t <= hi) for lo, hi in itertools.pairwise(edges)]
    assert all(k >= 2 for k in per_holder), per_holder  # each holder sent, before and after every kill
    record(
        "two_beats_holder_killed",
        criterion="two beats, the lock holder killed: another beat takes over and no heartbeat interval gets two sends",
        rounds=n,
        lock_ttl_s=ttl_s,
        heartbeat_interval_s=interval_s,
        heartbeat_sends=len(sends),
        sends_between_kills=per_holder,
        doubled_intervals=len(doubled),
        failover_s=[round(f, 2) for f in failovers],
        failover_s_max=round(max(failovers), 2),
    )


# -- beat frozen for three reaper intervals ------------------------------------------------------------


def _one_beat(env: dict[str, str], home: Path) -> tuple[subprocess.Popen[bytes], Path]:
    log = home / f"beat-{time.monotonic_ns()}.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "workers.celery_app", "beat", "--loglevel", "INFO",
             "-s", str(home / "beat-schedule")],
            env=env, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT,
        )  # fmt: skip
    return proc, log


@dataclass
class _Frozen:
    """What one freeze measured."""

    expired: list[str]
    paused_s: float
    alert_after_s: float
    reaped_after_resume_s: float


def _freeze_beat_once(env: dict[str, str], home: Path, vast: FakeVast, market: VastMarket, *, tag: str) -> _Frozen:
    """One beat and one worker on a fresh database: once the reaper has run, SIGSTOP beat, let five
    instances pass their kill-time, wait for the workers' `beat_overdue` and three reaper intervals,
    SIGCONT, and wait until the five are stopped."""
    from app.alerts import OutboxNotifier
    from app.db import init_db, make_engine
    from app.liveness import last_successes

    reaper_s = period_s("reaper") / FROZEN_SCALE
    broker = redis.Redis.from_url(env["TUNEHARNESS_BROKER_URL"])
    broker.flushdb()
    engine = make_engine(env["TUNEHARNESS_DB_URL"])
    init_db(engine)
    rentals = Rentals(engine)
    rentals.budget.set_cap("default", 1000.0)
    outbox = OutboxNotifier(engine, None)
    worker = CeleryWorker.start(env, cwd=REPO, queues="maintenance", concurrency=2, name=tag)
    beat, beat_log = _one_beat(env, home)
    try:
        assert wait_until(lambda: "reaper" in last_successes(engine), timeout_s=120), beat_log.read_text()
        os.kill(beat.pid, signal.SIGSTOP)
        stopped_at = time.time()
        # what beat sent before it froze has run: no reaper is left to run while it is frozen
        assert wait_until(lambda: broker.llen("maintenance") == 0 and broker.hlen("unacked") == 0, timeout_s=60)
        expired = _expired(rentals, vast, market, prefix=f"{tag}-", count=5)

        def reaper_flagged() -> bool:
            return any(a.key.startswith("beat_overdue:reaper:") for a in outbox.recorded())

        assert wait_until(reaper_flagged, timeout_s=3 * reaper_s + 90), worker.log.read_text()[-2000:]
        alert_after_s = time.time() - stopped_at
        # the watch only tells: nothing reaps while beat is frozen
        assert all(vast.instances[i]["intended_status"] == "running" for i in expired)
        threading.Event().wait(max(0.0, stopped_at + 3 * reaper_s - time.time()))  # the fault: 3 intervals
        os.kill(beat.pid, signal.SIGCONT)
        resumed_at = time.time()

        def reaped() -> bool:
            at_vendor = all(vast.instances[i]["intended_status"] == "stopped" for i in expired)
            return at_vendor and all(r.state == "stopped" for r in rentals.all(states=("active", "stopped")))

        assert wait_until(reaped, timeout_s=120), beat_log.read_text()[-2000:]
        reaped_s = time.time() - resumed_at
        assert beat.poll() is None, "the resumed beat still holds its lock and runs"
        assert rentals.ledger.verify().ok
        stops = rentals.ledger.rows(kind="instance_stopped")
        assert sorted(e.instance or "" for e in stops) == sorted(expired)
        assert {e.reason for e in stops} == {"ttl"}
    finally:
        if beat.poll() is None:
            os.kill(beat.pid, signal.SIGCONT)
            beat.terminate()
            beat.wait(timeout=30)
        worker.stop()
    return _Frozen(expired, resumed_at - stopped_at, alert_after_s, reaped_s)


@pytest.mark.faults
@pytest.mark.slow
def test_a_beat_frozen_for_three_reaper_intervals_is_flagged_and_reaps_after_it_resumes(
    th_env: dict[str, str], tmp_path: Path
) -> None:
    """Beat is SIGSTOPped while instances pass their kill-time: the workers' own watch raises
    `beat_overdue` for the reaper while nothing reaps; after SIGCONT the same beat carries on and each
    expired instance is stopped once at the vendor."""
    n = rounds(ci=1, full=3)
    runs: list[_Frozen] = []
    vast = FakeVast(offers=[])
    with vast:
        market = VastMarket(api_key=vast.api_key, api_url=vast.url)
        for k in range(n):  # each round a fresh database: the alert is raised once per task and hour
            home = tmp_path / f"round{k}"
            home.mkdir()
            env = {
                **th_env,
                "TUNEHARNESS_HOME": str(home),
                "TUNEHARNESS_DB_URL": f"sqlite:///{home / 'th.db'}",
                "TUNEHARNESS_SIM_SCALE": str(FROZEN_SCALE),
                "VAST_API_URL": vast.url,
                "VAST_API_KEY": vast.api_key,
                "TUNEHARNESS_PROVIDERS": "vast",
                "TUNEHARNESS_PROVIDER_BACKOFF_S": "0",
                "TUNEHARNESS_IDLE_GRACE_S": "1800",
            }
            runs.append(_freeze_beat_once(env, home, vast, market, tag=f"frozen{k}"))
        stops = _stop_calls(vast)
    expired = [i for run in runs for i in run.expired]
    assert {i: stops[i] for i in expired} == dict.fromkeys(expired, 1)
    record(
        "beat_frozen_three_reaper_intervals",
        criterion="a beat SIGSTOPped for three reaper intervals is flagged beat_overdue by the workers; "
        "after SIGCONT every expired instance is stopped once",
        rounds=n,
        reaper_interval_s=period_s("reaper") / FROZEN_SCALE,
        paused_s=[round(run.paused_s, 2) for run in runs],
        alert_after_pause_s=[round(run.alert_after_s, 2) for run in runs],
        reaped_after_resume_s=[round(run.reaped_after_resume_s, 2) for run in runs],
        expired=len(expired),
        vendor_stops=sum(stops[i] for i in expired),
    )
