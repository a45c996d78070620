"""The training supervisor: the real-time driver from hand-over to a pulled, verified adapter.

`monitor_training` (Celery, one chain per running job, re-enqueued with a countdown) calls
`SupervisorService.poll`. One poll:

1. looks the job up in the provisioning state machine (the host it trains on);
2. on a host it has not started yet: has the job's files put there (the trainer's source
   files, job.json, data, the base model, and the newest checkpoint pulled from an earlier
   host) and starts `python -m trainer run --job-dir DIR --max-seconds S` detached. With a
   `TransferService` (production), the poll only asks for a transfer task
   (`app.services.transfer`: resumable, once per host, billed; a public model pinned to a commit
   is fetched by the host itself) and starts the slice once the transfer is done; without one
   (tests, small bundles), it pushes over SFTP itself;
3. otherwise probes it: the provider's view, and over SSH status.json, whether the trainer's
   process lives, the last slice's exit code and the tail of train.log; pulls every new complete
   checkpoint into the ArtifactStore;
4. judges the probe (`app.policy.supervision.assess`) and acts: next slice on the same host;
   a finished job's adapter pulled, verified, the host held for the next compatible job (stopped
   by the hold sweep if none comes), the job done (a gated job's seed
   run: when it is the last of its job's runs, the job is handed to `evaluate_job`); a
   dead trainer triaged (same host, replace the host, or stop the job and tell the operator);
   a lost host or a hang fed to `decide` as a `TrainerStatus`, which stops the host (never
   destroys it), records the failure against the machine and re-queues the job: provisioning
   rents a replacement (that machine excluded) and hands it back here, where the bundle and the
   newest pulled checkpoint are pushed and training resumes.

A host we stopped ourselves (the budget monitor at a cap, the reaper at the kill-time, the idle
watchdog, the reconciler, the operator: the rental is `stopped` in our registry, and the stop's
ledger event names who in `stopped_by`) is not lost: `judge_our_stop` pauses the job (phase
`paused`, a `job_paused` ledger event; nothing quarantined, no `host_lost`, nothing rented) until its
reason is gone, then the same host is started again (`instance_started`, `job_resumed`) and the
bundle with the newest pulled checkpoint is pushed as on a new host. A host the vendor stopped or
lost is lost as before.

Times are on the provisioning service's clock (the sim's scaled clock under the simulator).
Recovery time = the last good heartbeat before the loss -> the first training step on the new
host (from the new host's train.log); each recovery is a `recovery` ledger event.

No secret is pushed: the bundle holds code, data, the model and checkpoints only.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from sqlalchemy import Engine, select
from sqlmodel import Field, SQLModel

from app.alerts import Alert, Notifier
from app.artifacts import (
    ArtifactError,
    ArtifactStore,
    fetch_dir,
    latest_checkpoint,
    pull_adapter,
    pull_checkpoints,
)
from app.db import read_connection, write_transaction
from app.errors import BudgetExceeded
from app.jobs import JobStore
from app.ledger import Event, Ledger
from app.market import Instance, Market, MarketError
from app.policy.guardrails import as_step, believable_checkpoint_step, believable_step
from app.policy.provisioning import TrainerStatus
from app.policy.supervision import (
    HostProbe,
    Paused,
    ResumeFacts,
    StoppedByUs,
    StopReason,
    SupervisorConfig,
    assess,
    budget_guard_due,
    halve_micro_batch,
    judge_our_stop,
    read_with_facts,
    route_triage,
    settling,
    stop_reason_of,
)
from app.ports import HostShell
from app.rentals import Rental
from app.services.provisioning import ProvisioningService, Step
from app.services.transfer import HubFetch, PushFile, TransferPlan, TransferProgress, TransferService

__all__ = [
    "Bundle",
    "MonitorStep",
    "SupervisionRow",
    "SupervisorService",
    "TriageAnswer",
    "bundle_for_spec",
    "parse_probe_output",
    "remote_job_root",
    "step_advanced_at",
]

ShellFactory = Callable[[Instance, str], HostShell]  # (the instance as the provider sees it, job id)
DEFAULT_HF_ENDPOINT = "https://huggingface.co"
# A transfer task ends itself (lease released, progress kept) after this many clock seconds; the
# monitor asks for the next one, which resumes. Under the transfer task's soft time limit.
TRANSFER_TASK_S = 3000.0
MAX_TRANSFER_FAILURES = 3  # transfer tasks in a row that ended in an error having moved nothing


@dataclass(frozen=True, slots=True)
class TriageAnswer:
    state: str
    action: str
    needs_operator: bool = False
    evidence: tuple[str, ...] = ()
    remedy: str | None = None  # app.triage.rules.Remedy: what to do, as a named constant


Triage = Callable[[str, str], TriageAnswer]  # (job id, log tail)


class SupervisionRow(SQLModel, table=True):
    """What the supervisor knows about one job between polls (JSON), and its chain's sequence."""

    __tablename__ = "supervision"

    job_id: str = Field(primary_key=True)
    seq: int = 0
    state_json: str = "{}"
    updated_at: float = 0.0


_T = SupervisionRow.__table__  # type: ignore[attr-defined]


def checkpoint_safe(engine: Engine, job_id: str) -> bool:
    """Has every checkpoint the host reported complete been pulled off it? (True when nothing trains.)

    The budget monitor asks this before stopping a job at its cap, so a stop loses no finished work.
    """
    with read_connection(engine) as conn:
        row = conn.execute(select(_T.c.state_json).where(_T.c.job_id == job_id)).first()
    if row is None:
        return True
    w = Watch.from_json(row.state_json)
    return w.finished or w.pulled_step >= w.host_checkpoint_step


def step_advanced_at(engine: Engine, job_id: str, instance_id: str) -> float | None:
    """When the job's trainer on `instance_id` last advanced its (believed) step, on the
    supervisor's clock; None when no trainer is launched there (a push, a pause, a finished job).

    The idle watchdog asks this: a host whose step stands still past the grace is idle whatever
    GPU utilisation it prints."""
    with read_connection(engine) as conn:
        row = conn.execute(select(_T.c.state_json).where(_T.c.job_id == job_id)).first()
    if row is None:
        return None
    w = Watch.from_json(row.state_json)
    if w.finished or w.paused is not None or not w.launched or w.instance_id != instance_id:
        return None
    return w.last_progress_at


@dataclass
class Watch:
    """The supervisor's memory of a job (serialised in `supervision.state_json`)."""

    instance_id: str | None = None
    machine_id: str | None = None
    provider: str | None = None
    launched: bool = False
    slices: int = 0
    same_host_restarts: int = 0
    ssh_failures: int = 0
    launched_wall: float | None = None  # wall time of the current slice's launch
    step: int = 0
    max_steps: int | None = None
    loss: float | None = None
    steps_per_s: float | None = None  # on the driver's clock
    last_heartbeat_at: float | None = None  # clock time of the last good status.json
    last_ok_poll_at: float | None = None  # clock time of the last poll that reached the host
    last_progress_at: float | None = None
    last_step_seen_at: float | None = None
    pulled_step: int = 0
    host_checkpoint_step: int = 0  # the newest complete checkpoint the host reported (status.json)
    resume_step: int = 0
    # a loss waiting for its recovery
    lost_at: float | None = None
    lost_cause: str | None = None
    lost_machine: str | None = None
    lost_step: int | None = None
    recoveries: int = 0
    finished: bool = False
    failure: str | None = None
    # a pause after our own stop of the host (app.policy.supervision.judge_our_stop)
    paused: str | None = None  # the StopReason's value
    paused_step: int = 0  # the step reached before the stop
    restarted_at: float | None = None  # we started the stopped host again to resume (clock time)
    resumed_launch_at: float | None = None  # the relaunch after that restart; progress settles from here
    # out of memory: the micro-batch halved and the accumulation doubled (app.policy.supervision)
    micro_batch: list[int] | None = None  # [batch_size, grad_accum] in force; None: the job's own
    oom_halvings: int = 0

    @classmethod
    def from_json(cls, text: str) -> Watch:
        raw = json.loads(text or "{}")
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in raw.items() if k in known})

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


