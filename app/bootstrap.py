"""The one composition root: real adapters are built here and nowhere else.

The CLI, the worker start-up and the tests call these functions; tests pass fakes instead.
Nothing is built at import time; engines are cached per URL for the life of the process.
"""

from __future__ import annotations

import functools

from sqlalchemy import Engine

from app.budget import Budget
from app.db import init_db, make_engine
from app.ledger import Ledger
from app.settings import Settings, load_settings

__all__ = ["budget", "engine", "ledger", "settings"]


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
