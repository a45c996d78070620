"""Schema migrations: Alembic, configured in code and shipped inside the package.

`app.db.init_db` brings every database to the newest revision on start: a database with no tables
gets the models' tables and the newest revision recorded (`create_at_head`); one at an older
revision runs the migrations since (`upgrade`); a home made before migrations existed (tables, no
`alembic_version`) is adopted at the first revision, which fills in whatever such a home lacks, and
upgraded from there. `head_revision` reads the revision files without importing Alembic, so a start
that finds the database current costs one query.

Write a migration with `python scripts/new_migration.py "what it changes"` (docs/deploy.md).
"""

from __future__ import annotations

import enum
import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy import Connection, text

if TYPE_CHECKING:
    from alembic.autogenerate.api import AutogenContext
    from alembic.config import Config
    from alembic.script import ScriptDirectory

__all__ = [
    "SCRIPT_DIR",
    "VERSION_TABLE",
    "SchemaState",
    "SchemaStatus",
    "alembic_config",
    "context_options",
    "create_at_head",
    "current_revision",
    "drift",
    "has_tables",
    "head_revision",
    "is_legacy",
    "known_revisions",
    "schema_status",
    "upgrade",
]

SCRIPT_DIR = Path(__file__).resolve().parent
VERSION_TABLE = "alembic_version"

_REVISION = re.compile(r"^revision(?:\s*:\s*str)?\s*=\s*['\"]([^'\"]+)['\"]", re.M)
_DOWN = re.compile(r"^down_revision(?:\s*:[^=]+)?=\s*(?:['\"]([^'\"]+)['\"]|None)", re.M)


@functools.cache
def _revision_graph() -> tuple[frozenset[str], frozenset[str]]:
    """(every revision in versions/, every revision some other one revises), read as text."""
    revisions: set[str] = set()
    downs: set[str] = set()
    for path in sorted((SCRIPT_DIR / "versions").glob("*.py")):
        source = path.read_text(encoding="utf-8")
        rev = _REVISION.search(source)
        if rev is None:
            continue
        revisions.add(rev.group(1))
        down = _DOWN.search(source)
        if down is not None and down.group(1):
            downs.add(down.group(1))
    return frozenset(revisions), frozenset(downs)


def known_revisions() -> frozenset[str]:
    """Every revision this version ships."""
    return _revision_graph()[0]


def head_revision() -> str:
    """The newest revision in versions/ (one head: the revisions form a single line)."""
    revisions, downs = _revision_graph()
    heads = sorted(revisions - downs)
    if len(heads) != 1:
        raise RuntimeError(f"migrations must form one line, found heads {heads}: merge them (alembic merge)")
    return heads[0]


