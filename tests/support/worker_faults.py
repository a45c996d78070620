"""Shared parts of the worker-kill fault tests: a journal of task deliveries, a hold that keeps a
delivery in flight until the test lets it go, and the broker-side step that stands for the
visibility timeout passing.

How Redis redelivers (kombu's Redis transport, which Celery uses): there is no broker-side
redelivery. A consumer that takes a message writes it to the `unacked` hash and its delivery time
to the `unacked_index` sorted set; the acknowledgement (after the task ran: `task_acks_late`)
removes both. A worker child that dies is seen by its main process, which puts the message back at
once (`task_reject_on_worker_lost`). A main process that dies (kill -9 of the whole worker) puts
nothing back: its messages stay in `unacked` until some consumer's `restore_visible` finds them
older than the visibility timeout, which a consumer does when it starts and about every 100 s after
(`unacked_restore_interval` 10 s x `unacked_restore_throttle` 10). A warm shutdown (SIGTERM to the
main process) lets running tasks finish and puts back what was prefetched but not started.

The product's visibility timeout is 7200 s and its start-up check refuses any timeout that does not
exceed every task limit and countdown (`workers.config.check_time_limits`), so a test cannot shorten
it to seconds without weakening that check. Instead `age_delivery` moves one message's delivery time
back by the timeout: to kombu that is the timeout having passed, and the next worker to start
redelivers the message, with the product's own configuration.

The worker side lives in `support.worker_faults_task` (`-A support.worker_faults_task`).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.market import LaunchSpec

if TYPE_CHECKING:
    from app.rentals import Rentals
    from providers.fakes import FakeVast
    from providers.vast import VastMarket

__all__ = [
    "DIR_VAR",
    "HOLD_AT_VAR",
    "HOLD_LIMIT_S",
    "PAIR_VAR",
    "SPEC",
    "Delivery",
    "Journal",
    "Rig",
    "age_delivery",
    "broker_idle",
    "creates_for",
    "open_rig",
    "plan_rental",
    "unacked_task_ids",
    "wait_for",
]

DIR_VAR = "TUNEHARNESS_FAULTS_DIR"  # the journal's directory; unset: no journal and no hold
HOLD_AT_VAR = "TUNEHARNESS_FAULTS_HOLD_AT"  # a step of the create (after_reservation, ...) to hold at
PAIR_VAR = "TUNEHARNESS_FAULTS_PAIR"  # "1": a later delivery reaching the step lets the first go
HOLD_LIMIT_S = 100.0  # under the provision queue's soft limit (120 s): a hold never released fails the task

SPEC = LaunchSpec(image="tuneharness/trainer:cpu", disk_gb=20, label="", ssh_public_key="ssh-ed25519 AAAA test")

UNACKED_KEY = "unacked"  # kombu.transport.redis.Channel.unacked_key
UNACKED_INDEX_KEY = "unacked_index"  # kombu.transport.redis.Channel.unacked_index_key


@dataclass(frozen=True, slots=True)
class Delivery:
    """One delivery of a task for one rental: its ordinal (1: the first), where and when it ran."""

    ordinal: int
    pid: int
    started_at: float
    finished_at: float | None
    outcome: str | None  # the task's result state, "retry", or the exception's name; None: never finished
    noop: bool  # the rental was already recorded when this delivery began: it had nothing left to do


def _safe(rental_id: str) -> str:
    return rental_id.replace(":", "_").replace("/", "_")


class Journal:
    """Files in one directory, written by the workers' deliveries and read by the test.

    `<rental>.start.<n>` is created exclusively, so concurrent deliveries of one task get distinct
    ordinals; `<rental>.done.<n>` says how delivery n ended; `<rental>.held` says the first delivery
    waits at the hold step; `<rental>.release` (or `release-all`) lets it go.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Journal | None:
        env = os.environ if env is None else env
        raw = env.get(DIR_VAR)
        return cls(Path(raw)) if raw else None

    # -- the worker's side -----------------------------------------------------------------------

    def enter(self, rental_id: str, *, noop: bool) -> int:
        """Write down a delivery's start (`noop`: the rental is recorded already); its ordinal among
        this rental's deliveries."""
        draft = self.path / f".{_safe(rental_id)}.{os.getpid()}.{time.monotonic_ns()}"
        draft.write_text(json.dumps({"pid": os.getpid(), "at": time.time(), "noop": noop}))
        n = 1
        while True:
            try:  # a hard link is created whole or not at all, and never over an existing name
                os.link(draft, self.path / f"{_safe(rental_id)}.start.{n}")
                draft.unlink()
                return n
            except FileExistsError:
                n += 1

    def leave(self, rental_id: str, ordinal: int, outcome: str) -> None:
        """Write down how delivery `ordinal` ended."""
        draft = self.path / f".{_safe(rental_id)}.done.{ordinal}"
        draft.write_text(json.dumps({"outcome": outcome, "at": time.time()}))
        draft.replace(self.path / f"{_safe(rental_id)}.done.{ordinal}")

    def hold(self, rental_id: str, ordinal: int, *, pair: bool) -> None:
        """At the hold step: the first delivery waits until released; with `pair`, a later delivery
        releases it on arriving, so both go on from the same step at the same moment."""
        base = self.path / _safe(rental_id)
        release = base.with_name(base.name + ".release")
        if ordinal > 1:
            if pair:
                release.touch()
            return
        base.with_name(base.name + ".held").write_text(str(os.getpid()))
        everyone = self.path / "release-all"
        pause = threading.Event()
        deadline = time.monotonic() + HOLD_LIMIT_S
        while not (release.exists() or everyone.exists()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the hold of {rental_id} was never released")
            pause.wait(0.002)

    # -- the test's side ---------------------------------------------------------------------------

    def held(self, rental_id: str) -> bool:
        """True once the first delivery of `rental_id` waits at the hold step."""
        return (self.path / f"{_safe(rental_id)}.held").exists()

    def release(self, rental_id: str) -> None:
        (self.path / f"{_safe(rental_id)}.release").touch()

    def release_all(self) -> None:
        """Let every held delivery go, and hold none from now on."""
        (self.path / "release-all").touch()

    def deliveries(self, rental_id: str) -> list[Delivery]:
        """Every delivery of `rental_id` so far, in order of its ordinal."""
        out = []
        for start in self.path.glob(f"{_safe(rental_id)}.start.*"):
            n = int(start.name.rsplit(".", 1)[1])
            began = json.loads(start.read_text())
            done_path = start.with_name(f"{_safe(rental_id)}.done.{n}")
            done = json.loads(done_path.read_text()) if done_path.exists() else None
            out.append(
                Delivery(
                    ordinal=n,
                    pid=int(began["pid"]),
                    started_at=float(began["at"]),
                    finished_at=None if done is None else float(done["at"]),
                    outcome=None if done is None else str(done["outcome"]),
                    noop=bool(began["noop"]),
                )
            )
        return sorted(out, key=lambda d: d.ordinal)

    def settled(self, rental_ids: Iterable[str]) -> bool:
        """Every delivery of these rentals that started has ended: finished, or its process is gone."""
        return all(d.finished_at is not None or not _alive(d.pid) for rid in rental_ids for d in self.deliveries(rid))


def _alive(pid: int) -> bool:
    """The process runs (a zombie, dead and not yet reaped, does not)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


# -- the broker -----------------------------------------------------------------------------------


def _redis(broker_url: str) -> Any:
    import redis

    return redis.Redis.from_url(broker_url)


def _unacked(client: Any) -> dict[bytes, dict[str, Any]]:
    """Delivery tag -> the message kombu keeps for it until it is acknowledged."""
    out = {}
    for tag, raw in client.hgetall(UNACKED_KEY).items():
        message, _exchange, _routing_key = json.loads(raw)
        out[tag] = message
    return out


def unacked_task_ids(broker_url: str) -> set[str]:
    """The ids of the tasks whose messages were delivered and not acknowledged yet."""
    return {str(m["headers"]["id"]) for m in _unacked(_redis(broker_url)).values()}


def age_delivery(broker_url: str, task_id: str, *, by_s: float) -> bool:
    """Move the delivery time of `task_id`'s unacknowledged message `by_s` seconds back, as if
    that long had passed since a worker took it; False when no such message is unacknowledged."""
    client = _redis(broker_url)
    for tag, message in _unacked(client).items():
        if message["headers"]["id"] == task_id:
            delivered_at = client.zscore(UNACKED_INDEX_KEY, tag)
            if delivered_at is None:
                return False
            client.zadd(UNACKED_INDEX_KEY, {tag: float(delivered_at) - by_s}, xx=True)
            return True
    return False


def broker_idle(broker_url: str, queues: Iterable[str]) -> bool:
    """No message waits in `queues` and none is delivered and unacknowledged (a countdown retry
    that a worker holds until its time counts as unacknowledged)."""
    client = _redis(broker_url)
    waiting = sum(int(client.llen(key)) for q in queues for key in client.scan_iter(match=f"{q}*", _type="list"))
    return waiting == 0 and int(client.hlen(UNACKED_KEY)) == 0


def wait_for(predicate: Callable[[], object], *, timeout_s: float, what: str, log: Path | None = None) -> None:
    """Wait for `predicate` (support.services.wait_until); fail naming `what` and the worker log's tail."""
    from support.services import wait_until

    if not wait_until(predicate, timeout_s=timeout_s):
        tail = log.read_text(errors="replace")[-3000:] if log is not None and log.exists() else ""
        raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}\n{tail}")


