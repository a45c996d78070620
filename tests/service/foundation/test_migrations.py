"""Schema migrations: a database made by the last release without migrations upgrades with its rows,
its hash chain and its append-only guard intact; a new one goes straight to the newest revision; the
models never differ from what the migrations build."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from app.budget import Budget
from app.db import init_db, ledger_role_grants, make_engine, read_connection
from app.errors import UserError
from app.ledger import Event, Ledger
from app.migrations import SchemaState, drift, head_revision, known_revisions, schema_status, upgrade

REPO = Path(__file__).resolve().parents[3]
RELEASE = "8382a93"  # the last release made without migrations (scripts/make_release_db.py writes its fixtures)
FIXTURES = REPO / "tests" / "fixtures" / "db"
DIALECTS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
PG_ADMIN = os.environ.get("TUNEHARNESS_TEST_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
FIX_DRIFT = 'Fix: write a migration: python scripts/new_migration.py "what changed" (docs/deploy.md)'


@pytest.fixture(params=DIALECTS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty SQLite file or PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'tuneharness.db'}"
    return str(request.getfixturevalue("pg_url"))


def load_release(url: str) -> None:
    """Fill the empty database at `url` with the release's dump (schema, triggers, rows)."""
    if url.startswith("sqlite"):
        sql = (FIXTURES / f"release-{RELEASE}.sqlite.sql").read_text(encoding="utf-8")
        conn = sqlite3.connect(url.removeprefix("sqlite:///"))
        try:
            conn.executescript(sql)
        finally:
            conn.close()
        return
    sql = (FIXTURES / f"release-{RELEASE}.postgres.sql").read_text(encoding="utf-8")
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://", 1), autocommit=True) as conn:
        conn.execute(sql)


@pytest.fixture
def release_engine(url: str) -> Iterator[Engine]:
    load_release(url)
    engine = make_engine(url)
    yield engine
    engine.dispose()


def _status(engine: Engine) -> SchemaState:
    with read_connection(engine) as conn:
        return schema_status(conn).state


