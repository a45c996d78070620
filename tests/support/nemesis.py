"""The nemesis: a seeded, reproducible run that interleaves process, broker and vendor faults with
many jobs, and checks the money and liveness invariants after every step.

Why a virtual-time driver and not Celery processes: the real-time campaign takes about 100 s for
two jobs on this machine, so 500 jobs through worker processes and the trainer would take hours.
What the nemesis drives instead is the production money and control code itself, in one process
on a real database (a SQLite file, in /dev/shm where there is one; PostgreSQL with `db_url`):

- `app.services.provisioning.ProvisioningService` (`start`, `step`, `preflight`, `observe`,
  `sweep_holds`, `overdue`, `end_at_cap`), with it `app.rentals.Rentals` (plan, the create-once
  protocol with its `rental_sends`, its exit trap and fault hook, abandon, stale intents), the
  budget reservations and the hash-chained ledger;
- the guardrail sweeps of `app.services.guardrails` (reaper, reconciler, budget monitor), the
  monitor chains' sequence numbers and `orphaned` of `app.services.supervisor.SupervisorService`,
  and the delivery cap of `app.deliveries` (each delivery admitted and forgotten as
  `workers.tasks.task` does; a delivery killed inside its body leaves its count behind).

The Celery shells are thin by design (STYLE.md habit 8); the few lines of routing in them
(`workers.provisioning.schedule`, `redrive`, `rearm_monitors`, the retries of `provision`,
`watch_boot` and `preflight`, `workers.tasks._poisoned`) are mirrored here as `_schedule` and
`_run_*`, each naming the shell it mirrors. The trainer's host is played from simulated truth:
`providers.sim.market.SimMarket` (its hosts pull, freeze, fail, die and hang on the trace's
schedule) with its referee for the preflight, and the supervisor's judgement of a probe is fed as
the `TrainerStatus` the real supervisor builds (`SupervisorService._observe`, `_lost`, `_finish`).
What the supervisor does over SSH (bundle push, checkpoint pull) is not played: a checkpoint
counts as pulled when the trainer writes it, and a host we stopped ourselves is treated as lost
(the real supervisor pauses the job instead; the money invariants are the same either way).

The broker is a heap of messages with due times. Process and broker faults act on it: a delivery
killed at a create's fault point (`Rentals.execute`'s `fault` hook: after_reservation,
after_provider_accepted, after_ledger) or inside any vendor call (a `Killed` BaseException, so no
`except Exception` of the product runs, as under SIGKILL, and the job's step lease stays behind
until its TTL), its message then redelivered (acks_late) or lost; a message delivered twice at
once, a second copy run interleaved from inside the first's vendor call (a thread that waits on
the step lease), a copy delivered again past the visibility timeout; the broker losing every
queued message (Redis restarted without persistence); beat paused for a while, run twice (two
beats), several reapers and reconcilers in one tick; an out-of-memory message that kills every
worker it reaches until the delivery cap refuses it; a SIGTERM (warm shutdown: queued messages
wait for the restart). Vendor faults come from `FaultyMarket` around the simulated marketplace:
creates that time out after the vendor accepted them, 429 and 502/503/504, offers gone, instances
that vanish behind our back, incomplete listings (raised as the real adapters raise them).

Invariants, after every step (each raises `InvariantViolation` naming the seed and the step, so
`python bench/nemesis.py --seed S --jobs N` replays it):

1. every instance the vendor lists (stopped ones too) is a rental we know: its instance id is in
   the registry, or its label is that of a rental still in `intent` whose create was sent (the
   answer not yet recorded: the window the create-once protocol and the reconciler close);
2. for every budget cap, reserved + spent <= cap (1e-6 for float sums), read from the tables;
3. the ledger's hash chain verifies (new rows each step, `Ledger.verify` in full periodically and
   at the end);
4. at most one vendor create per (job, attempt), ever (the labels of creates the vendor accepted);
5. no job is stuck: every job not in a terminal phase has a future wake-up. Precisely, one of: a
   message for it in the broker (provision, watch_boot, preflight, monitor; queued, delayed or
   about to be redelivered); or a provisioning state with a `wake_at` (redrive's `overdue` sends a
   `watch_boot` once it is `REDRIVE_GRACE_S` past); or no provisioning state yet (redrive's
   stranded rule sends `provision`); or, training, a supervision row (`rearm_monitors` re-arms a
   chain untouched for its window). Terminal: done, failed (the job table's phase or the
   provisioning state's). Beat pauses end, so these backstops do run.

A run submits its jobs at random intervals, ends when every job ended and nothing is rented any
more, or `DRAIN_S` after the last job ended (no fleet faults then); what is still live then is
reported (`live_rentals_at_end`), not judged: the reaper ends it at its kill-time. Every random
choice comes from the seed; the one second thread (an interleaved delivery) is joined before the
first goes on, so a seed replays step for step. The operator's cancel is not among the faults
(`cancelled` stays 0); the operator's destroy is played every 15 minutes on the stopped hosts of
ended jobs, since automation never destroys a host that held work and the simulated vendor does
not offer a machine again while a stopped instance holds it.

It lives in tests/support, not in the shipped package: it is a fault harness around the services
(like `faultlab`), and bench/nemesis.py imports it the way bench/foundation.py imports tests.
"""

from __future__ import annotations

import heapq
import itertools
import json
import math
import random
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, func, select

from app.alerts import InMemoryNotifier
from app.budget import HELD, SETTLED, BudgetCap, ReservationRow
from app.db import init_db, make_engine
from app.deliveries import admit, forget
from app.ledger import _HASHED_FIELDS, GENESIS_HASH, Event, Ledger, LedgerEvent, row_hash
from app.market import (
    CreateUnconfirmed,
    Instance,
    LaunchSpec,
    MarketError,
    Offer,
    OfferGone,
    OfferQuery,
    PriceIncrease,
    ProviderBusy,
    ProviderError,
)
from app.policy import codec
from app.policy.preflight import PreflightReport
from app.policy.provisioning import PreflightResult, TrainerStatus
from app.policy.ranking import JobShape, Requirements
from app.rentals import RentalRow, Rentals, RentalSendRow
from app.services import guardrails
from app.services.leases import StepLeaseRow, StepLeases
from app.services.provisioning import ProvisioningService, Step
from app.services.provisioning.state import ProvisioningStateRow
from app.services.supervisor import SupervisionRow, SupervisorService
from providers.sim.clock import VirtualClock
from providers.sim.market import SimMarket
from providers.sim.trace import parse_trace

