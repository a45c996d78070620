"""The one composition root: real adapters are built here and nowhere else.

The CLI, the worker start-up and the tests call these functions; tests pass fakes instead.
Nothing is built at import time; engines are cached per URL for the life of the process.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine

from app.budget import Budget
from app.db import init_db, make_engine
from app.ledger import Ledger
from app.settings import Settings, load_settings

if TYPE_CHECKING:
    from collections.abc import Callable

    from app.alerts import Notifier, OutboxNotifier
    from app.jobs import JobStore
    from app.market import Market
    from app.reputation import ReputationStore
    from app.triage.chain import TriageChain
    from gate.service import GateService

__all__ = [
    "budget", "check_worker_config", "engine", "enqueue_job", "gate", "jobs", "ledger", "market", "notifier",
    "reputation", "require_broker", "settings", "sim_campaign", "sim_serve", "triage_chain",
]


@functools.cache
def settings() -> Settings:
    """The process's settings, validated once."""
    return load_settings()


@functools.cache
def _engine_for(url: str) -> Engine:
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

    celery_app.send_task("tuneharness.provision.accept_job", args=[job_id], queue="provision")


def budget(s: Settings | None = None) -> Budget:
    return Budget(engine(s))


def check_worker_config() -> None:
    """Refuse to start when the Celery time limits would outlive the visibility timeout."""
    from workers.celery_app import _task_limits, app
    from workers.config import check_time_limits

    check_time_limits(app.conf, _task_limits())


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


MARKETS = ("vast", "runpod", "sim")


def market(name: str) -> Market:
    """The Market adapter for `name`, configured from the environment (the one place they are built)."""
    from app.errors import UserError

    if name == "vast":
        from providers.vast import VastMarket

        return VastMarket.from_env()
    if name == "runpod":
        from providers.runpod import RunPodMarket

        return RunPodMarket.from_env()
    if name == "sim":
        import importlib

        try:
            sim_module = importlib.import_module("providers.sim")
        except ModuleNotFoundError as exc:
            if exc.name != "providers.sim":
                raise
            sim_module = None
        factory = getattr(sim_module, "market_from_env", None)
        if factory is None:
            raise UserError(
                "the simulated marketplace is not available in this build (providers.sim.market_from_env "
                "is missing). Fix: use --provider vast or --provider runpod"
            )
        sim: Market = factory()
        return sim
    raise UserError(f"unknown provider {name!r}. Fix: choose one of {', '.join(MARKETS)}")


def sim_serve(
    trace: str,
    *,
    scale: float,
    port: int,
    root: str | None = None,
    url_file: str | None = None,
    announce: Callable[[str], None] | None = None,
) -> None:
    """Run the shared simulated marketplace (`tuneharness sim serve`) until interrupted."""
    import signal
    import threading
    from pathlib import Path

    from providers.sim.server import SimServer
    from providers.sim.trace import load_trace

    server = SimServer(load_trace(trace), scale=scale, port=port, root=Path(root) if root else None)
    if threading.current_thread() is threading.main_thread():
        # SIGTERM ends the server cleanly too: its sshd daemons must not outlive it
        signal.signal(signal.SIGTERM, lambda *_: server.request_stop())
    try:
        url = server.start()
        if url_file:
            Path(url_file).write_text(url + "\n", encoding="utf-8")
        if announce is not None:
            announce(url)
        server.wait()
    finally:
        server.close()


def sim_campaign(trace: str, *, policy: str, jobs: int | None = None, seed: int = 0) -> dict[str, Any]:
    """Replay a whole campaign in virtual time (`tuneharness sim campaign`): the referee's receipt."""
    from workers.campaign import run_campaign_file

    return run_campaign_file(trace, policy=policy, jobs=jobs, seed=seed).receipt


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