def _drift(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return drift(conn)


def _count(engine: Engine, table: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())


def test_a_release_database_upgrades_with_its_rows_chain_and_guard_intact(release_engine: Engine) -> None:
    """Given the release's database, when today's init_db runs, then it is adopted and upgraded to the
    newest revision, every row stays, the chain verifies, the triggers still refuse UPDATE and DELETE,
    and the database matches the models."""
    engine = release_engine
    assert _status(engine) is SchemaState.LEGACY
    before = {t: _count(engine, t) for t in ("ledger_events", "budget_caps", "budget_reservations", "jobs")}
    assert before == {"ledger_events": 6, "budget_caps": 1, "budget_reservations": 1, "jobs": 1}

    init_db(engine)

    assert _status(engine) is SchemaState.CURRENT
    assert {t: _count(engine, t) for t in before} == before
    ledger = Ledger(engine)
    report = ledger.verify()
    assert report.ok and report.rows == 6, report.problem
    assert [r.reason for r in ledger.rows(job="job-fixture")] == ["fixture rental", "fixture teardown"]
    for sql in ("UPDATE ledger_events SET reason = 'forged' WHERE seq = 2", "DELETE FROM ledger_events"):
        with pytest.raises(DBAPIError, match="append-only"), engine.begin() as conn:
            conn.execute(text(sql))
    if engine.dialect.name == "postgresql":
        with pytest.raises(DBAPIError, match="append-only"), engine.begin() as conn:
            conn.execute(text("SET LOCAL session_replication_role = replica"))
            conn.execute(text("UPDATE ledger_events SET reason = 'forged' WHERE seq = 2"))
    differences = _drift(engine)
    assert not differences, f"the upgraded database differs from the models: {differences}. {FIX_DRIFT}"
    ledger.append(Event(kind="operator_note", reason="after the upgrade"))
    assert ledger.verify().ok
    (status,) = Budget(engine).status()
    assert (status.name, status.cap_usd, status.spent_usd) == ("fixture-total", 25.0, 1.75)


def _fingerprint(engine: Engine) -> list[tuple[object, ...]]:
    """Everything the schema holds, as the database itself describes it: tables with their CHECKs,
    indexes, triggers (PostgreSQL: with whether they fire always) and functions."""
    if engine.dialect.name == "sqlite":
        queries = ["SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name"]
    else:
        queries = [
            "SELECT table_name, column_name, data_type, is_nullable, column_default, character_maximum_length "
            "FROM information_schema.columns WHERE table_schema = current_schema() ORDER BY 1, 2",
            "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE connamespace = current_schema()::regnamespace ORDER BY 1, 2",
            "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema() ORDER BY 1, 2",
            "SELECT tgrelid::regclass::text, tgname, tgenabled, pg_get_triggerdef(oid) FROM pg_trigger "
            "WHERE NOT tgisinternal ORDER BY 1, 2",
            "SELECT proname, prosrc FROM pg_proc WHERE pronamespace = current_schema()::regnamespace ORDER BY 1",
        ]
    with engine.connect() as conn:
        return [tuple(row) for q in queries for row in conn.execute(text(q)).all()]


def test_a_new_database_gets_exactly_what_running_every_migration_builds(url: str, tmp_path: Path) -> None:
    """A new database is made at the newest revision in one step (the models' tables); running every
    migration from nothing builds the very same schema, CHECKs and triggers included, and Alembic sees
    no difference from the models: a column added to a model without a migration fails here."""
    new = make_engine(url)
    assert _status(new) is SchemaState.NEW
    init_db(new)
    init_db(new)  # a second start changes nothing
    assert _status(new) is SchemaState.CURRENT
    if url.startswith("sqlite"):
        migrated_url = f"sqlite:///{tmp_path / 'migrated.db'}"
    else:
        migrated_url = url.rsplit("/", 1)[0] + "/" + url.rsplit("/", 1)[1] + "_m"
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{migrated_url.rsplit("/", 1)[1]}"')
    migrated = make_engine(migrated_url)
    try:
        with migrated.begin() as conn:
            upgrade(conn)
        init_db(migrated)
        differences = _drift(migrated)
        assert not differences, f"the models differ from the newest migration: {differences}. {FIX_DRIFT}"
        made, built = _fingerprint(new), _fingerprint(migrated)
        only_new = [r for r in made if r not in built]
        only_migrated = [r for r in built if r not in made]
        assert made == built, f"new database only: {only_new}; migrated only: {only_migrated}. {FIX_DRIFT}"
    finally:
        migrated.dispose()
        new.dispose()
        if not url.startswith("sqlite"):
            with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
                name = migrated_url.rsplit("/", 1)[1]
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_the_model_check_sees_a_column_no_migration_made(tmp_path: Path) -> None:
    """The drift check is not vacuous: a column the models do not declare is reported by name."""
    engine = make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    init_db(engine)
    with engine.begin() as conn:
        conn.execute(text("ALTER TABLE jobs ADD COLUMN priority INTEGER"))
    differences = _drift(engine)
    assert len(differences) == 1 and "priority" in differences[0]


def test_the_revision_files_form_one_line_whose_head_alembic_agrees_with() -> None:
    """The quick head read from the files' text is Alembic's own head, over every revision it loads."""
    from alembic.script import ScriptDirectory

    from app.migrations import alembic_config

    script = ScriptDirectory.from_config(alembic_config())
    assert script.get_heads() == [head_revision()]
    assert {s.revision for s in script.walk_revisions()} == known_revisions()


_STARTUP = """
import sys
from app.db import init_db, make_engine
init_db(make_engine(sys.argv[1]))
print("alembic" in sys.modules)
"""


def _start(url: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _STARTUP, url],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_workers_starting_together_adopt_a_release_database_once(release_engine: Engine) -> None:
    """Four processes start on the release's database at once: each waits its turn under the schema
    lock, one upgrades, and the others find it current."""
    url = release_engine.url.render_as_string(hide_password=False)
    procs = [_start(url) for _ in range(4)]
    results = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], [err for _, err in results]
    with release_engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all() == [head_revision()]
    assert _count(release_engine, "ledger_events") == 6 and Ledger(release_engine).verify().ok