def alembic_config(connection: Connection | None = None) -> Config:
    """Alembic's configuration for this package (no alembic.ini): the scripts here, and `connection`
    for env.py to run on (the caller's transaction, which holds the schema lock)."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(SCRIPT_DIR))
    cfg.set_main_option("version_locations", str(SCRIPT_DIR / "versions"))
    cfg.set_main_option("path_separator", "os")
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def _has_table(conn: Connection, name: str) -> bool:
    if conn.dialect.name == "postgresql":
        return conn.execute(text("SELECT to_regclass(:t) IS NOT NULL"), {"t": name}).scalar() is True
    found = conn.execute(text("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = :t"), {"t": name}).first()
    return found is not None


def current_revision(conn: Connection) -> str | None:
    """The revision the database is at; None for a brand-new database or one made before migrations
    (tell them apart with `is_legacy`)."""
    if not _has_table(conn, VERSION_TABLE):
        return None
    return conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar()


def has_tables(conn: Connection) -> bool:
    """Whether the database (PostgreSQL: the current schema) holds any table at all."""
    if conn.dialect.name == "postgresql":
        sql = "SELECT 1 FROM pg_tables WHERE schemaname = current_schema() LIMIT 1"
    else:
        sql = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' LIMIT 1"
    return conn.execute(text(sql)).first() is not None


def is_legacy(conn: Connection) -> bool:
    """Tables and no record of a revision: a home made before migrations (by create_all), adopted at
    the first revision, which fills in whatever it lacks."""
    return current_revision(conn) is None and has_tables(conn)


def create_at_head(conn: Connection) -> None:
    """Give a database with no tables the newest schema in one step: the models' tables, then the
    newest revision recorded (Alembic's own recipe for a new database; the tests prove it builds what
    running every migration builds). Imports no Alembic."""
    import importlib

    from sqlalchemy import Column, MetaData, PrimaryKeyConstraint, String, Table
    from sqlmodel import SQLModel

    from app.db import TABLE_MODULES

    for name in TABLE_MODULES:
        importlib.import_module(name)
    SQLModel.metadata.create_all(conn)
    # The version table exactly as Alembic makes it.
    version = Table(
        VERSION_TABLE,
        MetaData(),
        Column("version_num", String(32), nullable=False),
        PrimaryKeyConstraint("version_num", name=f"{VERSION_TABLE}_pkc"),
    )
    version.create(conn)
    conn.execute(version.insert().values(version_num=head_revision()))


@functools.cache
def _scripts() -> ScriptDirectory:
    """The revision files, loaded once per process (loading them is most of a fresh upgrade's time)."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config())


def context_options(connection: Connection) -> dict[str, Any]:
    """How every migration runs (EnvironmentContext.configure's arguments): against the tables'
    models, SQLite in batch mode (it cannot ALTER most things: batch mode copies the table), column
    types compared."""
    import importlib

    from sqlmodel import SQLModel

    from app.db import TABLE_MODULES

    for name in TABLE_MODULES:
        importlib.import_module(name)
    return {
        "connection": connection,
        "target_metadata": SQLModel.metadata,
        "version_table": VERSION_TABLE,
        "render_as_batch": True,
        "compare_type": True,
        "render_item": _render_item,
    }


def _render_item(type_: str, obj: Any, autogen_context: AutogenContext) -> str | Literal[False]:
    """Render SQLModel's AutoString as a plain sa.String, so a migration does not import sqlmodel."""
    from sqlmodel.sql.sqltypes import AutoString

    if type_ == "type" and isinstance(obj, AutoString):
        return "sa.String()"
    return False


def upgrade(conn: Connection, target: str = "head") -> None:
    """Run every migration from the database's revision to `target` on `conn`, inside the caller's
    transaction (which holds the schema lock): what `alembic upgrade` does, without re-reading the
    revision files each time."""
    from alembic.runtime.environment import EnvironmentContext

    script = _scripts()

    def _steps(rev: Any, _context: Any) -> Any:
        return script._upgrade_revs(target, rev)

    with EnvironmentContext(alembic_config(conn), script, fn=_steps, destination_rev=target) as context:
        context.configure(**context_options(conn))
        with context.begin_transaction():
            context.run_migrations()


class SchemaState(enum.Enum):
    CURRENT = "current"  # at the newest revision this version ships
    BEHIND = "behind"  # at an older revision: the next start (or `tuneharness db upgrade`) upgrades it
    NEW = "new"  # no tables at all: the first start creates the newest schema
    LEGACY = "legacy"  # made before migrations: the next start adopts it at the first revision
    UNKNOWN = "unknown"  # at a revision this version does not ship (a newer version wrote it)


@dataclass(frozen=True, slots=True)
class SchemaStatus:
    current: str | None
    head: str
    state: SchemaState

    def as_dict(self) -> dict[str, str | None]:
        return {"current": self.current, "head": self.head, "state": self.state.value}


def schema_status(conn: Connection) -> SchemaStatus:
    """Where the database stands against this version's migrations (reads only)."""
    head = head_revision()
    current = current_revision(conn)
    if current is None:
        state = SchemaState.LEGACY if is_legacy(conn) else SchemaState.NEW
    elif current == head:
        state = SchemaState.CURRENT
    elif current in known_revisions():
        state = SchemaState.BEHIND
    else:
        state = SchemaState.UNKNOWN
    return SchemaStatus(current, head, state)


def drift(conn: Connection) -> list[str]:
    """What differs between the models and the database (Alembic's autogenerate comparison), one
    line per difference; empty when a database at the newest revision matches the code."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    opts = context_options(conn)
    opts.pop("connection")
    context = MigrationContext.configure(connection=conn, opts=opts)
    return [repr(d) for d in compare_metadata(context, opts["target_metadata"])]
