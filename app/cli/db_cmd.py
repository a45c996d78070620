"""`tuneharness db`: which schema revision the database is at, and upgrading it."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from app.migrations import SchemaStatus

app = typer.Typer(help="The database's schema: its revision, and upgrading it.", no_args_is_help=True)

_FIX = "Fix: tuneharness db upgrade (on PostgreSQL, as the tables' owner)"


def _engine() -> Engine:
    """The configured database, opened without upgrading it (every other command upgrades on start)."""
    from app import bootstrap
    from app.db import make_engine

    s = bootstrap.settings()
    if s.db_url.startswith("sqlite:///"):
        s.home.mkdir(parents=True, exist_ok=True)
    return make_engine(s.db_url)


def _status(engine: Engine) -> SchemaStatus:
    from app.db import read_connection
    from app.migrations import schema_status

    with read_connection(engine) as conn:
        return schema_status(conn)


def describe(st: SchemaStatus) -> tuple[bool, str]:
    """(whether the schema is what this version needs, one line saying where it stands)."""
    from app.migrations import SchemaState

    if st.state is SchemaState.CURRENT:
        return True, f"schema at revision {st.current}, the newest this version ships"
    if st.state is SchemaState.NEW:
        return True, f"no tables yet: the first command creates the schema at revision {st.head}"
    if st.state is SchemaState.LEGACY:
        return (
            False,
            f"tables made before schema migrations: an upgrade adopts them, then brings them to {st.head}. {_FIX}",
        )
    if st.state is SchemaState.BEHIND:
        return False, f"schema at revision {st.current}, this version needs {st.head}. {_FIX}"
    return False, (
        f"schema at revision {st.current}, which this version does not know (a newer version wrote it). "
        "Fix: upgrade tuneharness on this machine"
    )


@app.command("current")
def current(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object (the exit code is the same).")] = False,
) -> None:
    """Print the schema revision the database is at and the one this version needs; exit 1 when they differ.

    Reads only: it never upgrades (every other command does, on start).
    """
    engine = _engine()
    try:
        st = _status(engine)
    finally:
        engine.dispose()
    ok, line = describe(st)
    if as_json:
        typer.echo(json.dumps({**st.as_dict(), "ok": ok}))
    else:
        typer.echo(line)
    if not ok:
        raise typer.Exit(1)


@app.command("upgrade")
def upgrade(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Bring the database to the newest schema revision (a home made before migrations is adopted first).

    Safe while workers run: they take turns under the schema lock. On PostgreSQL run it as the
    tables' owner, then `tuneharness ledger lock-down --role ROLE` again for the application's role.
    """
    from app.db import init_db

    engine = _engine()
    try:
        before = _status(engine)
        init_db(engine)
        after = _status(engine)
    finally:
        engine.dispose()
    if as_json:
        typer.echo(json.dumps({"from": before.current, "to": after.current, "state": before.state.value}))
        return
    if before.current == after.current:
        typer.echo(f"schema already at revision {after.current}, the newest")
    else:
        typer.echo(f"schema upgraded from {before.current or 'none'} ({before.state.value}) to {after.current}")