@dataclass(frozen=True, slots=True)
class MonitorStep:
    """What the Celery shell does next."""

    job_id: str
    next: Literal["monitor", "provision", "evaluate", "none"]
    wake_at: float | None = None
    seq: int | None = None
    detail: str = ""
    evaluate: str | None = None  # next == "evaluate": the gated job whose seed adapters are all pulled
    transfer: str | None = None  # also start a transfer task onto this instance (app.services.transfer)


@dataclass(frozen=True, slots=True)
class Bundle:
    """The job's files for a host: job.json (paths rewritten into the job dir) and (local, remote) files."""

    job_json: Mapping[str, Any]
    files: tuple[tuple[Path, str], ...] = field(default=())
    hub: tuple[str, str] | None = None  # (repo, revision): a public base model the host fetches itself


def remote_job_root(job_id: str) -> str:
    """The job's directory on the host, relative to the session's home."""
    return f"tuneharness-jobs/{job_id}"


def bundle_for_spec(train: Mapping[str, Any], *, base_dir: str | Path) -> Bundle:
    """The bundle of a job file's `train` section: base model under `base_model/`, data under `data/`
    (a `kind: command` section: its files under their own relative paths, app.trainspec)."""
    if train.get("kind") == "command":
        from app.trainspec import command_files, command_job_json

        shipped, ref = command_files(train, base_dir=base_dir)
        pinned = None if ref is None else (ref.hf, ref.revision)
        return Bundle(job_json=command_job_json(train), files=tuple(shipped), hub=pinned)
    job = dict(train)
    files: list[tuple[Path, str]] = []
    base = Path(base_dir)
    hub: tuple[str, str] | None = None
    for key in ("base_model", "train_file", "eval_file"):
        value = job.get(key)
        if value is None:
            continue
        if key == "base_model" and isinstance(value, Mapping):
            hub = (str(value["hf"]), str(value["revision"]))  # fetched by the host into base_model/
            job[key] = "base_model"
            continue
        local = Path(str(value)) if Path(str(value)).is_absolute() else base / str(value)
        if key == "base_model":
            remote = "base_model"
            if local.is_dir():
                files += [
                    (p, f"{remote}/{p.relative_to(local).as_posix()}") for p in sorted(local.rglob("*")) if p.is_file()
                ]
        else:
            remote = f"data/{local.name}"
            files.append((local, remote))
        job[key] = remote
    return Bundle(job_json=job, files=tuple(files), hub=hub)


def _trainer_sources(trainer_dir: Path) -> list[tuple[Path, str]]:
    return [(p, f"trainer/{p.name}") for p in sorted(trainer_dir.glob("*.py"))]


# -- parsing what the host said ----------------------------------------------------------------
_SECTIONS = ("@@STATUS", "@@ALIVE", "@@EXIT", "@@LOG")


def _probe_command(root: str) -> str:
    # Imported here: the rules compile their patterns on import, and every process that only opens
    # the database (each CLI command) would pay for it; a worker pays once.
    from app.triage.rules import DEFAULT_TAIL_BYTES

    r = shlex.quote(root)
    return (
        f"cd {r} 2>/dev/null || {{ echo '@@NOJOBDIR'; exit 0; }}; "
        "echo '@@STATUS'; cat job/status.json 2>/dev/null; echo; "
        "echo '@@ALIVE'; if [ -f trainer.pid ] && kill -0 \"$(cat trainer.pid)\" 2>/dev/null; "
        "then echo yes; else echo no; fi; "
        "echo '@@EXIT'; cat slice.exit 2>/dev/null; echo; "
        # The same read as `tuneharness triage FILE`, so both give one log the same verdict.
        f"echo '@@LOG'; tail -c {DEFAULT_TAIL_BYTES} job/train.log 2>/dev/null"
    )


def parse_probe_output(text: str) -> dict[str, Any]:
    """Split the probe command's output into status (dict), alive, exit_code, log."""
    parts: dict[str, list[str]] = {}
    current: str | None = None
    for line in text.splitlines():
        if line.strip() in _SECTIONS:
            current = line.strip()
            parts[current] = []
        elif current is not None:
            parts[current].append(line)
    status: dict[str, Any] = {}
    raw = "\n".join(parts.get("@@STATUS", [])).strip()
    if raw:
        try:
            loaded = json.loads(raw)
            status = loaded if isinstance(loaded, dict) else {}
        except ValueError:
            status = {}
    exit_text = "\n".join(parts.get("@@EXIT", [])).strip()
    exit_code = int(exit_text) if exit_text.lstrip("-").isdigit() else None
    alive = "\n".join(parts.get("@@ALIVE", [])).strip() == "yes"
    return {
        "status": status,
        "alive": alive,
        "exit_code": exit_code,
        "log": "\n".join(parts.get("@@LOG", [])),
        "no_job_dir": "@@NOJOBDIR" in text,
    }


def _wall_of(iso: str | None) -> float | None:
    """Seconds since the epoch of a trainer timestamp (`2026-01-02T03:04:05.678Z`)."""
    if not iso:
        return None
    try:
        return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _first_step_wall(log: str, *, after_step: int, not_before_wall: float) -> float | None:
    """Wall time of the first `step` line past `after_step` written at or after `not_before_wall`."""
    for line in log.splitlines():
        if len(line) < 30 or line[24:30] != " step ":
            continue
        wall = _wall_of(line[:24])
        fields = dict(kv.split("=", 1) for kv in line[30:].split() if "=" in kv)
        try:
            step = int(fields.get("step", "-1"))
        except ValueError:
            continue
        if wall is not None and wall >= not_before_wall - 1.0 and step > after_step:
            return wall
    return None