__all__ = [
    "FaultyMarket",
    "InvariantViolation",
    "Killed",
    "Nemesis",
    "NemesisConfig",
    "NemesisResult",
    "scratch_dir",
]

# Mirrored from the Celery shells (workers/provisioning.py, workers/guardrails.py, workers/config.py)
# rather than imported: importing workers builds the Celery app.
REDRIVE_GRACE_S = 600.0
STALE_INTENT_S = 3600.0
ORPHAN_GRACE_S = 240.0  # 2 x LONGEST_CREATE_LATENCY_S
VISIBILITY_TIMEOUT_S = 7200.0
PREFLIGHT_VENDOR_WAIT_S = 300.0
BEAT_PERIODS_S = {  # beat_schedule.py
    "reaper": 300.0,
    "reconcile": 300.0,
    "redrive": 300.0,
    "sweep_holds": 60.0,
    "budget_monitor": 60.0,
    "rearm_monitors": 120.0,
    # Not beat: the operator, who destroys the stopped hosts of ended jobs (automation only stops a
    # host that held work). Without it every finished job's machine stays taken at the vendor.
    "operator_destroy": 900.0,
}
CHECKPOINT_EVERY_S = 60.0
# Each worker's beat watch (`workers.beatwatch`): it checks this often and sends a money sweep
# itself when beat is late with it (`due_fallbacks`); the nemesis's names for those sweeps.
WATCH_EVERY_S = 10.0
FALLBACK_SWEEPS = {"budget_monitor": "budget-monitor", "reaper": "reaper", "reconcile": "reconciler"}
EPS_USD = 1e-6
# After the last job ended, beat goes on this long for the holds, the reaper and the reconciler to
# end what is still live; what is live after it is reported (`live_rentals_at_end`).
DRAIN_S = 7200.0
FULL_VERIFY_EVERY = 400  # steps between full `Ledger.verify` runs (each step checks its new rows)

PROCESS_FAULTS = (
    "kill_after_reservation",
    "kill_after_provider_accepted",
    "kill_after_ledger",
    "kill_in_vendor_call",
    "duplicate_delivery",
    "interleaved_delivery",
    "visibility_timeout",
    "broker_restart",
    "beat_paused",
    "beat_twice",
    "many_reapers",
    "oom_message",
    "sigterm",
)
VENDOR_FAULTS = (
    "create_timeout_after_accept",
    "rate_limited_429",
    "server_error_5xx",
    "offer_gone",
    "instance_vanished",
    "listing_incomplete",
)


@contextmanager
def scratch_dir() -> Iterator[Path]:
    """A directory for the run's SQLite file, in memory where the machine has /dev/shm: the run
    measures the control code, not the disk's fsync (thousands of small transactions)."""
    shm = Path("/dev/shm")
    with tempfile.TemporaryDirectory(prefix="nemesis-", dir=shm if shm.is_dir() else None) as d:
        yield Path(d)


class Killed(BaseException):
    """The worker died here (SIGKILL, OOM): no `except Exception`, no exit trap, no ack."""


class InvariantViolation(AssertionError):
    pass


@dataclass(frozen=True)
class NemesisConfig:
    seed: int = 1
    jobs: int = 20
    hosts: int = 80
    fault_p: float = 0.12  # chance that a delivery carries a fault
    event_every_s: float = 900.0  # mean virtual seconds between fleet-wide faults (restart, pause...)
    arrive_every_s: float = 45.0  # mean virtual seconds between job submissions
    train_s: float = 600.0
    db_url: str | None = None  # None: a SQLite file under `root`
    max_steps: int = 400_000
    # False (the bench): a violation is recorded (each distinct one once) and the run goes on, so
    # its counts are still written; True (the tests): the first one raises.
    stop_at_violation: bool = True


@dataclass(order=True)
class Message:
    due: float
    order: int
    task: str = field(compare=False)
    args: tuple[Any, ...] = field(compare=False)
    msg_id: str = field(compare=False, default="")
    retries: int = field(compare=False, default=0)
    first_try_at: float | None = field(compare=False, default=None)

    def job(self) -> str | None:
        return str(self.args[0]) if self.args and self.task not in BEAT_PERIODS_S else None


@dataclass
class NemesisResult:
    seed: int
    jobs: int
    steps: int = 0
    checks: int = 0
    violations: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    creates: int = 0
    duplicates: int = 0
    orphans_stopped: int = 0
    crashed_creates_adopted: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    poisoned: int = 0
    task_errors: Counter[str] = field(default_factory=Counter)
    live_rentals_at_end: list[str] = field(default_factory=list)
    violation_messages: list[str] = field(default_factory=list)
    virtual_s: float = 0.0
    wall_s: float = 0.0

    def counts(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "jobs": self.jobs,
            "steps": self.steps,
            "invariant_checks": self.checks,
            "violations": self.violations,
            "violation_messages": self.violation_messages,
            "faults": dict(sorted(self.faults.items())),
            "faults_total": sum(self.faults.values()),
            "creates": self.creates,
            "duplicates": self.duplicates,
            "orphans_stopped": self.orphans_stopped,
            "crashed_creates_adopted": self.crashed_creates_adopted,
            "completed": self.completed,
            "failed": self.failed,
            "cancelled": self.cancelled,
            "poisoned": self.poisoned,
            "task_errors": dict(sorted(self.task_errors.items())),
            "live_rentals_at_end": self.live_rentals_at_end,
            "virtual_hours": round(self.virtual_s / 3600.0, 2),
            "wall_s": round(self.wall_s, 1),
        }


class NemesisClock(VirtualClock):
    """Virtual time whose seconds are wall seconds to the shells (redrive's grace, countdowns)."""

    def wall_seconds(self, clock_s: float) -> float:
        return clock_s


