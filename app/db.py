"""Database engines and write transactions for SQLite and PostgreSQL.

Every write that must not race goes through `write_transaction(engine, lock=...)`:
on SQLite the transaction starts with `BEGIN IMMEDIATE` (one writer at a time, others wait up to
the busy timeout); on PostgreSQL it takes a transaction-scoped advisory lock named by `lock`,
released at commit or rollback. No engine is built at import time.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import CheckConstraint, Connection, Engine, create_engine, event, text
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlmodel import SQLModel

from app.errors import ServiceUnavailable, UserError

__all__ = [
    "MONEY_COLUMNS",
    "SCHEMA_LOCK",
    "TABLE_MODULES",
    "advisory_key",
    "init_db",
    "is_postgres",
    "ledger_role_grants",
    "make_engine",
    "money_check",
    "write_transaction",
]

log = logging.getLogger(__name__)

# Modules that define SQLModel tables: the metadata the migrations are checked against (app/migrations).
TABLE_MODULES = [
    "app.ledger",
    "app.budget",
    "app.liveness",
    "app.rentals",
    "app.alerts",
    "app.services.guardrails",
    "app.reputation",
    "app.gpu_speeds",
    "app.jobs",
    "app.services.provisioning",
    "app.services.leases",
    "app.services.supervisor",
    "app.services.transfer",
    "app.deliveries",
    "app.hostkeys",
    "app.fleetstore",
    "app.researchstore",
]

SQLITE_BUSY_TIMEOUT_MS = 60_000


def is_postgres(engine: Engine) -> bool:
    return engine.dialect.name == "postgresql"


def _install_sqlite_hooks(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy's begin event decide how a transaction starts.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA journal_mode = WAL")
        cur.execute("PRAGMA foreign_keys = ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        mode = conn.get_execution_options().get("tuneharness_begin", "IMMEDIATE")
        conn.exec_driver_sql(f"BEGIN {mode}")


def make_engine(url: str) -> Engine:
    """Build an engine for `url` (sqlite:///PATH or postgresql+psycopg://...)."""
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///") :]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
        _install_sqlite_hooks(engine)
        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=25, max_overflow=10)