# -- the service -------------------------------------------------------------------------------
class SupervisorService:
    def __init__(
        self,
        engine: Engine,
        *,
        provisioning: ProvisioningService,
        shell_for: ShellFactory,
        store: ArtifactStore,
        staging: Path,
        bundle_for: Callable[[str], Bundle],
        trainer_dir: Path,
        notifier: Notifier,
        triage: Triage,
        jobs: JobStore | None = None,
        cfg: SupervisorConfig | None = None,
        transfers: TransferService | None = None,
        hf_endpoint: str = DEFAULT_HF_ENDPOINT,
    ) -> None:
        self.engine = engine
        self.provisioning = provisioning
        self.shell_for = shell_for
        self.store = store
        self.staging = staging
        self.bundle_for = bundle_for
        self.trainer_dir = trainer_dir
        self.notifier = notifier
        self.triage = triage
        self.jobs = jobs or JobStore(engine)
        self.cfg = cfg or SupervisorConfig()
        self.ledger = Ledger(engine)
        self.clock = provisioning.clock
        # None: the bundle is pushed inside the poll (small bundles, the simulator's hosts)
        self.transfers = transfers
        self.hf_endpoint = hf_endpoint

    # -- state -------------------------------------------------------------------------------
    def watch(self, job_id: str) -> tuple[Watch, int] | None:
        with read_connection(self.engine) as conn:
            row = conn.execute(select(_T).where(_T.c.job_id == job_id)).first()
        return None if row is None else (Watch.from_json(row.state_json), int(row.seq))

    def watches(self) -> dict[str, Watch]:
        with read_connection(self.engine) as conn:
            return {r.job_id: Watch.from_json(r.state_json) for r in conn.execute(select(_T))}

    def _claim(self, job_id: str, seq: int) -> Watch | None:
        """Take this poll: only the chain holding the current sequence number proceeds."""
        with write_transaction(self.engine, lock=f"tuneharness.supervision.{job_id}") as conn:
            row = conn.execute(select(_T).where(_T.c.job_id == job_id)).first()
            if row is None or int(row.seq) != seq:
                return None
            conn.execute(_T.update().where(_T.c.job_id == job_id).values(seq=seq + 1, updated_at=self.clock.now()))
            return Watch.from_json(row.state_json)

    def _save(self, job_id: str, watch: Watch) -> None:
        with write_transaction(self.engine, lock=f"tuneharness.supervision.{job_id}") as conn:
            conn.execute(
                _T.update().where(_T.c.job_id == job_id).values(state_json=watch.to_json(), updated_at=self.clock.now())
            )

    def chain_seq(self, job_id: str) -> int | None:
        """The sequence number the job's next poll holds (None: no chain). A poll sent now with it
        takes that poll's place: the one waiting out its countdown then finds the number taken and
        stops (`_claim`), so the job keeps one chain. The transfer task wakes the chain so that the
        trainer starts as soon as its files are on the host, not a monitor period later."""
        with self.engine.connect() as conn:
            seq = conn.execute(select(_T.c.seq).where(_T.c.job_id == job_id)).scalar()
        return None if seq is None else int(seq)

    def arm(self, job_id: str, instance_id: str) -> int:
        """The job was handed a host: (re)start its monitor chain; return the chain's sequence number."""
        with write_transaction(self.engine, lock=f"tuneharness.supervision.{job_id}") as conn:
            row = conn.execute(select(_T).where(_T.c.job_id == job_id)).first()
            watch = Watch() if row is None else Watch.from_json(row.state_json)
            seq = 1 if row is None else int(row.seq) + 1
            if watch.instance_id != instance_id:
                watch.instance_id, watch.launched, watch.ssh_failures = instance_id, False, 0
                watch.same_host_restarts = 0
            values = {"state_json": watch.to_json(), "seq": seq, "updated_at": self.clock.now()}
            if row is None:
                conn.execute(_T.insert().values(job_id=job_id, **values))
            else:
                conn.execute(_T.update().where(_T.c.job_id == job_id).values(**values))
        return seq

    def guard_budget(self, job_id: str) -> list[str]:
        """The job's caps, held by its own monitor chain at each poll the beat's budget monitor does not
        cover (beat or no beat, `_budget_guard_due`): when a cap
        it reserves against reaches its stop level (billed plus `budget_guard_s` of burn, every
        rental under the cap counted), this job's host is stopped for the budget and its next look
        pauses the job, as the budget monitor would. That monitor is a beat task: a paused or lost
        beat must not let a host bill past its cap. Returns the instances stopped; a failure is
        written down and the poll goes on (the beat's monitor is the other line of defence)."""
        from app.services.guardrails import sweep_budgets

        rentals = self.provisioning.rentals
        try:
            report = sweep_budgets(
                rentals.budget,
                notifier=self.notifier,
                rentals=rentals,
                markets=_MarketsOf(self.provisioning.market_for),
                now=self.clock.now(),
                checkpoint_safe=lambda job: checkpoint_safe(self.engine, job),
                job_phase=lambda job: "training",  # this job trains: its host is paused, never ended
                only_job=job_id,
            )
        except Exception as exc:
            self.ledger.append(
                Event(kind="supervisor_error", job=job_id, reason=f"budget guard: {type(exc).__name__}: {exc}"[:500])
            )
            return []
        for err in report.errors:
            self.ledger.append(Event(kind="supervisor_error", job=job_id, reason=f"budget guard: {err}"[:500]))
        return [i for i in report.stopped if i]

    def _budget_guard_due(self) -> bool:
        """Hold the caps in this poll unless the beat's budget monitor passed, with no error, recently
        enough (`app.policy.supervision.budget_guard_due`): one read, not a pass over the job's caps."""
        from app.liveness import BUDGET_MONITOR_CLEAN, last_successes
        from app.policy.provisioning import guarded_config

        at = last_successes(self.engine).get(BUDGET_MONITOR_CLEAN)
        age = None if at is None else self.clock.now() - self._clock_of(at)
        return budget_guard_due(
            monitor_ok_age_s=age, poll_s=self.cfg.monitor_s, guard_s=guarded_config().budget_guard_s
        )

    def end_chain(self, job_id: str) -> None:
        """The operator cancelled the job (app.services.lifecycle): a monitor task still queued finds
        its sequence number stale and ends; what the watch kept of the ended run's host (a loss
        waiting for its recovery, a pause) is dropped, its steps and pulled checkpoints kept."""
        with write_transaction(self.engine, lock=f"tuneharness.supervision.{job_id}") as conn:
            row = conn.execute(select(_T).where(_T.c.job_id == job_id)).first()
            if row is None:
                return
            w = Watch.from_json(row.state_json)
            w.launched, w.ssh_failures, w.paused, w.restarted_at, w.resumed_launch_at = False, 0, None, None, None
            w.lost_at = w.lost_cause = w.lost_machine = w.lost_step = None
            values = {"state_json": w.to_json(), "seq": int(row.seq) + 1, "updated_at": self.clock.now()}
            conn.execute(_T.update().where(_T.c.job_id == job_id).values(**values))

    def orphaned(self, *, grace_s: float | None = None) -> list[tuple[str, str]]:
        """Jobs training without a live monitor chain: no supervision row, or none touched for
        three poll periods plus `grace_s` (a chain lost with a crashed worker). (job, instance) pairs."""
        from app.policy.codec import load_job
        from app.services.provisioning import ProvisioningStateRow

        now = self.clock.now()
        window = 3 * max(self.cfg.monitor_s, self.cfg.repoll_s) + (60.0 if grace_s is None else grace_s)
        pt = ProvisioningStateRow.__table__  # type: ignore[attr-defined]
        with read_connection(self.engine) as conn:
            states = {r.job_id: load_job(json.loads(r.state_json)) for r in conn.execute(select(pt))}
            touched = {r.job_id: float(r.updated_at) for r in conn.execute(select(_T.c.job_id, _T.c.updated_at))}
        out = []
        for job_id, st in sorted(states.items()):
            if st.phase != "training" or st.attempt is None:
                continue
            last = touched.get(job_id)
            if last is None or now - last > window:
                out.append((job_id, st.attempt.instance_id))
        return out

    # -- one poll -----------------------------------------------------------------------------
    def poll(self, job_id: str, seq: int) -> MonitorStep:
        watch = self._claim(job_id, seq)
        if watch is None:
            return MonitorStep(job_id, "none", detail="stale chain")
        loaded = self.provisioning.state(job_id)
        if loaded is None or loaded[0].phase != "training" or loaded[0].attempt is None:
            phase = "unknown" if loaded is None else loaded[0].phase
            return MonitorStep(job_id, "none", detail=f"job is {phase}, not training")
        att = loaded[0].attempt
        if self._budget_guard_due():
            self.guard_budget(job_id)
        if watch.instance_id != att.instance_id:
            watch.instance_id, watch.launched, watch.ssh_failures, watch.same_host_restarts = (
                att.instance_id,
                False,
                0,
                0,
            )
        watch.machine_id, watch.provider = att.machine_id, att.provider
        market = self.provisioning.market_for(att.provider)
        try:
            inst = market.status(att.instance_id)
        except MarketError as exc:
            inst = Instance(
                att.provider,
                att.instance_id,
                att.machine_id,
                None,
                "unknown",
                f"provider unreachable: {exc}",
                None,
                None,
                None,
                None,
            )
        try:
            step = self._poll(job_id, watch, market, inst)
        except Exception as exc:  # a poll that fails must not end the job's supervision
            now = self.clock.now()
            self.ledger.append(
                Event(
                    kind="supervisor_error",
                    job=job_id,
                    instance=att.instance_id,
                    reason=f"{type(exc).__name__}: {exc}"[:500],
                    idempotency_key=f"{job_id}:supervisor_error:{int(now * 1000)}",
                )
            )
            step = self._next(job_id, self.cfg.repoll_s, f"poll failed: {exc}")
        self._save(job_id, watch)
        if step.next == "monitor":
            return MonitorStep(job_id, "monitor", step.wake_at, seq + 1, step.detail, transfer=step.transfer)
        return step

    def _shell(self, inst: Instance, job_id: str, rental: Rental | None = None) -> HostShell:
        """A shell on the job's host with the key that host was launched with: the key is per rental
        (`Rental.opened_by`), so a held host transferred to this job, or a standby host, opens with
        the key whose public half is on it; nothing more is installed on the host. `rental`: the
        host's rental as this poll read it already (its id, hence its key, never changes); None: read it."""
        if rental is None:
            rental = self.provisioning.rentals.by_instance(inst.provider, inst.instance_id)
        return self.shell_for(inst, rental.opened_by if rental is not None else job_id)

    def _next(self, job_id: str, delay_s: float, detail: str) -> MonitorStep:
        return MonitorStep(job_id, "monitor", self.clock.now() + delay_s, detail=detail)

    def _poll(self, job_id: str, w: Watch, market: Market, inst: Instance) -> MonitorStep:
        from app.ssh import SSHError  # paramiko loads only where hosts are polled

        now = self.clock.now()
        rental = self.provisioning.rentals.by_instance(inst.provider, inst.instance_id)  # read once per poll
        ours = self._our_stop(inst, rental)
        if ours is not None:
            return self._paused(job_id, w, market, inst, ours)
        restarting_for_s = None if w.restarted_at is None or w.launched else now - w.restarted_at
        settle = settling(
            resumed=w.resumed_launch_at is not None,
            step=w.step,
            paused_step=w.paused_step,
            since_launch_s=now - (w.resumed_launch_at or now),
            stall_s=self.provisioning.cfg.stall_s,
        )
        if inst.state == "gone" or (inst.state == "exited" and restarting_for_s is None):
            return self._lost(job_id, w, inst, f"provider reports the instance {inst.state}")
        if not w.launched and self.transfers is not None:
            waiting = self._await_transfer(job_id, w, inst)
            if waiting is not None:
                return waiting
        shell: HostShell | None = None
        try:
            shell = self._shell(inst, job_id, rental)
            if not w.launched:
                self._launch(job_id, w, shell, first_on_host=True)
                if w.restarted_at is not None:
                    w.restarted_at, w.resumed_launch_at = None, now
                return self._next(job_id, self.cfg.monitor_s, "trainer started")
            out = shell.run(_probe_command(remote_job_root(job_id)), timeout_s=30)
            parsed = parse_probe_output(out.stdout)
            pulled = self._pull(job_id, w, shell)
        except (OSError, EOFError, ArtifactError, SSHError) as exc:
            w.ssh_failures += 1
            probe = HostProbe(provider_state=inst.state, ssh_ok=False)
            verdict = assess(probe, ssh_failures=w.ssh_failures, cfg=self.cfg, restarting_for_s=restarting_for_s)
            if verdict.kind == "restarting":
                return self._next(job_id, self.cfg.repoll_s, verdict.why)
            if verdict.kind == "lost":
                return self._lost(job_id, w, inst, f"{verdict.why}: {exc}")
            # SSH down once, or the provider says running: look again soon. While the provider says
            # running, the state machine's stall window turns a host that never answers into a hang.
            if inst.state == "running" and not settle:
                step = self._observe(job_id, inst, w, phase=None)
                if step.phase == "queued":
                    return self._requeued(
                        job_id,
                        w,
                        step,
                        cause="hang",
                        evidence=f"no progress seen past the stall window; SSH failing: {exc}",
                    )
            return self._next(job_id, self.cfg.repoll_s, f"ssh failed: {exc}")
        finally:
            if shell is not None:
                shell.close()
        w.ssh_failures = 0
        w.last_ok_poll_at = now
        if parsed["no_job_dir"]:
            w.launched = False
            if self.transfers is not None:
                self.transfers.forget(job_id, inst.instance_id)
            return self._next(job_id, 0.0, "job directory missing on the host: push again")
        status: dict[str, Any] = parsed["status"]
        self._note_status(w, status, now=now, max_steps=self._max_steps(job_id))
        if w.lost_at is not None and w.step > w.resume_step:
            self._record_recovery(job_id, w, parsed["log"])
        probe = HostProbe(
            provider_state=inst.state,
            ssh_ok=True,
            alive=bool(parsed["alive"]),
            phase=status.get("phase"),
            step=w.step,
            exit_code=parsed["exit_code"],
        )
        verdict = assess(probe, ssh_failures=0, cfg=self.cfg)
        if verdict.kind == "training":
            if settling(
                resumed=w.resumed_launch_at is not None,
                step=w.step,
                paused_step=w.paused_step,
                since_launch_s=now - (w.resumed_launch_at or now),
                stall_s=self.provisioning.cfg.stall_s,
            ):
                return self._next(job_id, self.cfg.monitor_s, f"step {w.step}: catching up after the pause")
            w.resumed_launch_at = None
            step = self._observe(job_id, inst, w, phase="training")
            if step.phase == "queued":
                return self._requeued(job_id, w, step, cause="hang", evidence="no training progress (stall window)")
            return self._next(job_id, self.cfg.monitor_s, f"step {w.step}" + (f", pulled {pulled}" if pulled else ""))
        if verdict.kind == "slice_done":
            self._relaunch(job_id, w, market, inst, why="slice cap reached")
            return self._next(job_id, self.cfg.monitor_s, "next slice started")
        if verdict.kind == "finished":
            return self._finish(job_id, w, market, inst)
        return self._dead(job_id, w, market, inst, parsed, verdict.why)

    # -- the pieces ----------------------------------------------------------------------------
    def _note_status(self, w: Watch, status: Mapping[str, Any], *, now: float, max_steps: int | None = None) -> None:
        """Take in the host's status.json. Its numbers are the host's word: a step that goes backwards
        or passes the job's `max_steps`, or a checkpoint ahead of the step, is not believed."""
        max_steps = max_steps if max_steps is not None else w.max_steps
        step = believable_step(reported=status.get("step") or 0, previous=w.step, max_steps=max_steps)
        hb_wall = _wall_of(status.get("updated_at"))
        if hb_wall is not None:
            w.last_heartbeat_at = self._clock_of(hb_wall)
        if step > w.step and w.last_step_seen_at is not None and now > w.last_step_seen_at:
            rate = (step - w.step) / (now - w.last_step_seen_at)
            w.steps_per_s = rate if w.steps_per_s is None else 0.5 * w.steps_per_s + 0.5 * rate
        if step != w.step or w.last_progress_at is None:
            w.last_progress_at = now
            w.last_step_seen_at = now
        w.step = step
        if max_steps is not None:
            w.max_steps = max_steps  # the job's own, never the host's
        elif status.get("max_steps") is not None:
            w.max_steps = as_step(status["max_steps"])
        if status.get("loss") is not None:
            w.loss = float(status["loss"])
        if status.get("last_checkpoint_step") is not None:
            w.host_checkpoint_step = believable_checkpoint_step(
                reported=status["last_checkpoint_step"], previous=w.host_checkpoint_step, step=w.step
            )

    def _max_steps(self, job_id: str) -> int | None:
        """The job's `max_steps` from its own job file (the host's status.json may say anything)."""
        record = self.jobs.get(job_id)
        train = record.spec.get("train") if record is not None else None
        return as_step(train.get("max_steps")) if isinstance(train, Mapping) else None

    def _clock_of(self, wall: float) -> float:
        """A wall timestamp on the service's clock (scaled under the simulator)."""
        return self.clock.from_wall(wall)

    def _wall_s(self, clock_s: float) -> float:
        return self.clock.wall_seconds(clock_s)

    def _pull(self, job_id: str, w: Watch, shell: HostShell) -> str | None:
        report = pull_checkpoints(
            shell,
            f"{remote_job_root(job_id)}/job",
            self.store,
            job=job_id,
            staging=self.staging / job_id,
            newest_only=True,
        )
        newest = latest_checkpoint(self.store, job=job_id)
        if newest is not None:
            w.pulled_step = max(w.pulled_step, int(newest.split("-")[1]))
        for name in report.pulled:
            self.ledger.append(
                Event(
                    kind="checkpoint_pulled",
                    job=job_id,
                    instance=w.instance_id,
                    provider=w.provider,
                    machine=w.machine_id,
                    reason=name,
                    payload={"step": int(name.split("-")[1])},
                    idempotency_key=f"{job_id}:pulled:{name}",
                )
            )
        return report.pulled[0] if report.pulled else None

    def _push_bundle(self, job_id: str, w: Watch, shell: HostShell) -> int:
        """Code, job.json, data, model, and the newest pulled checkpoint; returns its step (0: none)."""
        root = remote_job_root(job_id)
        bundle = self.bundle_for(job_id)
        for local, rel in _trainer_sources(self.trainer_dir):
            shell.put(local, f"{root}/code/{rel}")
        stage = self.staging / job_id / "bundle"
        stage.mkdir(parents=True, exist_ok=True)
        job_json = stage / "job.json"
        job_json.write_text(json.dumps(_job_json(bundle, w), indent=1, sort_keys=True), encoding="utf-8")
        for local, rel in bundle.files:
            shell.put(local, f"{root}/job/{rel}")
        shell.put(job_json, f"{root}/job/job.json")
        name = latest_checkpoint(self.store, job=job_id)
        if name is None:
            return 0
        local_ckpt = fetch_dir(self.store, f"jobs/{job_id}/checkpoints/{name}", stage / name)
        files = sorted(p for p in local_ckpt.rglob("*") if p.is_file() and p.name != "COMPLETE")
        for p in files:
            shell.put(p, f"{root}/job/checkpoints/{name}/{p.relative_to(local_ckpt).as_posix()}")
        shell.put(local_ckpt / "COMPLETE", f"{root}/job/checkpoints/{name}/COMPLETE")  # last: complete only now
        return int(name.split("-")[1])

    # -- the transfer onto a new host (app.services.transfer) -------------------------------------
    def _await_transfer(self, job_id: str, w: Watch, inst: Instance) -> MonitorStep | None:
        """None when the job's files are on the host (the slice may start); otherwise the next look,
        with a transfer task asked for when none runs. A failed transfer fails the start on this host."""
        assert self.transfers is not None
        t = self.transfers.get(job_id, inst.instance_id)
        if t is not None and t.done:
            newest = latest_checkpoint(self.store, job=job_id)
            if newest is None or int(newest.split("-")[1]) <= t.resume_step:
                return None
            self.transfers.forget(job_id, inst.instance_id)  # a newer checkpoint: only it moves (manifest)
            t = None
        if t is not None and t.state == "failed":
            step = self._observe(job_id, inst, w, phase="failed", error=f"transfer failed: {t.error}")
            return self._requeued(job_id, w, step, cause="lost", evidence=f"transfer onto the host failed: {t.error}")
        if t is not None and t.failures >= MAX_TRANSFER_FAILURES:
            # the host takes no file (SSH down while the provider says running): judged as lost
            return self._lost(job_id, w, inst, f"{t.failures} transfer tasks in a row moved nothing: {t.error}")
        start = self.transfers.request(job_id, inst.provider, inst.instance_id)
        detail = "transfer queued" if t is None else _transfer_detail(t)
        if start:
            self.jobs.set_phase(job_id, "training", detail=f"moving the job's files onto {inst.instance_id}")
        return MonitorStep(
            job_id,
            "monitor",
            self.clock.now() + self.cfg.repoll_s,
            detail=detail,
            transfer=inst.instance_id if start else None,
        )

    def transfer_plan(self, job_id: str) -> TransferPlan:
        """What goes onto a new host: code first, then data, a private model, the newest pulled
        checkpoint (its COMPLETE last), job.json; a public pinned model is fetched by the host."""
        root = remote_job_root(job_id)
        bundle = self.bundle_for(job_id)
        stage = self.staging / job_id / "bundle"
        stage.mkdir(parents=True, exist_ok=True)
        files = [PushFile(local, f"code/{rel}") for local, rel in _trainer_sources(self.trainer_dir)]
        files += [PushFile(local, f"job/{rel}") for local, rel in bundle.files]
        name = latest_checkpoint(self.store, job=job_id)
        step = 0
        if name is not None:
            local_ckpt = fetch_dir(self.store, f"jobs/{job_id}/checkpoints/{name}", stage / name)
            ck = sorted(p for p in local_ckpt.rglob("*") if p.is_file() and p.name != "COMPLETE")
            files += [PushFile(p, f"job/checkpoints/{name}/{p.relative_to(local_ckpt).as_posix()}") for p in ck]
            files.append(PushFile(local_ckpt / "COMPLETE", f"job/checkpoints/{name}/COMPLETE"))
            step = int(name.split("-")[1])
        job_json = stage / "job.json"
        watched = self.watch(job_id)
        text = json.dumps(_job_json(bundle, None if watched is None else watched[0]), indent=1, sort_keys=True)
        if not job_json.is_file() or job_json.read_text(encoding="utf-8") != text:
            job_json.write_text(text, encoding="utf-8")
        files.append(PushFile(job_json, "job/job.json"))
        fetch = None
        if bundle.hub is not None:
            fetch = HubFetch(self.hf_endpoint, bundle.hub[0], bundle.hub[1], "job/base_model")
        return TransferPlan(root=root, files=tuple(files), fetch=fetch, resume_step=step)

    def run_transfer(
        self, job_id: str, instance_id: str, *, deadline_s: float = TRANSFER_TASK_S
    ) -> TransferProgress | None:
        """The transfer task's body: move the plan onto the job's current host until done or the
        deadline; None when the job is not on that host any more or another task moves it."""
        assert self.transfers is not None, "run_transfer needs a TransferService"
        loaded = self.provisioning.state(job_id)
        if loaded is None or loaded[0].attempt is None or loaded[0].attempt.instance_id != instance_id:
            return None
        att = loaded[0].attempt
        inst = self.provisioning.market_for(att.provider).status(instance_id)
        shell = self._shell(inst, job_id)
        try:
            return self.transfers.run(
                job_id, att.provider, instance_id, shell=shell, plan=self.transfer_plan(job_id), deadline_s=deadline_s
            )
        finally:
            shell.close()

    def _start_slice(self, job_id: str, w: Watch, shell: HostShell) -> None:
        root = remote_job_root(job_id)
        slice_wall_s = max(1.0, self._wall_s(self.cfg.slice_s))
        steps = f" --slice-steps {self.cfg.slice_steps}" if self.cfg.slice_steps else ""
        inner = (
            'cd code && "$0" -m trainer run --job-dir ../job --max-seconds '
            + f"{slice_wall_s:.0f}"
            + steps
            + "; echo $? > ../slice.exit"
        )
        from app.hoststack import ACTIVATE_STACK  # what the bootstrap installed goes first on PYTHONPATH

        command = (
            ACTIVATE_STACK
            + f"cd {shlex.quote(root)} && rm -f slice.exit && PY=$(command -v python3 || command -v python) && "
            f'nohup setsid sh -c {shlex.quote(inner)} "$PY" > slice.out 2>&1 < /dev/null & '
            f"echo $! > {shlex.quote(root)}/trainer.pid"
        )
        # the `&` binds to the nohup pipeline; $! is the detached shell's pid
        res = shell.run(command, timeout_s=30)
        if res.exit_code != 0:
            raise OSError(f"trainer launch failed (exit {res.exit_code}): {res.stderr[-300:]}")
        w.launched_wall = time.time()
        w.slices += 1
        self.ledger.append(
            Event(
                kind="training_started",
                job=job_id,
                instance=w.instance_id,
                provider=w.provider,
                machine=w.machine_id,
                reason=f"slice {w.slices}",
                payload={
                    "slice": w.slices,
                    "resume_step": w.resume_step,
                    "from_step": w.step,
                    "max_seconds": slice_wall_s,
                    "slice_steps": self.cfg.slice_steps,
                },
                idempotency_key=f"{job_id}:slice:{w.instance_id}:{w.slices}",
            )
        )

    def _launch(self, job_id: str, w: Watch, shell: HostShell, *, first_on_host: bool) -> None:
        if first_on_host:
            done = None if self.transfers is None else self.transfers.get(job_id, w.instance_id or "")
            w.resume_step = done.resume_step if done is not None else self._push_bundle(job_id, w, shell)
            w.step = w.resume_step
            w.last_progress_at = self.clock.now()
            w.last_step_seen_at = None
            self.jobs.set_phase(job_id, "training", detail=f"on {w.instance_id} from step {w.resume_step}")
        self._start_slice(job_id, w, shell)
        w.launched = True

    def _micro_batch(self, job_id: str, w: Watch) -> tuple[int, int] | None:
        """(batch_size, grad_accum) the trainer runs with now; None for a job.json without a
        batch_size (not one a job file makes: it requires one)."""
        job = _job_json(self.bundle_for(job_id), w)
        if "batch_size" not in job:
            return None
        return int(job["batch_size"]), int(job.get("grad_accum", 1))

    def _apply_micro_batch(
        self, job_id: str, w: Watch, inst: Instance, before: tuple[int, int], after: tuple[int, int], *, same_host: bool
    ) -> None:
        """An out-of-memory death: the next slice runs half the micro-batch with twice the
        accumulation (same effective batch, same data order), written into job.json on this host
        (or carried by the bundle to the next one), and recorded."""
        w.micro_batch, w.oom_halvings = list(after), w.oom_halvings + 1
        self.ledger.append(
            Event(
                kind="micro_batch_halved",
                job=job_id,
                instance=w.instance_id,
                provider=w.provider,
                machine=w.machine_id,
                reason=f"out of memory: micro-batch {before[0]} -> {after[0]}, accumulation {before[1]} -> {after[1]}",
                payload={"before": list(before), "after": list(after), "halvings": w.oom_halvings, "step": w.step},
                idempotency_key=f"{job_id}:oom_halved:{w.oom_halvings}",
            )
        )
        if not same_host:
            return
        stage = self.staging / job_id / "bundle"
        stage.mkdir(parents=True, exist_ok=True)
        local = stage / "job.json"
        local.write_text(json.dumps(_job_json(self.bundle_for(job_id), w), indent=1, sort_keys=True), "utf-8")
        shell = self._shell(inst, job_id)
        try:
            shell.put(local, f"{remote_job_root(job_id)}/job/job.json")
        finally:
            shell.close()

    def _relaunch(self, job_id: str, w: Watch, market: Market, inst: Instance, *, why: str) -> None:
        shell = self._shell(inst, job_id)
        try:
            self._start_slice(job_id, w, shell)
        finally:
            shell.close()
        self.provisioning.reputation.record(
            w.provider or "", w.machine_id or "", "slice_finished", now=self.clock.now()
        )
        # The relaunched trainer resumes from its newest checkpoint: a step back to there is believed.
        w.step = min(w.step, max(w.host_checkpoint_step, w.pulled_step))
        w.last_step_seen_at = None
        w.last_progress_at = self.clock.now()

    def _observe(
        self,
        job_id: str,
        inst: Instance,
        w: Watch,
        *,
        phase: Literal["training", "failed"] | None,
        error: str | None = None,
    ) -> Step:
        """Feed the trainer's state to the provisioning state machine (hang and loss detection there)."""
        obs = TrainerStatus(
            instance=inst,
            phase=phase,
            work_s=float(w.step),
            checkpoint_work_s=float(w.pulled_step),
            heartbeat_at=w.last_heartbeat_at,
            error=error,
        )
        return self.provisioning.observe(job_id, obs)

    def _our_stop(self, inst: Instance, rental: Rental | None) -> StoppedByUs | None:
        """The fact: did we stop this host, and who? Our registry holds the rental (`rental`, the
        host's row) `stopped` only after one of our stops; the stop's ledger event names who in `stopped_by`."""
        if rental is None or rental.state != "stopped":
            return None
        stops = [
            r
            for r in self.ledger.rows(job=rental.job, kind=("instance_stopped", "rental_stopped"))
            if r.instance == inst.instance_id and r.payload.get("to", "stopped") == "stopped"
        ]
        last = stops[-1] if stops else None
        return StoppedByUs(
            reason=stop_reason_of(None if last is None else last.payload.get("stopped_by")),
            stopped_at=rental.stopped_at if rental.stopped_at is not None else self.clock.now(),
            evidence="" if last is None else last.reason,
        )

    def _paused(self, job_id: str, w: Watch, market: Market, inst: Instance, stop: StoppedByUs) -> MonitorStep:
        """Our stop: the job waits (nothing quarantined, nothing rented) until the reason is gone,
        then its host is started again and the job goes on from its newest checkpoint."""
        from app.services.guardrails import budget_room

        now = self.clock.now()
        rentals = self.provisioning.rentals
        rental = rentals.by_instance(inst.provider, inst.instance_id)
        if rental is None:  # gone from the registry since _our_stop looked
            return self._next(job_id, self.cfg.repoll_s, "rental changed; look again")
        facts = ResumeFacts(budget_room=budget_room(rentals.budget, rentals, rental, now=now), kill_at=rental.kill_at)
        decision = judge_our_stop(stop, facts, now=now)
        if isinstance(decision, Paused):
            if w.paused != decision.reason.value:
                w.paused, w.paused_step, w.launched = decision.reason.value, w.step, False
                w.restarted_at = w.resumed_launch_at = None
            record = self.jobs.get(job_id)
            if record is None or record.phase != "paused" or record.detail != decision.why:
                self.ledger.append(  # once per stop (its idempotency key); the detail follows the facts
                    Event(
                        kind="job_paused",
                        job=job_id,
                        instance=inst.instance_id,
                        provider=inst.provider,
                        machine=w.machine_id,
                        reason=decision.why,
                        payload={
                            "stopped_by": decision.reason.value,
                            "stop": stop.evidence,
                            "stopped_at": stop.stopped_at,
                            "step": w.step,
                            "pulled_step": w.pulled_step,
                        },
                        idempotency_key=f"{job_id}:paused:{inst.instance_id}:{int(stop.stopped_at * 1000)}",
                    )
                )
                self.jobs.set_phase(job_id, "paused", detail=decision.why)
            return self._next(job_id, self.cfg.paused_poll_s, decision.why)
        if inst.state == "gone":  # the vendor lost the stopped host: recover elsewhere, as any loss
            w.paused = None
            return self._lost(job_id, w, inst, f"provider reports the instance gone while paused ({stop.reason.value})")
        refused = self._restart(job_id, w, market, rental, stop, why=decision.why)
        if refused is not None:
            self.jobs.set_phase(job_id, "paused", detail=f"paused; resume waits: {refused}")
            return self._next(job_id, self.cfg.paused_poll_s, refused)
        self.ledger.append(
            Event(
                kind="job_resumed",
                job=job_id,
                instance=inst.instance_id,
                provider=inst.provider,
                machine=w.machine_id,
                reason=decision.why,
                payload={"stopped_by": stop.reason.value, "stopped_at": stop.stopped_at, "step": w.step},
                idempotency_key=f"{job_id}:resumed:{inst.instance_id}:{int(stop.stopped_at * 1000)}",
            )
        )
        if w.paused is None:  # never seen paused (stopped and resumable between two polls)
            w.paused_step = w.step
        w.paused, w.launched, w.ssh_failures = None, False, 0
        w.restarted_at, w.resumed_launch_at = now, None
        self.jobs.set_phase(job_id, "training", detail=f"resuming on {w.machine_id}: {decision.why}")
        return self._next(job_id, self.cfg.repoll_s, f"host started again: {decision.why}")

    def _restart(
        self, job_id: str, w: Watch, market: Market, rental: Rental, stop: StoppedByUs, *, why: str
    ) -> str | None:
        """Start the stopped host again, its reservation for the rest of the training committed
        first (as for a create); None when it runs again, else why not (the job stays paused)."""
        from app.policy.fleet import reservation_usd

        now = self.clock.now()
        rentals = self.provisioning.rentals
        loaded = self.provisioning.state(job_id)
        if loaded is None:
            return "the job's provisioning state is missing"
        owner = self.provisioning.owner_of(job_id)
        budget_name = owner if owner in rentals.budget.caps() else "default"
        offer = rentals.offer_of(rental.id)
        left = 1.0 if not w.max_steps else min(1.0, max(0.05, 1.0 - w.paused_step / w.max_steps))
        shape = loaded[0].shape
        reserve = reservation_usd(
            offer,
            replace(shape, train_s=shape.train_s * left),
            self.provisioning.cfg,
            pull=False,
            dph_total=rental.rate_usd_per_hour or offer.dph_total,
            storage_per_gb_month=rental.storage_per_gb_month,
            disk_gb=rental.disk_gb,
        )
        try:
            made = rentals.reserve_for(
                job=owner,
                budget_name=budget_name,
                reserve_usd=reserve,
                dph_total=offer.dph_total,
                num_gpus=offer.num_gpus,
                max_s=max(0.0, rental.kill_at - now),
                idempotency_key=f"reserve:restart:{rental.id}:{int(now * 1000)}",
                now=now,
            )
        except BudgetExceeded as exc:
            return f"the budget refused the restart's reservation: {exc}"
        failed: str | None = None
        try:
            if self._cancelled(job_id):  # `tuneharness cancel` landed while this poll ran
                failed = "the job was cancelled"
            elif not rentals.restart(
                rental.id,
                market=market,
                reservations=made,
                now=now,
                reason=f"resumed after a {stop.reason.value} stop: {why}",
                evidence={"stopped_by": stop.reason.value},
            ):
                failed = "the rental is no longer stopped"
        except MarketError as exc:
            failed = f"starting the host failed, again soon: {exc}"
        if failed is not None:
            for r in made:
                rentals.budget.release(r.id, reason=f"restart did not happen: {failed}")
            return failed
        if self._cancelled(job_id):
            # The cancel's stops ran between the check above and the start: the host it found
            # stopped now bills again, so it is stopped here, as the operator asked.
            rentals.stop(
                rental.id,
                market=market,
                reason="the job was cancelled while its host restarted",
                kind="instance_stopped",
                now=self.clock.now(),
                evidence={"stopped_by": StopReason.OPERATOR.value},
            )
            return "the job was cancelled"
        return None

    def _cancelled(self, job_id: str) -> bool:
        rec = self.jobs.get(job_id)
        return rec is not None and rec.phase == "cancelled"

    def _lost(self, job_id: str, w: Watch, inst: Instance, why: str) -> MonitorStep:
        """The host is lost: rental marked lost (if gone), ledger + alert, then the state machine re-queues."""
        now = self.clock.now()
        rental = self.provisioning.rentals.by_instance(inst.provider, inst.instance_id)
        if rental is not None and inst.state in ("gone", "exited"):
            self.provisioning.rentals.transition(
                rental.id,
                to="lost",
                from_states=("active", "stopped"),
                kind="instance_lost",
                reason=why,
                now=now,
                evidence={"provider_state": inst.state},
            )
        seen = inst if inst.state in ("gone", "exited") else replace(inst, state="unknown")
        step = self._observe(job_id, seen, w, phase=None)
        return self._requeued(job_id, w, step, cause="lost", evidence=why)

    def _requeued(self, job_id: str, w: Watch, step: Step, *, cause: str, evidence: str) -> MonitorStep:
        now = self.clock.now()
        if step.phase != "queued":
            return self._next(job_id, self.cfg.monitor_s, f"state machine kept the job {step.phase}")
        last_good = w.last_heartbeat_at if cause == "lost" else w.last_progress_at
        w.lost_at = last_good if last_good is not None else now
        w.lost_cause, w.lost_machine, w.lost_step = cause, w.machine_id, w.step
        w.launched = False
        self.ledger.append(
            Event(
                kind="host_lost",
                job=job_id,
                instance=w.instance_id,
                provider=w.provider,
                machine=w.machine_id,
                reason=evidence,
                payload={
                    "cause": cause,
                    "last_good_at": w.lost_at,
                    "detected_at": now,
                    "last_ok_poll_at": w.last_ok_poll_at,
                    # the loss came after the last poll that reached the host
                    "detection_at_most_s": None if w.last_ok_poll_at is None else now - w.last_ok_poll_at,
                    "step": w.step,
                    "pulled_step": w.pulled_step,
                },
                idempotency_key=f"{job_id}:host_lost:{w.instance_id}",
            )
        )
        self.notifier.notify(
            Alert(
                "host_lost",
                f"{w.machine_id} ({cause}): {evidence}",
                job=job_id,
                details={"instance": w.instance_id, "step": w.step, "resume_from": w.pulled_step},
                key=f"host_lost:{job_id}:{w.instance_id}",
            )
        )
        self.jobs.set_phase(job_id, "provisioning", detail=f"host {w.machine_id} lost ({cause}); renting a replacement")
        return MonitorStep(
            job_id, "provision", step.wake_at if step.wake_at is not None else now, detail=f"host lost ({cause})"
        )

    def _record_recovery(self, job_id: str, w: Watch, log: str) -> None:
        first = _first_step_wall(log, after_step=w.resume_step, not_before_wall=w.launched_wall or 0.0)
        resumed_at = self._clock_of(first) if first is not None else self.clock.now()
        lost_at = w.lost_at if w.lost_at is not None else resumed_at
        w.recoveries += 1
        lost_steps = None if w.lost_step is None else max(0, w.lost_step - w.resume_step)
        self.ledger.append(
            Event(
                kind="recovery",
                job=job_id,
                instance=w.instance_id,
                provider=w.provider,
                machine=w.machine_id,
                reason=f"resumed from step {w.resume_step} after {w.lost_cause}",
                payload={
                    "cause": w.lost_cause,
                    "lost_machine": w.lost_machine,
                    "machine_id": w.machine_id,
                    "lost_at": lost_at,
                    "resumed_at": resumed_at,
                    "recovery_s": max(0.0, resumed_at - lost_at),
                    "lost_step": w.lost_step,
                    "resume_step": w.resume_step,
                    "lost_steps": lost_steps,
                },
                idempotency_key=f"{job_id}:recovery:{w.instance_id}",
            )
        )
        self.notifier.notify(
            Alert(
                "running_again",
                f"resumed on {w.machine_id} from step {w.resume_step}",
                job=job_id,
                details={"recovery_s": round(max(0.0, resumed_at - lost_at), 1), "lost_machine": w.lost_machine},
                key=f"running_again:{job_id}:{w.instance_id}",
            )
        )
        w.lost_at = w.lost_cause = w.lost_machine = w.lost_step = None

    def _finish(self, job_id: str, w: Watch, market: Market, inst: Instance) -> MonitorStep:
        shell = self._shell(inst, job_id)
        try:
            self._pull(job_id, w, shell)
            got = pull_adapter(
                shell, f"{remote_job_root(job_id)}/job", self.store, job=job_id, staging=self.staging / job_id
            )
            from app.services.joblogs import keep_train_log  # what `tuneharness logs` reads once the host stops

            keep_train_log(shell, self.store, job_id=job_id, instance_id=inst.instance_id, staging=self.staging)
        finally:
            shell.close()
        if not got:
            return self._next(job_id, self.cfg.repoll_s, "finished but no complete adapter yet")
        verify = self.staging / job_id / "verify-adapter"
        fetch_dir(self.store, f"jobs/{job_id}/adapter", verify)  # raises ArtifactError on any mismatch
        self.ledger.append(
            Event(
                kind="adapter_pulled",
                job=job_id,
                instance=w.instance_id,
                provider=w.provider,
                machine=w.machine_id,
                reason="final adapter pulled and verified",
                payload={"key": f"jobs/{job_id}/adapter", "step": w.step},
                idempotency_key=f"{job_id}:adapter_pulled",
            )
        )
        self.provisioning.observe(
            job_id,
            TrainerStatus(
                instance=inst,
                phase="finished",
                work_s=float(w.step),
                checkpoint_work_s=float(w.step),
                heartbeat_at=w.last_heartbeat_at,
            ),
        )
        w.finished = True
        # A job without a gate is done; a seed run of a gated job is done, and the last one to
        # finish hands the job to evaluation.
        gated = self.jobs.run_finished(job_id, detail=f"adapter at jobs/{job_id}/adapter ({w.step} steps)")
        if gated is not None:
            return MonitorStep(job_id, "evaluate", evaluate=gated, detail=f"finished: {gated} handed to evaluation")
        return MonitorStep(job_id, "none", detail="finished: adapter pulled")

    def _dead(
        self, job_id: str, w: Watch, market: Market, inst: Instance, parsed: Mapping[str, Any], why: str
    ) -> MonitorStep:
        answer = self.triage(job_id, str(parsed["log"]))
        facts = read_with_facts(
            answer.state, answer.remedy, exit_code=parsed["exit_code"], step=w.step, max_steps=w.max_steps
        )
        if facts.fact is not None:
            action = (
                "relaunch on the same host: the run ends at once with its adapter"
                if facts.state == "completed"
                else "resume on the same host"
            )
            answer = TriageAnswer(
                facts.state, action, needs_operator=False, evidence=(facts.fact, *answer.evidence), remedy=facts.remedy
            )
        route = route_triage(
            answer.state,
            answer.action,
            exit_code=parsed["exit_code"],
            same_host_restarts=w.same_host_restarts,
            cfg=self.cfg,
            remedy=answer.remedy,
        )
        halved: tuple[tuple[int, int], tuple[int, int]] | None = None
        before = self._micro_batch(job_id, w)
        if answer.state == "oom" and route != "stop" and before is not None:
            nxt = halve_micro_batch(*before, halvings=w.oom_halvings)
            if isinstance(nxt, str):
                answer = TriageAnswer("oom", nxt, needs_operator=True, evidence=answer.evidence, remedy=answer.remedy)
                route = "stop"
            else:
                halved = (before, nxt)
        self.ledger.append(
            Event(
                kind="trainer_died",
                job=job_id,
                instance=w.instance_id,
                provider=w.provider,
                machine=w.machine_id,
                reason=why,
                payload={
                    "triage_state": answer.state,
                    "triage_action": answer.action,
                    "needs_operator": answer.needs_operator,
                    "route": route,
                    "remedy": answer.remedy,
                    "exit_code": parsed["exit_code"],
                    "step": w.step,
                    "evidence": list(answer.evidence)[:5],
                },
                idempotency_key=f"{job_id}:died:{w.instance_id}:{w.slices}",
            )
        )
        if halved is not None:
            self._apply_micro_batch(job_id, w, inst, *halved, same_host=route == "same_host")
        if route == "same_host":
            w.same_host_restarts += 1
            self._relaunch(job_id, w, market, inst, why=f"triage {answer.state}: {answer.action}")
            return self._next(job_id, self.cfg.monitor_s, "trainer restarted on the same host")
        if route == "replace":
            step = self._observe(job_id, inst, w, phase="failed", error=f"{answer.state}: {why}")
            return self._requeued(job_id, w, step, cause="lost", evidence=f"trainer died ({answer.state}); replacing")
        self.provisioning.give_up_training(
            job_id, reason=f"training failed ({answer.state})", evidence=f"{why}; triage: {answer.action}"
        )
        w.failure = f"{answer.state}: {answer.action}"
        self.jobs.set_phase(job_id, "failed", detail=f"trainer died: {answer.state}; {answer.action}")
        self.jobs.run_failed(job_id, detail=f"trainer died: {answer.state}")
        return MonitorStep(job_id, "none", detail="job stopped; operator told")


