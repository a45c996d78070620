"""The one composition root: real adapters are built here and nowhere else.

The CLI, the worker start-up and the tests call these functions; tests pass fakes instead.
Nothing is built at import time, and the database layer is imported only when first used (a
rules-only `tuneharness triage` never needs it); engines are cached per URL for the life of the process.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from app.settings import Settings, load_settings

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from pathlib import Path

    from sqlalchemy import Engine

    from app.alerts import Notifier, OutboxNotifier
    from app.budget import Budget
    from app.hostkeys import JobKey
    from app.jobs import JobStore
    from app.ledger import Ledger
    from app.market import Instance, Market
    from app.policy.provisioning import PreflightResult
    from app.policy.supervision import SupervisorConfig
    from app.ports import Clock
    from app.reputation import ReputationStore
    from app.services.plan import CampaignReplay
    from app.services.provisioning import ProvisioningService
    from app.services.research import ResearchService
    from app.services.supervisor import SupervisorService
    from app.ssh import SSHHostShell
    from app.stackstate import StackState
    from app.triage.chain import TriageChain
    from gate.jobs import JobEvaluator
    from gate.service import GateService

__all__ = [
    "budget",
    "check_fleet_store",
    "check_worker_config",
    "configured",
    "engine",
    "enqueue_job",
    "gate",
    "hf_endpoint",
    "job_evaluator",
    "job_keypair",
    "jobs",
    "ledger",
    "market",
    "notifier",
    "provisioning",
    "reputation",
    "require_broker",
    "running_stack",
    "settings",
    "sim_campaign",
    "sim_serve",
    "ssh_preflight",
    "supervisor",
    "triage_chain",
    "worker_hosts",
]


@functools.cache
def running_stack() -> StackState | None:
    """The stack `tuneharness up` runs for this TUNEHARNESS_HOME, if any; what this process's
    environment leaves unset (broker, shared simulated marketplace) is taken from it, once."""
    import os

    from app.stackstate import adopt

    return adopt(os.environ)


@functools.cache
def configured() -> Path | None:
    """Fill this process's environment, once, from TUNEHARNESS_HOME/config.toml's profile and the
    vendors' key files (`app.configfile`); the config file's path, None without one."""
    import os

    from app.configfile import adopt

    return adopt(os.environ)


@functools.cache
def settings() -> Settings:
    """The process's settings, validated once (after the config file's and the running stack's are
    adopted: the environment first, then the config file, then the stack `up` runs)."""
    configured()
    running_stack()
    return load_settings()


@functools.cache
def _engine_for(url: str) -> Engine:
    from app.db import init_db, make_engine

    eng = make_engine(url)
    init_db(eng)
    return eng


def engine(s: Settings | None = None) -> Engine:
    """The database engine, with tables and triggers created on first use."""
    s = s or settings()
    if s.db_url.startswith("sqlite:///"):
        s.home.mkdir(parents=True, exist_ok=True)
    return _engine_for(s.db_url)


def ledger(s: Settings | None = None) -> Ledger:
    from app.ledger import Ledger

    return Ledger(engine(s))


def reputation(s: Settings | None = None) -> ReputationStore:
    """The durable renter-side reputation and quarantine of every machine."""
    from app.reputation import ReputationStore

    return ReputationStore(engine(s))


def jobs(s: Settings | None = None) -> JobStore:
    """Submitted jobs and their phase."""
    from app.jobs import JobStore

    return JobStore(engine(s))


def require_broker(s: Settings | None = None) -> None:
    """Raise ServiceUnavailable (one line, with the fix) when the broker cannot be reached."""
    from app.errors import ServiceUnavailable
    from app.stack import broker_reachable

    s = s or settings()
    if not broker_reachable(s.broker_url):
        raise ServiceUnavailable(
            f"the broker is unreachable at {s.broker_url}; submitting enqueues work for the fleet. "
            "Fix: start it with `tuneharness up` (or point TUNEHARNESS_BROKER_URL at a running Redis)"
        )


def enqueue_job(job_id: str) -> None:
    """Hand a submitted job to the fleet: its id goes on the provision queue."""
    from workers.celery_app import app as celery_app

    celery_app.send_task("tuneharness.provision.provision", args=[job_id], queue="provision")


def enqueue_research(run_id: str, seq: int = 0) -> None:
    """Hand a research run to the fleet: its tick chain starts (or goes on) at `seq`."""
    from workers.celery_app import app as celery_app

    celery_app.send_task("tuneharness.maintenance.research_tick", args=[run_id, seq], queue="maintenance")


def worker_hosts(timeout_s: float = 2.0) -> dict[str, list[str]]:
    """{machine: [worker names]} of the workers that answer a ping on the broker within `timeout_s`."""
    from workers.celery_app import app as celery_app

    out: dict[str, list[str]] = {}
    for reply in celery_app.control.ping(timeout=timeout_s) or []:
        for name in reply:
            out.setdefault(name.rpartition("@")[2] or name, []).append(name)
    return out


def budget(s: Settings | None = None) -> Budget:
    from app.budget import Budget

    return Budget(engine(s))


def check_worker_config() -> None:
    """Refuse to start when the Celery time limits would outlive the visibility timeout."""
    from workers.celery_app import _task_limits, app
    from workers.config import check_time_limits

    check_time_limits(app.conf, _task_limits())


def check_fleet_store(s: Settings | None = None, *, record: bool) -> str | None:
    """On PostgreSQL (the fleet's database): raise ConfigError unless this machine's artifact store is
    the one every worker shares (`app.fleetstore`); with `record`, a first worker's becomes it. The
    verdict's detail; None on SQLite, the one-machine default."""
    from app.artifacts import open_store
    from app.fleetstore import check_fleet_store as check

    s = s or settings()
    if not s.is_postgres:
        return None
    location = artifacts_location(s)
    return check(engine(s), open_store(location), location, record=record).detail


def notifier(s: Settings | None = None, *, background: bool = True) -> OutboxNotifier:
    """The Notifier: alerts recorded in the outbox, delivered to TUNEHARNESS_ALERT_WEBHOOK_URL."""
    import os

    from app.alerts import OutboxNotifier, WebhookNotifier, webhook_config_from_env

    config = webhook_config_from_env(os.environ)
    sender = WebhookNotifier(config) if config is not None else None
    return OutboxNotifier(engine(s), sender, background=background)


def gate(s: Settings | None = None, *, notify: Notifier | None = None) -> GateService:
    """The deploy gate's handlers on this process's ledger and notifier."""
    from gate.service import GateService

    return GateService(ledger=ledger(s), notifier=notify if notify is not None else notifier(s))


def job_evaluator(s: Settings | None = None, *, notify: Notifier | None = None) -> JobEvaluator:
    """The evaluate stage: a gated job's seed adapters from the ArtifactStore, judged by the gate.

    Trials are written under TUNEHARNESS_HOME/trials/<job>; adapters come from TUNEHARNESS_ARTIFACTS
    (default TUNEHARNESS_HOME/artifacts), as the supervisor put them.
    """
    from app.artifacts import open_store
    from gate.jobs import JobEvaluator

    s = s or settings()
    store = open_store(artifacts_location(s))
    # trials/ stay on this machine (the path is recorded); the decision, reasons and trial hash go to the database.
    return JobEvaluator(jobs=jobs(s), store=store, gate=gate(s, notify=notify), ledger=ledger(s), work_dir=s.home)


MARKETS = ("vast", "runpod", "sim")


def market(name: str) -> Market:
    """The Market adapter for `name`, configured from the environment (the one place they are built)."""
    from app.errors import UserError

    running_stack()  # a shared simulated marketplace that runs is used, never a fresh in-process one
    if name == "vast":
        from providers.vast import VastMarket

        return VastMarket.from_env()
    if name == "runpod":
        from providers.runpod import RunPodMarket

        return RunPodMarket.from_env()
    if name == "sim":
        from providers.sim import market_from_env

        return market_from_env()
    raise UserError(f"unknown provider {name!r}. Fix: choose one of {', '.join(MARKETS)}")


def sim_serve(
    trace: str,
    *,
    scale: float,
    port: int,
    root: str | None = None,
    url_file: str | None = None,
    announce: Callable[[str], None] | None = None,
    train_step_s: float | None = None,
    train_start_s: float | None = None,
) -> None:
    """Run the shared simulated marketplace (`tuneharness sim serve`) until interrupted."""
    import signal
    import threading
    from pathlib import Path

    from providers.sim.server import SimServer
    from providers.sim.trace import load_trace

    server = SimServer(
        load_trace(trace),
        scale=scale,
        port=port,
        root=Path(root) if root else None,
        train_step_s=train_step_s,
        train_start_s=train_start_s,
    )
    if threading.current_thread() is threading.main_thread():
        # SIGTERM ends the server cleanly too: its sshd daemons must not outlive it
        signal.signal(signal.SIGTERM, lambda *_: server.request_stop())
    try:
        url = server.start()
        if url_file:
            # Atomically: a reader polling for the file must never see it empty.
            tmp = Path(f"{url_file}.tmp")
            tmp.write_text(url + "\n", encoding="utf-8")
            tmp.replace(url_file)
        if announce is not None:
            announce(url)
        server.wait()
    finally:
        server.close()


def sim_campaign(
    trace: str,
    *,
    policy: str,
    jobs: int | None = None,
    seed: int = 0,
    standby_hosts: int = 0,
    monitor_s: float | None = None,
) -> dict[str, Any]:
    """Replay a whole campaign in virtual time (`tuneharness sim campaign`): the referee's receipt."""
    from providers.sim.campaign import run_campaign_file

    return run_campaign_file(
        trace, policy=policy, jobs=jobs, seed=seed, standby_hosts=standby_hosts, monitor_s=monitor_s
    ).receipt


def sim_campaign_realtime(
    trace: str,
    *,
    jobs: int | None = None,
    scale: float = 3.0,
    monitor_s: float | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run a campaign through the real-time fleet in scaled time (`sim campaign --driver celery`)."""
    from providers.sim.campaign.realtime import run_campaign_realtime

    return run_campaign_realtime(trace, jobs=jobs, scale=scale, monitor_s=monitor_s, progress=progress).receipt


def plan_replay() -> CampaignReplay:
    """The campaign simulator as `tuneharness plan` replays it over seeds."""
    from providers.sim.plan import SimPlanReplay

    return SimPlanReplay()


def triage_chain(*, with_specialist: bool = True, with_llm: bool = True) -> TriageChain:
    """The train.log triage chain: rules, the shipped specialist (if trained), the capped LLM (if configured)."""
    import os

    from app.triage.chain import TriageChain
    from app.triage.llm import LlmConfig, LlmEscalation
    from app.triage.specialist import default_specialist

    specialist = default_specialist() if with_specialist else None
    config = LlmConfig.from_env(os.environ) if with_llm else None
    escalation = LlmEscalation(config, ledger()) if config is not None else None
    return TriageChain(specialist=specialist, escalation=escalation)


def host_shell(inst: Instance, job_id: str, s: Settings | None = None) -> SSHHostShell:
    """An SSH shell on a job's instance: the job's own key, the host key pinned on first contact."""
    from app.ssh import HostUnreachable

    if inst.ssh is None:
        raise HostUnreachable(f"{inst.instance_id}: no SSH endpoint (state {inst.state})")
    return _job_shell(inst, job_id, inst.provider, s, connect_timeout_s=10.0)


def _job_shell(
    inst: Instance, job_id: str, provider: str, s: Settings | None, *, connect_timeout_s: float = 15.0
) -> SSHHostShell:
    """The job's key (in memory, from the database) and the instance's host key pinned in the
    database: any worker on any machine opens the same host the same way."""
    from app.hostkeys import DbHostKeyPin, legacy_key_dir
    from app.ssh import SSHHostShell

    assert inst.ssh is not None
    s = s or settings()
    key = job_keypair(job_id, s)
    legacy = legacy_key_dir(s.home, job_id) / f"host-{provider}-{inst.instance_id}.pub"
    pin = DbHostKeyPin(engine(s), provider=provider, instance_id=inst.instance_id, legacy_file=legacy)
    return SSHHostShell(
        inst.ssh,
        None,
        private_key=key.private_key,
        pin=pin,
        connect_timeout_s=connect_timeout_s,
        fallback=inst.ssh_fallback,
    )


def job_keypair(job_id: str, s: Settings | None = None) -> JobKey:
    """The job's own SSH key pair, kept in the fleet's database (made on first use; a key an older
    home keeps under TUNEHARNESS_HOME/keys/<job> is read once and stored)."""
    from app.hostkeys import job_key, legacy_key_dir

    s = s or settings()
    return job_key(engine(s), job_id, legacy_dir=legacy_key_dir(s.home, job_id))


# The preflight's whole time on the host, the bootstrap included (the policy's preflight_timeout_s),
# and what the preflight itself is always left of it.
PREFLIGHT_BUDGET_S = 180.0
PREFLIGHT_RUN_S = 30.0
_PREFLIGHT_COMMAND = (
    'PY=$(command -v python3 || command -v python); $PY -c "'
    "import importlib.util, sys; s = importlib.util.spec_from_file_location('p', 'tuneharness_preflight.py'); "
    'm = importlib.util.module_from_spec(s); s.loader.exec_module(m); sys.exit(m.main_preflight())"'
)


def ssh_preflight(market: Market, job_id: str, instance_id: str) -> PreflightResult:
    """Push trainer/preflight.py to the host over SSH, run it, read its one JSON line (the
    bootstrap first, when TUNEHARNESS_BOOTSTRAP is on)."""
    import time
    from pathlib import Path

    from app import hoststack
    from app.policy.provisioning import PreflightResult
    from app.ssh import CommandTimedOut, SSHError

    inst = market.status(instance_id)
    if inst.ssh is None:
        return PreflightResult(None, "ssh_unreachable", f"no SSH endpoint (state {inst.state})")
    shell = _job_shell(inst, job_id, market.name, None)
    script = Path(__file__).resolve().parents[1] / "trainer" / "preflight.py"
    started = time.monotonic()
    try:
        # Pushed next to the session's home: the host needs only python and torch, not our code.
        # The bootstrap first (it installs what the image lacks of the trainer's stack), inside
        # the preflight's time budget; the preflight then reports the stack the trainer will see.
        first = ""
        if hoststack.bootstrap_enabled():
            shell.put(hoststack.BOOTSTRAP_SCRIPT, hoststack.REMOTE_SCRIPT)
            shell.put(hoststack.BOOTSTRAP_LOCK, hoststack.REMOTE_LOCK)
            # its JSON line to stderr: the preflight's is the only one on stdout
            first = hoststack.bootstrap_command(timeout_s=PREFLIGHT_BUDGET_S - PREFLIGHT_RUN_S) + " >&2; "
        shell.put(script, "tuneharness_preflight.py")
        left_s = PREFLIGHT_BUDGET_S - (time.monotonic() - started)
        res = shell.run(first + hoststack.ACTIVATE_STACK + _PREFLIGHT_COMMAND, timeout_s=max(PREFLIGHT_RUN_S, left_s))
    except CommandTimedOut as exc:
        return PreflightResult(None, "timeout", str(exc))
    except SSHError as exc:
        return PreflightResult(None, "ssh_unreachable", str(exc))
    except OSError as exc:  # the host refused a file (PermissionError, a full disk, not a directory)
        return PreflightResult(None, "ssh_unreachable", f"cannot write to the host: {type(exc).__name__}: {exc}")
    finally:
        shell.close()
    return preflight_result(res.stdout, res.stderr, res.exit_code)


def preflight_result(stdout: str, stderr: str, exit_code: int) -> PreflightResult:
    """The preflight's last JSON line as a result; what a host printed instead (nothing, a broken or
    non-object line) is a failed preflight, never an exception in the task."""
    import json

    from app.policy.preflight import PreflightReport
    from app.policy.provisioning import PreflightResult

    lines = [ln for ln in stdout.strip().splitlines() if ln.startswith("{")]
    if not lines:
        return PreflightResult(None, "ssh_unreachable", f"no report (exit {exit_code}): {stderr[-300:]}")
    try:
        data = json.loads(lines[-1])
    except ValueError:
        data = None
    if not isinstance(data, dict):
        return PreflightResult(None, "ssh_unreachable", f"malformed report from the host: {lines[-1][:200]!r}")
    return PreflightResult(PreflightReport.from_mapping(data))


def provisioning(s: Settings | None = None) -> ProvisioningService:
    """The provisioning handler wired to the real markets, SSH and the database.

    With TUNEHARNESS_SIM_URL set, the simulated marketplace's shared clock is used so that boot
    windows are measured in its (scaled) seconds.
    """

    from app.market import LaunchSpec
    from app.ports import WallClock
    from app.services.provisioning import ProvisioningService

    s = s or settings()
    clock: Clock = sim_clock() or WallClock()

    def launch_spec_for(job_id: str) -> LaunchSpec:
        rec = jobs(s).get(job_id)
        spec = rec.spec if rec is not None else {}
        needs = spec.get("needs", {})
        return LaunchSpec(
            image=str(needs.get("image", "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime")),
            disk_gb=float(needs.get("disk_gb", 60.0)),
            label="",
            ssh_public_key=job_keypair(job_id, s).public_key,
        )

    return ProvisioningService(
        engine(s),
        market_for=market,
        clock=clock,
        run_preflight=ssh_preflight,
        launch_spec_for=launch_spec_for,
        notifier=notifier(s),
    )


def artifacts_location(s: Settings, env: Mapping[str, str] | None = None) -> str:
    """Where checkpoints and adapters are pulled: TUNEHARNESS_ARTIFACTS, else TUNEHARNESS_HOME/artifacts."""
    import os

    env = os.environ if env is None else env
    return env.get("TUNEHARNESS_ARTIFACTS") or str(s.home / "artifacts")


def sim_clock() -> Clock | None:
    """The shared simulated marketplace's scaled clock when TUNEHARNESS_SIM_URL is set, else None."""
    from providers.sim import shared_clock_from_env

    running_stack()
    return shared_clock_from_env()


def supervisor_config(env: Mapping[str, str] | None = None) -> SupervisorConfig:
    """The supervisor's knobs from TUNEHARNESS_MONITOR_S, _REPOLL_S, _SLICE_S and _SLICE_STEPS."""
    import os

    from app.errors import SettingsError
    from app.policy.supervision import SupervisorConfig
    from app.settings import seconds_setting

    env = os.environ if env is None else env
    default = SupervisorConfig()
    slice_steps = (env.get("TUNEHARNESS_SLICE_STEPS") or "").strip()
    if slice_steps and not (slice_steps.isdigit() and int(slice_steps) > 0):
        raise SettingsError(
            "TUNEHARNESS_SLICE_STEPS", f"{slice_steps!r} is not a positive whole number", "e.g. 100, or unset it"
        )
    return SupervisorConfig(
        monitor_s=seconds_setting("TUNEHARNESS_MONITOR_S", default.monitor_s, env),
        repoll_s=seconds_setting("TUNEHARNESS_REPOLL_S", default.repoll_s, env),
        slice_s=seconds_setting("TUNEHARNESS_SLICE_S", default.slice_s, env),
        slice_steps=int(slice_steps) if slice_steps else None,
    )


def supervisor(s: Settings | None = None) -> SupervisorService:
    """The training supervisor wired to the provisioning handler, SSH, the artifact store and triage.

    Knobs (seconds of the provisioning clock, i.e. simulated seconds under the simulator):
    TUNEHARNESS_MONITOR_S (30), TUNEHARNESS_REPOLL_S (10), TUNEHARNESS_SLICE_S (1800); and
    TUNEHARNESS_SLICE_STEPS (unset) to cap each slice at that many steps as well.
    Artifacts go to TUNEHARNESS_ARTIFACTS (a directory or s3://BUCKET/PREFIX; default
    TUNEHARNESS_HOME/artifacts).
    """
    from pathlib import Path

    from app.artifacts import open_store
    from app.errors import ConfigError
    from app.jobs import spec_from_dict
    from app.services.supervisor import Bundle, SupervisorService, TriageAnswer, bundle_for_spec

    s = s or settings()
    cfg = supervisor_config()

    def shell_for(inst: Instance, job_id: str) -> SSHHostShell:
        return host_shell(inst, job_id, s)

    def bundle_for(job_id: str) -> Bundle:
        rec = jobs(s).get(job_id)
        if rec is None:
            raise ConfigError(f"no job {job_id!r} in the job table")
        spec = spec_from_dict(rec.spec)
        return bundle_for_spec(spec.train, base_dir=spec.base_dir)

    def triage(job_id: str, log: str) -> TriageAnswer:
        result = triage_chain().triage(log, id=job_id, job=job_id)
        return TriageAnswer(
            result.state, result.action, result.needs_operator, result.evidence, remedy=str(result.remedy)
        )

    from app.rentals import Rentals
    from app.services.transfer import TransferService

    store = open_store(artifacts_location(s))
    prov = provisioning(s)
    # staging/ is this machine's scratch and cache (pulls on their way to the store, hashes of local
    # files): rebuilt on demand, nothing another worker needs. What it needs is in the store or the database.
    transfers = TransferService(engine(s), rentals=Rentals(engine(s)), clock=prov.clock, staging=s.home / "staging")
    return SupervisorService(
        engine(s),
        provisioning=prov,
        shell_for=shell_for,
        store=store,
        staging=s.home / "staging",
        bundle_for=bundle_for,
        trainer_dir=Path(__file__).resolve().parents[1] / "trainer",
        notifier=notifier(s),
        triage=triage,
        jobs=jobs(s),
        cfg=cfg,
        transfers=transfers,
        hf_endpoint=hf_endpoint(),
    )


def research(s: Settings | None = None) -> ResearchService:
    """Research runs (docs/research.md): their files under TUNEHARNESS_HOME/research, their jobs
    submitted to the fleet, their experiments cancelled through the lifecycle service."""
    import time

    from app.artifacts import open_store
    from app.rentals import Rentals
    from app.services.lifecycle import Lifecycle
    from app.services.research import ResearchService

    s = s or settings()
    clock = sim_clock()

    def cancel(job_id: str) -> None:
        Lifecycle(supervisor(s), enqueue=None).cancel(job_id, reason="research run stopped")

    return ResearchService(
        home=s.home,
        jobs=jobs(s),
        ledger=ledger(s),
        budget=budget(s),
        rentals=Rentals(engine(s)),
        engine=engine(s),
        artifacts=open_store(artifacts_location(s)),
        enqueue=enqueue_job,
        cancel=cancel,
        clock=clock.now if clock is not None else time.time,
    )


def hf_endpoint(env: Mapping[str, str] | None = None) -> str:
    """TUNEHARNESS_HF_ENDPOINT: the Hugging Face Hub hosts fetch public models from (no token is sent)."""
    import os

    from app.errors import SettingsError

    env = os.environ if env is None else env
    value = (env.get("TUNEHARNESS_HF_ENDPOINT") or "").strip() or "https://huggingface.co"
    if not value.startswith(("http://", "https://")):
        raise SettingsError(
            "TUNEHARNESS_HF_ENDPOINT", f"{value!r} is not an http(s) URL", "e.g. https://huggingface.co, or unset it"
        )
    return value.rstrip("/")