# -- the rig: a database, the Vast fake, rentals planned for it -----------------------------------


@dataclass(frozen=True, slots=True)
class Rig:
    """What a worker-kill test drives: the workers' environment, their database, the Vast fake."""

    env: dict[str, str]
    rentals: Rentals
    market: VastMarket
    vast: FakeVast
    journal: Journal

    @property
    def broker_url(self) -> str:
        return self.env["TUNEHARNESS_BROKER_URL"]


def open_rig(th_env: Mapping[str, str], vast: FakeVast, tmp_path: Path, **extra: str) -> Rig:
    """A fresh database with a budget, the workers' environment pointing at `vast`, and a journal."""
    from app.db import init_db, make_engine
    from app.rentals import Rentals
    from app.settings import load_settings
    from providers.vast import VastMarket

    journal_dir = tmp_path / "journal"
    journal_dir.mkdir()
    env = {
        **th_env,
        "VAST_API_URL": vast.url,
        "VAST_API_KEY": vast.api_key,
        "TUNEHARNESS_PROVIDER_BACKOFF_S": "0",
        DIR_VAR: str(journal_dir),
        **extra,
    }
    engine = make_engine(load_settings(env).db_url)
    init_db(engine)
    rentals = Rentals(engine)
    rentals.budget.set_cap("default", 1000.0)
    market = VastMarket(api_key=vast.api_key, api_url=vast.url)
    return Rig(env=env, rentals=rentals, market=market, vast=vast, journal=Journal(journal_dir))


def plan_rental(rig: Rig, job: str) -> str:
    """Steps 1 and 2 of a create (reserve, write the intent) for a fresh offer; the rental's id."""
    from app.market import OfferQuery

    oid = rig.vast.add_offer()
    offer = next(o for o in rig.market.search_offers(OfferQuery(limit=1000)) if o.offer_id == oid)
    return rig.rentals.plan(
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


def creates_for(rig: Rig, rental_id: str) -> int:
    """How many creates the vendor received for this rental (each names the rental's label)."""
    rental = rig.rentals.get(rental_id)
    assert rental is not None
    return sum(
        1
        for c in rig.vast.calls_to("/api/v0/asks/")
        if c.method == "PUT" and isinstance(c.body, dict) and c.body.get("label") == rental.label
    )