class FaultyMarket:
    """The Market port over `SimMarket` with vendor faults armed one call at a time by the nemesis,
    and a count of the creates the vendor accepted, per label."""

    name = "sim"

    def __init__(self, inner: SimMarket) -> None:
        self.inner = inner
        self.armed: list[str] = []  # vendor faults for the next matching calls
        self.kill: str | None = None  # "before" | "after": the next vendor call kills the worker
        self.creates_by_label: Counter[str] = Counter()
        self.fired: Counter[str] = Counter()
        self.on_kill: Callable[[], None] = lambda: None  # told just before a worker dies here

    def arm(self, kind: str, *, on: str | None = None) -> None:
        """The next call (of `on`: search, create, status, list, stop, start, destroy) fails so."""
        self.armed.append(kind if on is None else f"{kind}@{on}")

    def _take(self, *kinds: str, what: str = "") -> str | None:
        for k in self.armed:
            kind, _, on = k.partition("@")
            if kind in kinds and on in ("", what):
                self.armed.remove(k)
                self.fired[kind] += 1
                return kind
        return None

    def _call(self, what: str, fn: Callable[[], Any], *, busy_ok: bool = True) -> Any:
        if busy_ok:
            fault = self._take("rate_limited_429", "server_error_5xx", what=what)
            if fault == "rate_limited_429":
                raise ProviderBusy(f"{what}: 429 too many requests", provider="sim", status_code=429)
            if fault == "server_error_5xx":
                raise ProviderBusy(f"{what}: 503 service unavailable", provider="sim", status_code=503)
        if self.kill == "before":
            self.kill = None
            self.on_kill()
            raise Killed(f"killed before {what}")
        out = fn()
        if self.kill == "after":
            self.kill = None
            self.on_kill()
            raise Killed(f"killed after {what}")
        return out

    def search_offers(self, query: OfferQuery) -> list[Offer]:
        return list(self._call("search", lambda: self.inner.search_offers(query)))

    def create(self, offer: Offer, spec: LaunchSpec) -> str:
        if self._take("offer_gone", what="create"):
            raise OfferGone(f"offer {offer.offer_id} is no longer available", provider="sim", status_code=410)

        def create() -> str:
            iid = self.inner.create(offer, spec)
            self.creates_by_label[spec.label] += 1
            if self._take("create_timeout_after_accept", what="create"):
                raise CreateUnconfirmed("create: read timeout after the request was sent", provider="sim")
            return iid

        return str(self._call("create", create))

    def status(self, instance_id: str) -> Instance:
        got: Instance = self._call("status", lambda: self.inner.status(instance_id))
        return got

    def list_instances(self, label_prefix: str = "") -> list[Instance]:
        if self._take("listing_incomplete", what="list"):
            raise ProviderError("the instance list is incomplete: nothing was acted on. Run it again", provider="sim")
        return list(self._call("list", lambda: self.inner.list_instances(label_prefix)))

    def stop(self, instance_id: str) -> None:
        self._call("stop", lambda: self.inner.stop(instance_id))

    def start(self, instance_id: str) -> None:
        self._call("start", lambda: self.inner.start(instance_id))

    def destroy(self, instance_id: str) -> None:
        self._call("destroy", lambda: self.inner.destroy(instance_id))

    def pending_price_increases(self) -> list[PriceIncrease]:
        return []

    def answer_price_increase(self, increase: PriceIncrease, *, accept: bool) -> bool:
        return False


def make_trace(rng: random.Random, hosts: int) -> dict[str, Any]:
    """A marketplace of `hosts` RTX 3090 hosts, about a third of them lying (frozen or fatal pulls,
    no compute, slow, dying or hanging mid-training)."""
    out = []
    for i in range(hosts):
        truth: dict[str, Any] = {"pull_mbps": rng.choice([400, 800, 1600]), "status_every_s": 10}
        roll = rng.random()
        if roll < 0.06:
            truth["freeze_at_s"] = rng.uniform(5, 40)
        elif roll < 0.12:
            truth.update(fatal_at_s=rng.uniform(5, 40), fatal_status="Error: pull access denied")
        elif roll < 0.16:
            truth["computes"] = False
        elif roll < 0.24:
            truth["dies_at_s"] = rng.uniform(200, 900)
        elif roll < 0.30:
            truth["hangs_at_s"] = rng.uniform(200, 700)
        elif roll < 0.34:
            truth["pull_mbps"] = 50
        out.append(
            {
                "machine_id": f"m-{i}",
                "offer": {
                    "gpu_name": "RTX 3090",
                    "num_gpus": 1,
                    "gpu_ram_gb": 24,
                    "dph": round(0.10 + 0.3 * rng.random(), 3),
                    "storage_per_gb_month": 0.15,
                    "inet_down_per_gb": 0.0,
                    "inet_down_mbps": 800,
                    "reliability": round(rng.uniform(0.9, 0.999), 3),
                    "cuda_max": "12.4",
                },
                "truth": {"actual_gpu_ram_gb": 24, "actual_gpu_name": "RTX 3090", **truth},
            }
        )
    return {
        "format": "tuneharness-market-trace/1",
        "name": "nemesis",
        "workload": {"image_gb": 1.0, "model_gb": 1.0, "train_seconds": 600, "disk_gb": 20, "budget_usd": 5.0},
        "hosts": out,
    }