class _MarketsOf(Mapping[str, Market]):
    """The provisioning service's markets as the mapping the sweeps read (built on first use)."""

    def __init__(self, market_for: Callable[[str], Market]) -> None:
        self._market_for = market_for

    def __getitem__(self, name: str) -> Market:
        return self._market_for(name)

    def get(self, name: str, default: Any = None) -> Any:
        try:
            return self._market_for(name)
        except Exception:
            return default

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def _job_json(bundle: Bundle, w: Watch | None) -> dict[str, Any]:
    """The job.json a host gets: the bundle's, with the micro-batch an out-of-memory death left."""
    out = dict(bundle.job_json)
    if w is not None and w.micro_batch is not None:
        out["batch_size"], out["grad_accum"] = int(w.micro_batch[0]), int(w.micro_batch[1])
    return out


def recoveries(ledger: Ledger, *, job: str | None = None, since: datetime | None = None) -> list[dict[str, Any]]:
    """Every recovery in the ledger (payloads), oldest first."""
    return [dict(r.payload) for r in ledger.rows(job=job, kind="recovery", since=since)]


def interruptions(ledger: Ledger, *, since: datetime | None = None) -> Sequence[dict[str, Any]]:
    return [dict(r.payload) for r in ledger.rows(kind="host_lost", since=since)]


def _transfer_detail(t: TransferProgress) -> str:
    """One line of a transfer's progress: bytes done of total, rate, the file moving now."""
    rate = "" if not t.rate_bytes_per_s else f" at {t.rate_bytes_per_s / 1e6:.1f} MB/s"
    now = f" ({t.current})" if t.current else ""
    return f"transferring: {t.bytes_done / 1e6:.1f} of {t.bytes_total / 1e6:.1f} MB{rate}{now}"