def advisory_key(name: str) -> int:
    """A stable signed 64-bit key for pg_advisory_xact_lock from a lock name."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


@contextmanager
def write_transaction(engine: Engine, *, lock: str) -> Iterator[Connection]:
    """A transaction that holds the write lock `lock` until it commits or rolls back."""
    try:
        with engine.begin() as conn:
            if is_postgres(engine):
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": advisory_key(lock)})
            yield conn
    except OperationalError as exc:
        if _is_connect_failure(exc):
            raise ServiceUnavailable(_unreachable_message(engine)) from None
        raise


@contextmanager
def read_connection(engine: Engine) -> Iterator[Connection]:
    """A read-only transaction (SQLite: deferred, takes no write lock)."""
    try:
        with engine.connect() as conn:
            conn = conn.execution_options(tuneharness_begin="DEFERRED")
            with conn.begin():
                yield conn
    except OperationalError as exc:
        if _is_connect_failure(exc):
            raise ServiceUnavailable(_unreachable_message(engine)) from None
        raise


def _is_connect_failure(exc: OperationalError) -> bool:
    msg = str(exc.orig).lower() if exc.orig is not None else str(exc).lower()
    return any(
        s in msg
        for s in (
            "connection refused",
            "could not connect",
            "unable to open database",
            "connection failed",
            "does not exist",
            "no such host",
            "name or service not known",
        )
    )


def _unreachable_message(engine: Engine) -> str:
    url = engine.url.render_as_string(hide_password=True)
    if is_postgres(engine):
        return (
            f"database unreachable at {url}. Fix: start PostgreSQL, or point TUNEHARNESS_DB_URL "
            "at a running server (unset it to use SQLite under TUNEHARNESS_HOME)"
        )
    return f"cannot open the database {url}. Fix: check that TUNEHARNESS_HOME is writable"


_SQLITE_TRIGGERS = [
    """CREATE TRIGGER IF NOT EXISTS ledger_no_update BEFORE UPDATE ON ledger_events
       BEGIN SELECT RAISE(ABORT, 'ledger is append-only: UPDATE rejected'); END""",
    """CREATE TRIGGER IF NOT EXISTS ledger_no_delete BEFORE DELETE ON ledger_events
       BEGIN SELECT RAISE(ABORT, 'ledger is append-only: DELETE rejected'); END""",
    # INSERT OR REPLACE deletes the old row without firing delete triggers (unless
    # recursive_triggers is on for that connection), and an upsert may update it: refuse any
    # insert that would collide with an existing row before SQLite resolves the conflict.
    """CREATE TRIGGER IF NOT EXISTS ledger_no_replace BEFORE INSERT ON ledger_events
       WHEN EXISTS (SELECT 1 FROM ledger_events
                    WHERE seq = NEW.seq OR idempotency_key = NEW.idempotency_key)
       BEGIN SELECT RAISE(ABORT, 'ledger is append-only: insert over an existing row rejected'); END""",
]

_PG_TRIGGERS = [
    """CREATE OR REPLACE FUNCTION tuneharness_ledger_reject() RETURNS trigger AS $$
       BEGIN RAISE EXCEPTION 'ledger is append-only: % rejected', TG_OP; END
       $$ LANGUAGE plpgsql""",
    "DROP TRIGGER IF EXISTS ledger_no_update ON ledger_events",
    """CREATE TRIGGER ledger_no_update BEFORE UPDATE OR DELETE ON ledger_events
       FOR EACH ROW EXECUTE FUNCTION tuneharness_ledger_reject()""",
    "DROP TRIGGER IF EXISTS ledger_no_truncate ON ledger_events",
    """CREATE TRIGGER ledger_no_truncate BEFORE TRUNCATE ON ledger_events
       FOR EACH STATEMENT EXECUTE FUNCTION tuneharness_ledger_reject()""",
    # A trigger is origin-only by default: a session that sets `session_replication_role =
    # replica` would skip it. ALWAYS fires it in every session, replicas included.
    "ALTER TABLE ledger_events ENABLE ALWAYS TRIGGER ledger_no_update",
    "ALTER TABLE ledger_events ENABLE ALWAYS TRIGGER ledger_no_truncate",
]
_PG_GUARD_TRIGGERS = ("ledger_no_truncate", "ledger_no_update")


def _pg_triggers_in_place(conn: Connection) -> bool:
    """Both ledger triggers exist and fire ALWAYS (so a role that does not own the table, which
    may not replace them, has nothing to do)."""
    rows = conn.execute(
        text(
            "SELECT tgname, tgenabled FROM pg_trigger "
            "WHERE tgrelid = to_regclass('ledger_events') AND NOT tgisinternal ORDER BY tgname"
        )
    ).all()
    return tuple(r[0] for r in rows if r[1] == "A") == _PG_GUARD_TRIGGERS


def ledger_role_grants(role: str) -> list[str]:
    """The statements that let `role` run the application while it may only INSERT and SELECT the
    ledger: no UPDATE, DELETE or TRUNCATE on it, and (not owning it) no way to disable its
    triggers; full use of every other table. Run by the tables' owner (`tuneharness ledger lock-down`)."""
    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", role):
        raise UserError(f"role {role!r} is not a plain PostgreSQL role name. Fix: use lower-case letters, digits, _")
    for name in TABLE_MODULES:
        importlib.import_module(name)
    q = f'"{role}"'
    stmts = [f"GRANT USAGE ON SCHEMA public TO {q}"]
    for table in sorted(SQLModel.metadata.tables):
        if table == "ledger_events":
            stmts += [f"REVOKE ALL ON ledger_events FROM {q}", f"GRANT SELECT, INSERT ON ledger_events TO {q}"]
        else:
            stmts.append(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO {q}")
    # The role reads which schema revision it runs on; only the owner migrates (`tuneharness db upgrade`).
    stmts.append(f"GRANT SELECT ON alembic_version TO {q}")
    stmts.append(f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {q}")
    return stmts


# -- money is finite ----------------------------------------------------------------------------
# Every comparison with NaN is false and PostgreSQL orders 'NaN' above every number, so a NaN cap
# would refuse nothing. The database refuses non-finite money itself: the bounds below exclude NaN
# (on PostgreSQL) and both infinities (everywhere). SQLite stores a NaN it is given as NULL; the
# NOT NULL columns refuse it, and the ledger refuses it before it gets there.
MONEY_LIMIT = 1e15
# (table, column, lowest value): the columns that hold money (or a cap in GPU minutes).
MONEY_COLUMNS: tuple[tuple[str, str, float], ...] = (
    ("budget_caps", "cap_usd", 0.0),
    ("budget_reservations", "amount_usd", 0.0),
    ("jobs", "budget_usd", 0.0),
    ("ledger_events", "amount_usd", -MONEY_LIMIT),
    ("ledger_events", "rate_usd_per_hour", 0.0),
    ("rentals", "rate_usd_per_hour", 0.0),
)


def _money_name(table: str, column: str) -> str:
    return f"money_finite_{table}_{column}"


def _money_condition(column: str, lowest: float, *, prefix: str = "") -> str:
    c = f"{prefix}{column}"
    return f"{c} IS NULL OR ({c} >= {lowest!r} AND {c} <= {MONEY_LIMIT!r})"


def money_check(table: str, column: str) -> CheckConstraint:
    """The CHECK a money column's table declares (tables created from now on carry it)."""
    lowest = next(lo for t, c, lo in MONEY_COLUMNS if (t, c) == (table, column))
    return CheckConstraint(_money_condition(column, lowest), name=_money_name(table, column))


SCHEMA_LOCK = "tuneharness.schema"

_SQLITE_GUARD_TRIGGERS = ("ledger_no_delete", "ledger_no_replace", "ledger_no_update")


def _ledger_guard_in_place(conn: Connection) -> bool:
    """The ledger's append-only triggers are all there (PostgreSQL: and fire ALWAYS)."""
    if conn.dialect.name == "postgresql":
        return _pg_triggers_in_place(conn)
    rows = conn.execute(
        text("SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'ledger_events' ORDER BY name")
    ).all()
    return set(_SQLITE_GUARD_TRIGGERS) <= {r[0] for r in rows}


def _install_ledger_guard(conn: Connection) -> None:
    for stmt in _PG_TRIGGERS if conn.dialect.name == "postgresql" else _SQLITE_TRIGGERS:
        conn.execute(text(stmt))


def init_db(engine: Engine) -> None:
    """Bring the database to the newest schema revision (`app/migrations`) and put back a ledger
    trigger that is missing or no longer fires always.

    A database with no tables goes straight to the newest revision (the models' tables, the newest
    revision recorded); one at an older revision runs the migrations since; a home made before
    migrations (tables, no alembic_version) is adopted at the first revision and upgraded from
    there. Workers that start together take turns under the schema lock. A database already
    current costs one read; neither it nor a new one imports Alembic.
    """
    from app import migrations

    for name in TABLE_MODULES:
        importlib.import_module(name)
    head = migrations.head_revision()
    with read_connection(engine) as conn:
        current = migrations.current_revision(conn)
        if current == head and _ledger_guard_in_place(conn):
            return
    with write_transaction(engine, lock=SCHEMA_LOCK) as conn:
        current = migrations.current_revision(conn)
        if current is None and not migrations.has_tables(conn):
            migrations.create_at_head(conn)
        elif current != head:
            _upgrade(conn, current=current, head=head)
        if not _ledger_guard_in_place(conn):
            _install_ledger_guard(conn)


def _upgrade(conn: Connection, *, current: str | None, head: str) -> None:
    from app import migrations

    if current is not None and current not in migrations.known_revisions():
        raise UserError(
            f"the database is at schema revision {current}, which this version of tuneharness does not know "
            "(a newer version wrote it). Fix: upgrade tuneharness on this machine"
        )
    if current is None:
        log.info("database made before migrations: adopting it at the first revision, then upgrading to %s", head)
    try:
        migrations.upgrade(conn)
    except DBAPIError as exc:
        if conn.dialect.name == "postgresql" and getattr(exc.orig, "sqlstate", None) == "42501":
            raise UserError(
                f"the database schema is at revision {current or 'none'} and this version needs {head}, "
                "but this role may not change tables. Fix: run `tuneharness db upgrade` once as the tables' owner"
            ) from None
        raise