def test_a_new_or_current_database_starts_without_loading_alembic(tmp_path: Path) -> None:
    """A process that creates a new database, or finds one at the newest revision, never imports Alembic."""
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    for _ in ("new", "current"):
        proc = _start(url)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert out.strip() == "False"
    assert _status(make_engine(url)) is SchemaState.CURRENT


def test_a_database_a_newer_version_wrote_is_refused_in_one_line(tmp_path: Path) -> None:
    """A revision this version does not ship stops the start with one line naming the fix."""
    engine = make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    init_db(engine)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    with pytest.raises(UserError, match=r"does not know.*Fix: upgrade tuneharness"):
        init_db(engine)
    assert _status(engine) is SchemaState.UNKNOWN


def test_a_missing_ledger_trigger_is_put_back_on_start(url: str) -> None:
    """A database at the newest revision whose ledger trigger was dropped gets it back on the next start."""
    engine = make_engine(url)
    init_db(engine)
    with engine.begin() as conn:
        conn.execute(text("DROP TRIGGER ledger_no_update" + (" ON ledger_events" if "postgres" in url else "")))
    init_db(engine)
    ledger = Ledger(engine)
    ledger.append(Event(kind="operator_note", reason="x"))
    with pytest.raises(DBAPIError, match="append-only"), engine.begin() as conn:
        conn.execute(text("UPDATE ledger_events SET reason = 'forged'"))
    engine.dispose()


@pytest.mark.postgres
def test_a_role_that_may_not_alter_tables_is_told_to_upgrade_as_the_owner(pg_url: str) -> None:
    """The application's locked-down role starts fine on a current database; on one that needs a
    migration it stops with one line naming `tuneharness db upgrade` as the owner, which fixes it."""
    import uuid

    owner = make_engine(pg_url)
    init_db(owner)
    role = f"th_app_{uuid.uuid4().hex[:8]}"
    admin = owner.url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'pw'")
        for stmt in ledger_role_grants(role):
            conn.execute(stmt)
    app_engine = make_engine(owner.url.set(username=role, password="pw").render_as_string(hide_password=False))
    try:
        init_db(app_engine)  # current: one read, nothing to change
        with owner.begin() as conn:  # as if the database were made before migrations
            conn.execute(text("DELETE FROM alembic_version"))
        with pytest.raises(UserError, match=r"may not change tables\. Fix: run `tuneharness db upgrade`"):
            init_db(app_engine)
        init_db(owner)
        init_db(app_engine)
        assert _status(app_engine) is SchemaState.CURRENT
    finally:
        app_engine.dispose()
        owner.dispose()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE {role}")


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TUNEHARNESS_", "VAST_", "RUNPOD_"))}
    env.update(TUNEHARNESS_HOME=str(home), PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    return subprocess.run(
        [sys.executable, "-m", "app.cli.main", *args], cwd=REPO, env=env, text=True, capture_output=True, timeout=120
    )


def test_db_current_and_upgrade_on_a_release_home(tmp_path: Path) -> None:
    """`db current` says a release's home needs the upgrade and names the command (exit 1); `db upgrade`
    adopts and upgrades it; then `db current` is content and `ledger verify` passes."""
    home = tmp_path / "home"
    home.mkdir()
    load_release(f"sqlite:///{home / 'tuneharness.db'}")
    before = _cli(home, "db", "current")
    assert before.returncode == 1 and "tuneharness db upgrade" in before.stdout, before
    up = _cli(home, "db", "upgrade")
    assert up.returncode == 0 and f"to {head_revision()}" in up.stdout, up
    after = _cli(home, "db", "current", "--json")
    assert after.returncode == 0 and '"state": "current"' in after.stdout, after
    assert _cli(home, "ledger", "verify").returncode == 0


def test_any_command_on_a_database_from_a_newer_version_exits_2_in_one_line(tmp_path: Path) -> None:
    """A command started on a database a newer version migrated prints one line with the fix, no traceback."""
    home = tmp_path / "home"
    home.mkdir()
    engine = make_engine(f"sqlite:///{home / 'tuneharness.db'}")
    init_db(engine)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    engine.dispose()
    out = _cli(home, "ledger", "show")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "upgrade tuneharness" in out.stderr
    current = _cli(home, "db", "current")
    assert current.returncode == 1 and "does not know" in current.stdout