class Nemesis:
    """One seeded run: `run()` until every job ended (or `max_steps`), checking after every step."""

    def __init__(self, cfg: NemesisConfig, root: Path, *, progress: Callable[[str], None] | None = None) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.progress = progress
        self.clock = NemesisClock()
        self.engine: Engine = make_engine(cfg.db_url or f"sqlite:///{root / 'nemesis.db'}")
        init_db(self.engine)
        self.market = FaultyMarket(SimMarket(parse_trace(make_trace(self.rng, cfg.hosts)), self.clock))
        self.svc = ProvisioningService(
            self.engine,
            market_for=lambda _name: self.market,
            clock=self.clock,
            run_preflight=self._preflight,
            launch_spec_for=lambda _job: LaunchSpec(
                image="tuneharness/trainer:cpu", disk_gb=20, label="", ssh_public_key="ssh-ed25519 AAAA nemesis"
            ),
            rng=random.Random(cfg.seed + 1),
        )
        # Step leases on the virtual clock; a wait advances it (a waiting worker lets time pass).
        self.svc.leases = StepLeases(self.engine, now=self.clock.now, sleep=self._lease_sleep, poll_s=5.0)
        self.rentals: Rentals = self.svc.rentals
        self._execute = self.rentals.execute
        self.rentals.execute = self._execute_with_faults  # type: ignore[method-assign]
        self.sup = SupervisorService(
            self.engine,
            provisioning=self.svc,
            shell_for=_no_shell,
            store=None,  # type: ignore[arg-type]  # nothing is pushed or pulled here
            staging=root / "staging",
            bundle_for=_no_bundle,
            trainer_dir=root,
            notifier=InMemoryNotifier(),
            triage=_no_triage,
        )
        self.notifier = InMemoryNotifier()
        self.ledger = Ledger(self.engine)
        self.broker: list[Message] = []
        self._order = itertools.count()
        self._ids = itertools.count(1)
        self.phase: dict[str, str] = {}  # the job table: queued, provisioning, training, done, failed
        self.submitted_at: dict[str, float] = {}
        self.work_s: dict[str, float] = {}  # training work done, per job (the trainer's truth)
        self.trained_on: dict[str, tuple[str, float]] = {}  # job -> (instance, last poll)
        self.poison: set[str] = set()  # jobs whose next message kills every worker (OOM)
        self.create_fault: str | None = None
        self.beat_paused_until = -math.inf
        self.last_sweep: dict[str, float] = {}  # the money sweeps' last runs, as `app.liveness` records them
        self.fallback_sent: dict[str, int] = {}
        self.watch_started = 0.0
        self.result = NemesisResult(seed=cfg.seed, jobs=cfg.jobs)
        self.rentals.budget.set_cap("default", round(0.5 * cfg.jobs, 2))
        self.step_no = 0
        self._ledger_seq = 0
        self._ledger_prev = GENESIS_HASH
        self._stop = False
        self.jobs_ended_at: float | None = None
        self._seen_violations: set[str] = set()
        self.dying_leases: list[str] = []  # the step leases a worker held when it was killed
        self.market.on_kill = self._note_kill

    # -- the broker ------------------------------------------------------------------------------
    def send(self, task: str, *args: Any, at: float | None = None, msg: Message | None = None) -> None:
        due = self.clock.now() if at is None else max(at, self.clock.now())
        if msg is None:
            msg = Message(due, next(self._order), task, tuple(args), msg_id=f"m{next(self._ids)}")
        else:
            msg = Message(due, next(self._order), msg.task, msg.args, msg.msg_id, msg.retries, msg.first_try_at)
        heapq.heappush(self.broker, msg)

    def retry(self, msg: Message, countdown_s: float) -> None:
        """`self.retry`: a new message with the next retry number."""
        again = Message(0, 0, msg.task, msg.args, msg.msg_id, msg.retries + 1, msg.first_try_at)
        self.send(msg.task, at=self.clock.now() + countdown_s, msg=again)

    def _lease_sleep(self, seconds: float) -> None:
        """A step lease's wait, in virtual time: the holder is a delivery joined behind this one, so
        only the clock has to move for its lease to expire."""
        self.clock.advance(seconds)

    # -- the run ---------------------------------------------------------------------------------
    def run(self) -> NemesisResult:
        t0 = time.perf_counter()
        start = self.clock.now()
        at = start
        for i in range(self.cfg.jobs):
            at += self.rng.expovariate(1.0 / self.cfg.arrive_every_s)
            self.send("submit", f"job-{i:04d}", at=at)
        for name, period in BEAT_PERIODS_S.items():
            self.send("beat", name, at=start + self.rng.uniform(0, period))
        self.watch_started = start
        self.send("watch", at=start + WATCH_EVERY_S)
        self.send("nemesis_event", at=start + self.rng.expovariate(1.0 / self.cfg.event_every_s))
        while self.broker and not self._stop:
            if self.step_no >= self.cfg.max_steps:
                raise InvariantViolation(self._where(f"the run did not end within {self.cfg.max_steps} steps"))
            msg = heapq.heappop(self.broker)
            if msg.due > self.clock.now():
                self.clock.set(msg.due)
            self.step_no += 1
            self._deliver(msg)
            self.check(full=self.step_no % FULL_VERIFY_EVERY == 0)
            if self.progress is not None and self.step_no % 2000 == 0:
                ended = sum(1 for p in self.phase.values() if p in ("done", "failed"))
                self.progress(
                    f"step {self.step_no}: {ended}/{self.cfg.jobs} jobs ended, "
                    f"{sum(self.result.faults.values())} faults, {len(self.broker)} messages queued"
                )
            if self._all_ended():
                break
            if self.jobs_ended_at is None and self._jobs_ended():
                self.jobs_ended_at = self.clock.now()
            if self.jobs_ended_at is not None and self.clock.now() - self.jobs_ended_at > DRAIN_S:
                break
        self.check(full=True)
        r = self.result
        r.steps = self.step_no
        r.creates = sum(self.market.creates_by_label.values())
        r.duplicates = sum(n - 1 for n in self.market.creates_by_label.values() if n > 1)
        r.completed = sum(1 for p in self.phase.values() if p == "done")
        r.failed = sum(1 for p in self.phase.values() if p == "failed")
        r.cancelled = sum(1 for p in self.phase.values() if p == "cancelled")
        for k, n in self.market.fired.items():
            r.faults[k] += n
        r.live_rentals_at_end = sorted(x.id for x in self.rentals.all(states=("intent", "active")))
        r.virtual_s = self.clock.now() - start
        r.wall_s = time.perf_counter() - t0
        return r

    def _jobs_ended(self) -> bool:
        return len(self.phase) == self.cfg.jobs and all(
            p in ("done", "failed", "cancelled") for p in self.phase.values()
        )

    def _all_ended(self) -> bool:
        if not self._jobs_ended():
            return False
        live = self.rentals.all(states=("intent", "active"))
        return not live and not self.svc.pool.held()

    def _where(self, problem: str) -> str:
        return (
            f"seed {self.cfg.seed} step {self.step_no} (t={self.clock.now():.0f}): {problem}. "
            f"Replay: python bench/nemesis.py --seed {self.cfg.seed} --jobs {self.cfg.jobs}"
        )

    # -- one delivery ------------------------------------------------------------------------------
    def _deliver(self, msg: Message) -> None:
        if msg.task == "submit":
            return self._submit(str(msg.args[0]))
        if msg.task == "beat":
            return self._beat(str(msg.args[0]))
        if msg.task == "watch":
            return self._watch()
        if msg.task == "nemesis_event":
            if self.jobs_ended_at is None:  # the drain after the last job runs without fleet faults
                self._fleet_fault()
            self.send("nemesis_event", at=self.clock.now() + self.rng.expovariate(1.0 / self.cfg.event_every_s))
            return None
        fault = self._draw_delivery_fault(msg)
        key = f"{msg.msg_id}:{msg.retries}"
        ok, deaths = admit(self.engine, key, task=msg.task, now=self.clock.now())
        if not ok:
            forget(self.engine, key)
            return self._poisoned(msg, deaths)
        try:
            if msg.job() in self.poison:
                raise Killed("out of memory")
            if fault == "interleaved_delivery":
                self._interleave_next_vendor_call(msg)
            self._run_task(msg)
        except Killed:
            self._killed(msg)
            return None
        except Exception as exc:  # the task raised: Celery acks it (gone); the backstops find the job
            self.result.task_errors[f"{msg.task}: {type(exc).__name__}"] += 1
        finally:
            self.market.__dict__.pop("_call", None)  # an interleave that found no vendor call
        forget(self.engine, key)
        if fault == "duplicate_delivery":
            self._run_copy(msg)
        elif fault == "visibility_timeout":
            self.send(msg.task, at=self.clock.now() + VISIBILITY_TIMEOUT_S, msg=msg)
        return None

    def _run_copy(self, msg: Message) -> None:
        try:
            self._run_task(msg)
        except Killed:
            self._killed(msg)
        except Exception as exc:
            self.result.task_errors[f"{msg.task}: {type(exc).__name__}"] += 1

    def _killed(self, msg: Message) -> None:
        """The worker died inside the body: its step leases stay until their TTL, and the message is
        redelivered (acks_late, reject_on_worker_lost) or, now and then, lost with the worker."""
        now = self.clock.now()
        held, self.dying_leases = self.dying_leases, []
        with self.engine.begin() as conn:
            lt = StepLeaseRow.__table__  # type: ignore[attr-defined]
            for key in held:
                conn.execute(lt.delete().where(lt.c.key == key))
                conn.execute(lt.insert().values(key=key, holder="dead-worker", expires_at=now + self.svc.leases.ttl_s))
        if self.rng.random() < 0.85:
            self.send(msg.task, at=now + self.rng.uniform(5, 60), msg=msg)
        else:
            self.result.faults["message_lost_with_worker"] += 1

    def _note_kill(self) -> None:
        """The step leases this thread holds as its worker dies: they outlive it (no `finally` runs
        under SIGKILL), so `_killed` writes them back until their TTL."""
        self.dying_leases = list(getattr(self.svc.leases._mine, "held", {}) or {})

    def _poisoned(self, msg: Message, deaths: int) -> None:
        """`workers.tasks._poisoned`: fail the job, never run the message again."""
        job = msg.job()
        self.result.poisoned += 1
        self.poison.discard(job or "")
        if job is not None and self.phase.get(job) not in (None, "done", "failed", "cancelled"):
            self.phase[job] = "failed"
        self.ledger.append(
            Event(
                kind="task_poisoned",
                job=job if job in self.phase else None,
                reason=f"{msg.task} died with its worker on {deaths} deliveries in a row",
                payload={"task": msg.task},
            )
        )

    # -- the shells ------------------------------------------------------------------------------
    def _run_task(self, msg: Message) -> None:
        if msg.task == "provision":
            self._run_provision(msg)
        elif msg.task == "watch_boot":
            self._run_watch_boot(msg)
        elif msg.task == "preflight":
            self._run_preflight(msg)
        elif msg.task == "monitor":
            self._run_monitor(msg)
        elif msg.task in BEAT_PERIODS_S:
            self._run_sweep(msg.task)
        else:  # pragma: no cover - the nemesis sends no other task
            raise AssertionError(msg.task)

    def _submit(self, job_id: str) -> None:
        self.phase[job_id] = "queued"
        self.submitted_at[job_id] = self.clock.now()
        # Most jobs spend under the shared default cap; some have their own, a few one below the
        # cheapest attempt (they end at their cap). Few caps: the budget monitor's pass costs a query
        # per cap and per live rental under each.
        roll = self.rng.random()
        if roll < 0.05:
            self.rentals.budget.set_cap(job_id, 0.05)
        elif roll < 0.2:
            self.rentals.budget.set_cap(job_id, round(self.rng.uniform(0.3, 1.5), 2))
        self.send("provision", job_id)

    def _shape(self) -> JobShape:
        return JobShape(download_gb=2.0, train_s=self.cfg.train_s, disk_gb=20.0)

    def _run_provision(self, msg: Message) -> None:
        """`workers.provisioning.provision`."""
        job_id = str(msg.args[0])
        if job_id not in self.phase:
            return
        self.phase[job_id] = "provisioning" if self.phase[job_id] == "queued" else self.phase[job_id]
        standby = 1 if int(job_id.rsplit("-", 1)[1]) % 10 == 3 else 0
        try:
            step = self.svc.start(job_id, req=Requirements(), shape=self._shape(), standby_hosts=standby)
        except ProviderBusy:
            self.retry(msg, 30.0)
            return
        self._schedule(step)

    def _run_watch_boot(self, msg: Message) -> None:
        """`workers.provisioning.watch_boot`."""
        try:
            step = self.svc.step(str(msg.args[0]))
        except MarketError:
            self.retry(msg, 15.0)
            return
        self._schedule(step)

    def _run_preflight(self, msg: Message) -> None:
        """`workers.provisioning.preflight`: a vendor that cannot be asked is asked again for a while."""
        job_id, instance_id = str(msg.args[0]), str(msg.args[1])
        first = msg.first_try_at if msg.first_try_at is not None else self.clock.now()
        try:
            self._schedule(self.svc.preflight(job_id, instance_id))
        except MarketError as exc:
            waited = self.clock.now() - first
            if waited < PREFLIGHT_VENDOR_WAIT_S:
                again = Message(0, 0, msg.task, msg.args, msg.msg_id, msg.retries, first)
                self.retry(again, 15.0)
                return
            verdict = PreflightResult(None, "timeout", f"the vendor could not be asked for {waited:.0f}s: {exc}")
            self._schedule(self.svc.preflight(job_id, instance_id, result=verdict))

    def _preflight(self, market: Any, job_id: str, instance_id: str) -> PreflightResult:
        market.status(instance_id)  # the shell is opened where the vendor says the host is
        raw = self.market.inner.referee.preflight_report(instance_id)
        if raw is None:
            return PreflightResult(None, "ssh_unreachable", "no SSH")
        return PreflightResult(PreflightReport.from_mapping(raw))

    def _schedule(self, step: Step) -> None:
        """`workers.provisioning.schedule`."""
        for standby_id in step.spawned:
            self.send("watch_boot", standby_id)
        for other in step.also:
            self._schedule(other)
        if step.preflight_instance is not None:
            self.send("preflight", step.job_id, step.preflight_instance)
        elif step.wake_at is not None and step.handed_over is None:
            self.send("watch_boot", step.job_id, at=step.wake_at)
        if step.standby or step.job_id not in self.phase:
            return
        if step.handed_over is not None:
            self.phase[step.job_id] = "training"
            seq = self.sup.arm(step.job_id, step.handed_over)
            self.send("monitor", step.job_id, seq)
        elif step.phase == "failed":
            self.phase[step.job_id] = "failed"

    def _run_monitor(self, msg: Message) -> None:
        """`workers.supervisor.monitor_training` over `SupervisorService.poll`, with the trainer played
        from truth: work advances while the host runs and does not hang; a checkpoint every minute."""
        job_id, seq = str(msg.args[0]), int(msg.args[1])
        watch = self.sup._claim(job_id, seq)
        if watch is None:
            return
        loaded = self.svc.state(job_id)
        if loaded is None or loaded[0].phase != "training" or loaded[0].attempt is None:
            return
        att = loaded[0].attempt
        self.sup.guard_budget(job_id)  # `SupervisorService.poll`: the job's own chain holds its caps
        now = self.clock.now()
        try:
            try:
                inst = self.market.status(att.instance_id)
            except MarketError as exc:
                inst = Instance(
                    "sim",
                    att.instance_id,
                    att.machine_id,
                    None,
                    "unknown",
                    f"unreachable: {exc}",
                    None,
                    None,
                    None,
                    None,
                )
            nxt = self._trainer_poll(job_id, att.instance_id, inst, now)
        except Exception as exc:  # `poll`: a poll that fails must not end the job's supervision
            self.ledger.append(Event(kind="supervisor_error", job=job_id, reason=f"{type(exc).__name__}: {exc}"[:500]))
            nxt = now + self.sup.cfg.repoll_s
        self.sup._save(job_id, watch)
        if nxt is not None:
            self.send("monitor", job_id, seq + 1, at=nxt)

    def _trainer_poll(self, job_id: str, instance_id: str, inst: Instance, now: float) -> float | None:
        """`inst`: what the vendor said (unknown when its status call failed); the host itself, which
        the supervisor reaches over SSH whatever the vendor says, is the simulator's truth."""
        on, last = self.trained_on.get(job_id, (None, now))
        work = self.work_s.get(job_id, 0.0)
        if on != instance_id:  # a new host: resume from the last checkpoint
            work = math.floor(work / CHECKPOINT_EVERY_S) * CHECKPOINT_EVERY_S
            last = now
        host = self.market.inner.status(instance_id)
        truth = self.market.inner.referee.truth_of(instance_id)
        hung = (
            truth.hangs_at_s is not None and host.started_at is not None and now - host.started_at >= truth.hangs_at_s
        )
        running = host.state == "running"
        if running and not hung:
            work += max(0.0, now - last)
        self.work_s[job_id], self.trained_on[job_id] = work, (instance_id, now)
        checkpoint = math.floor(work / CHECKPOINT_EVERY_S) * CHECKPOINT_EVERY_S
        if running and work >= self.cfg.train_s:
            step = self.svc.observe(
                job_id,
                TrainerStatus(instance=inst, phase="finished", work_s=work, checkpoint_work_s=work, heartbeat_at=now),
            )
            if step.phase == "done":
                self.phase[job_id] = "done"
                return None
            return now + self.sup.cfg.repoll_s
        if inst.state in ("gone", "exited"):  # `_lost`: the rental is lost, then the state machine re-queues
            rental = self.rentals.by_instance("sim", instance_id)
            if rental is not None:
                self.rentals.transition(
                    rental.id,
                    to="lost",
                    from_states=("active", "stopped"),
                    kind="instance_lost",
                    reason="provider reports it gone",
                    now=now,
                    evidence={"provider_state": inst.state},
                )
        status = TrainerStatus(
            instance=inst,
            phase="training" if running else None,
            work_s=work,
            checkpoint_work_s=checkpoint,
            heartbeat_at=now if running and not hung else None,
        )
        step = self.svc.observe(job_id, status)
        if step.phase == "queued":  # `_requeued`: provisioning rents a replacement
            self.phase[job_id] = "provisioning"
            self.send("watch_boot", job_id, at=step.wake_at if step.wake_at is not None else now)
            return None
        if step.phase in ("done", "failed"):
            self.phase[job_id] = step.phase
            return None
        return now + self.sup.cfg.monitor_s

    # -- beat ------------------------------------------------------------------------------------
    def _beat(self, name: str) -> None:
        now = self.clock.now()
        self.send("beat", name, at=now + BEAT_PERIODS_S[name])
        if now < self.beat_paused_until:
            return
        self.send(name, name)

    def _watch(self) -> None:
        """`workers.beatwatch.BeatWatch.check_once` in the workers: a money sweep beat is late with
        is sent by a worker, once per interval across the fleet (`run_late`'s Redis key)."""
        from workers.beatwatch import due_fallbacks

        now = self.clock.now()
        self.send("watch", at=now + WATCH_EVERY_S)
        last = {FALLBACK_SWEEPS[n]: at for n, at in self.last_sweep.items()}
        intervals = {product: BEAT_PERIODS_S[n] for n, product in FALLBACK_SWEEPS.items()}
        for product in due_fallbacks(last, intervals, now=now, watching_since=self.watch_started):
            name = next(n for n, p in FALLBACK_SWEEPS.items() if p == product)
            slot = int(now // intervals[product])
            if self.fallback_sent.get(name) != slot:
                self.fallback_sent[name] = slot
                self.send(name, name)

    def _run_sweep(self, name: str) -> None:
        now, markets = self.clock.now(), {"sim": self.market}
        if name in FALLBACK_SWEEPS:
            self.last_sweep[name] = now  # the task records its success (`app.liveness`)
        if name == "reaper":  # workers.guardrails.reaper
            guardrails.run_sweep(
                "reaper",
                lambda: guardrails.sweep_ttl(self.rentals, markets, now=now, notifier=self.notifier),
                notifier=self.notifier,
                now=now,
            )
        elif name == "reconcile":  # workers.guardrails.reconcile
            report = guardrails.run_sweep(
                "reconciler",
                lambda: guardrails.sweep_reconcile(
                    self.rentals, markets, now=now, orphan_grace_s=ORPHAN_GRACE_S, notifier=self.notifier
                ),
                notifier=self.notifier,
                now=now,
            )
            self.result.crashed_creates_adopted += len(report.adopted)
            self.result.orphans_stopped += len(set(report.stopped) - set(report.adopted))
        elif name == "sweep_holds":  # workers.provisioning.sweep_holds
            for step in self.svc.sweep_holds().steps:
                self._schedule(step)
        elif name == "redrive":
            self._redrive()
        elif name == "budget_monitor":
            self._budget_monitor()
        elif name == "operator_destroy":  # `tuneharness destroy` of what ended jobs left stopped
            for r in self.rentals.all(states=("stopped",)):
                if self.phase.get(r.job) in ("done", "failed", "cancelled"):
                    self.rentals.destroy(
                        r.id, market=self.market, by="operator", reason="job ended: operator clean-up", now=now
                    )
        elif name == "rearm_monitors":  # workers.supervisor.rearm_monitors
            for job_id, instance_id in self.sup.orphaned():
                seq = self.sup.arm(job_id, instance_id)
                self.send("monitor", job_id, seq)

    def _redrive(self) -> None:
        """`workers.provisioning.redrive`."""
        for job_id in self.svc.overdue(grace_wall_s=REDRIVE_GRACE_S):
            self.send("watch_boot", job_id)
        now = self.clock.now()
        for job_id, phase in self.phase.items():
            if (
                phase == "queued"
                and now - self.submitted_at[job_id] > REDRIVE_GRACE_S
                and self.svc.state(job_id) is None
            ):
                self.send("provision", job_id)
        self.rentals.release_stale_intents({"sim": self.market}, now=now, older_than_s=STALE_INTENT_S)

    def _budget_monitor(self) -> None:
        """`workers.guardrails.budget_monitor`."""
        ended: list[Step] = []

        def end_job(job_id: str, cap: str, evidence: str) -> bool:
            steps = self.svc.end_at_cap(job_id, cap=cap, evidence=evidence)
            ended.extend(steps)
            return bool(steps)

        now = self.clock.now()
        guardrails.run_sweep(
            "budget_monitor",
            lambda: guardrails.sweep_budgets(
                self.rentals.budget,
                notifier=self.notifier,
                rentals=self.rentals,
                markets={"sim": self.market},
                now=now,
                checkpoint_safe=lambda _job: True,  # the trainer's checkpoints count as pulled here
                end_job=end_job,
                job_phase=lambda job: self.phase.get(job),
            ),
            notifier=self.notifier,
            now=now,
        )
        for step in ended:
            self._schedule(step)

    # -- faults ----------------------------------------------------------------------------------
    def _draw_delivery_fault(self, msg: Message) -> str | None:
        if self.rng.random() >= self.cfg.fault_p:
            return None
        kinds = [
            "kill_after_reservation",
            "kill_after_provider_accepted",
            "kill_after_ledger",
            "kill_in_vendor_call",
            "duplicate_delivery",
            "interleaved_delivery",
            "visibility_timeout",
            "create_timeout_after_accept",
            "rate_limited_429",
            "server_error_5xx",
            "offer_gone",
            "listing_incomplete",
        ]
        if msg.job() is not None and msg.job() in self.phase and self.rng.random() < 0.02:
            kinds.append("oom_message")
        kind = self.rng.choice(kinds)
        if kind.startswith("kill_after_"):
            self.create_fault = kind[len("kill_") :]
        elif kind == "kill_in_vendor_call":
            self.market.kill = self.rng.choice(["before", "after"])
        elif kind in VENDOR_FAULTS:
            self.market.arm(kind)
            return None  # counted when it fires
        elif kind == "oom_message":
            self.poison.add(str(msg.job()))
        self.result.faults[kind] += 1
        return kind

    def _execute_with_faults(self, rental_id: str, **kwargs: Any) -> Any:
        point = self.create_fault
        self.create_fault = None

        def hook(step: str) -> None:
            if step == point:
                self._note_kill()
                raise Killed(f"killed {step}")

        return self._execute(rental_id, fault=hook, **kwargs)

    def _interleave_next_vendor_call(self, msg: Message) -> None:
        """A second delivery of `msg` starts while the first is inside its first vendor call: it runs
        in another thread (another worker), waits for the job's step lease, and is joined before the
        first goes on, so the order is the seed's."""
        inner_call = self.market._call
        copy_done: list[bool] = []

        def call(what: str, fn: Callable[[], Any], *, busy_ok: bool = True) -> Any:
            self.market.__dict__.pop("_call", None)
            if not copy_done:
                copy_done.append(True)
                t = threading.Thread(target=self._run_copy, args=(msg,), name="second-worker")
                t.start()
                t.join(timeout=300)
            return inner_call(what, fn, busy_ok=busy_ok)

        self.market._call = call  # type: ignore[method-assign]

    def _fleet_fault(self) -> None:
        kind = self.rng.choice(
            ["broker_restart", "beat_paused", "beat_twice", "many_reapers", "instance_vanished", "sigterm"]
        )
        now = self.clock.now()
        self.result.faults[kind] += 1
        if kind == "broker_restart":  # Redis without persistence: every task message is gone
            keep = [m for m in self.broker if m.task in ("submit", "beat", "nemesis_event", "watch")]
            self.broker = keep
            heapq.heapify(self.broker)
        elif kind == "beat_paused":  # one pause at a time, and beat runs an hour between pauses
            if now < self.beat_paused_until + 3600.0:
                self.result.faults[kind] -= 1
                return
            self.beat_paused_until = now + self.rng.uniform(600, 3600)
        elif kind == "beat_twice":
            for name in BEAT_PERIODS_S:
                self.send(name, name)
                self.send(name, name)
        elif kind == "many_reapers":
            for _ in range(3):
                self.send("reaper", "reaper")
                self.send("reconcile", "reconcile")
        elif kind == "instance_vanished":
            live = self.market.inner.list_instances("")
            if live:
                self.market.inner.destroy(self.rng.choice(sorted(i.instance_id for i in live)))
        elif kind == "sigterm":  # warm shutdown: what is queued waits for the restarted worker
            restart = now + self.rng.uniform(10, 120)
            for m in self.broker:
                if m.task not in ("submit", "beat", "nemesis_event", "watch") and m.due < restart:
                    m.due = restart
            heapq.heapify(self.broker)

    # -- invariants ------------------------------------------------------------------------------
    def check(self, *, full: bool = False) -> None:
        """Every invariant of the module docstring, now; `full`: the whole ledger chain too."""
        self.result.checks += 1
        try:
            check_vendor_known(self.market.inner, self.engine)
            check_caps(self.engine)
            self._ledger_seq, self._ledger_prev = check_ledger_since(self.engine, self._ledger_seq, self._ledger_prev)
            if full:
                report = self.ledger.verify()
                if not report.ok:
                    raise InvariantViolation(f"ledger does not verify at seq {report.first_bad_seq}: {report.problem}")
            check_one_create(self.market.creates_by_label)
            check_not_stuck(self)
        except InvariantViolation as exc:
            where = self._where(str(exc))
            if self.cfg.stop_at_violation:
                self.result.violations += 1
                raise InvariantViolation(where) from None
            if str(exc) not in self._seen_violations:  # a lasting violation is counted once
                self._seen_violations.add(str(exc))
                self.result.violations += 1
                self.result.violation_messages.append(where)
                if self.progress is not None:
                    self.progress(f"VIOLATION {where}")


def check_vendor_known(market: SimMarket, engine: Engine) -> None:
    """Invariant 1: every instance the vendor lists is a rental we know."""
    rt = RentalRow.__table__  # type: ignore[attr-defined]
    sent = RentalSendRow.__table__  # type: ignore[attr-defined]
    with engine.connect() as conn:
        rows = conn.execute(select(rt.c.id, rt.c.instance_id, rt.c.label, rt.c.state)).all()
        sent_ids = {r.rental_id for r in conn.execute(select(sent.c.rental_id))}
    by_instance = {r.instance_id for r in rows if r.instance_id}
    intents = {r.label for r in rows if r.state == "intent" and r.id in sent_ids}
    for inst in market.list_instances(""):
        if inst.instance_id in by_instance:
            continue
        if inst.label in intents:
            continue
        raise InvariantViolation(
            f"the vendor lists {inst.instance_id} ({inst.state}, label {inst.label!r}) and no rental knows it"
        )


def check_caps(engine: Engine) -> None:
    """Invariant 2: reserved + spent <= cap for every cap (the sums read from the tables)."""
    ct = BudgetCap.__table__  # type: ignore[attr-defined]
    rt = ReservationRow.__table__  # type: ignore[attr-defined]
    with engine.connect() as conn:
        caps = {r.name: float(r.cap_usd) for r in conn.execute(select(ct.c.name, ct.c.cap_usd))}
        sums = conn.execute(
            select(rt.c.budget, func.sum(rt.c.amount_usd)).where(rt.c.state.in_((HELD, SETTLED))).group_by(rt.c.budget)
        ).all()
    for name, total in sums:
        cap = caps.get(name)
        if cap is not None and float(total) > cap + EPS_USD:
            raise InvariantViolation(f"budget {name}: reserved + spent {float(total):.6f} exceeds its cap {cap:.6f}")


def check_ledger_since(engine: Engine, seq: int, prev: str) -> tuple[int, str]:
    """Invariant 3, incrementally: the rows after `seq` link to `prev` and hash to what they store."""
    lt = LedgerEvent.__table__  # type: ignore[attr-defined]
    with engine.connect() as conn:
        for r in conn.execute(select(lt).where(lt.c.seq > seq).order_by(lt.c.seq)):
            fields = {k: getattr(r, k) for k in _HASHED_FIELDS}
            if r.prev_hash != prev:
                raise InvariantViolation(f"ledger row {r.seq} does not link to the row before it")
            if row_hash(prev, fields) != r.row_hash:
                raise InvariantViolation(f"ledger row {r.seq} does not match its hash (altered)")
            seq, prev = int(r.seq), str(r.row_hash)
    return seq, prev


def check_one_create(creates_by_label: Counter[str]) -> None:
    """Invariant 4: the vendor accepted at most one create per (job, attempt): per rental label."""
    twice = sorted(label for label, n in creates_by_label.items() if n > 1)
    if twice:
        raise InvariantViolation(f"more than one vendor create for {twice[0]} ({creates_by_label[twice[0]]})")


def check_not_stuck(n: Nemesis) -> None:
    """Invariant 5: every job not in a terminal phase has a future wake-up (module docstring)."""
    pending = {job for m in n.broker if (job := m.job()) is not None}
    suspects = [j for j, p in n.phase.items() if p not in ("done", "failed", "cancelled") and j not in pending]
    if not suspects:
        return
    st = ProvisioningStateRow.__table__  # type: ignore[attr-defined]
    sv = SupervisionRow.__table__  # type: ignore[attr-defined]
    with n.engine.connect() as conn:
        rows = conn.execute(select(st.c.job_id, st.c.wake_at, st.c.state_json).where(st.c.job_id.in_(suspects)))
        states = {r.job_id: (r.wake_at, r.state_json) for r in rows}
        supervised = {r.job_id for r in conn.execute(select(sv.c.job_id).where(sv.c.job_id.in_(suspects)))}
    for job_id in suspects:
        state = states.get(job_id)
        if state is None:
            continue  # redrive's stranded rule sends `provision`
        wake_at, state_json = state
        if wake_at is not None:
            continue  # redrive's `overdue` sends `watch_boot`
        job_phase = codec.load_job(json.loads(state_json)).phase
        if job_phase in ("done", "failed"):
            continue
        if job_phase == "training" and job_id in supervised:
            continue  # rearm_monitors re-arms the chain
        raise InvariantViolation(
            f"job {job_id} ({n.phase[job_id]}, provisioning {job_phase}) is stuck: "
            "no message, no wake-up, nothing a sweep would find"
        )


def _no_shell(_inst: Instance, _job: str) -> Any:  # pragma: no cover - the nemesis plays the host
    raise AssertionError("the nemesis opens no shell")


def _no_bundle(_job: str) -> Any:  # pragma: no cover
    raise AssertionError("the nemesis pushes no bundle")


def _no_triage(_job: str, _tail: str) -> Any:  # pragma: no cover
    raise AssertionError("the nemesis triages no log")
