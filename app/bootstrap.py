"""The one composition root: real adapters are built here and nowhere else.

The CLI, the worker start-up and the tests call these functions; tests pass fakes instead.
Nothing is built at import time; engines are cached per URL for the life of the process.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from sqlalchemy import Engine

from app.budget import Budget
from app.db import init_db, make_engine
from app.ledger import Ledger
from app.settings import Settings, load_settings

if TYPE_CHECKING:
    from app.alerts import Notifier, OutboxNotifier
    from gate.service import GateService

__all__ = ["budget", "engine", "gate", "ledger", "notifier", "settings"]


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


def budget(s: Settings | None = None) -> Budget:
    return Budget(engine(s))


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
