"""`tuneharness ledger`: read, verify and annotate the append-only ledger."""

from __future__ import annotations

import json
from typing import Annotated

import typer

app = typer.Typer(help="The append-only, hash-chained ledger of every money decision.", no_args_is_help=True)


@app.command("show")
def show(
    job: Annotated[str | None, typer.Option(help="Only this job's events.")] = None,
    kind: Annotated[str | None, typer.Option(help="Only events of this kind.")] = None,
    limit: Annotated[int | None, typer.Option(help="At most this many rows.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON list on stdout.")] = False,
) -> None:
    """List ledger events in order."""
    from app import bootstrap

    rows = bootstrap.ledger().rows(job=job, kind=kind, limit=limit)
    if as_json:
        typer.echo(json.dumps([r.as_dict() for r in rows], indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"ledger ({len(rows)} events)")
    for col in ("seq", "at", "kind", "job", "instance", "provider", "machine", "$/h", "$", "reason"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(
            str(r.seq),
            r.at[:19],
            r.kind,
            r.job or "",
            r.instance or "",
            r.provider or "",
            r.machine or "",
            "" if r.rate_usd_per_hour is None else f"{r.rate_usd_per_hour:.4f}",
            "" if r.amount_usd is None else f"{r.amount_usd:.4f}",
            r.reason,
        )
    Console().print(table)


@app.command("verify")
def verify(
    anchor: Annotated[
        str | None,
        typer.Option(help="SEQ:HASH as an earlier verify printed it: that row must still carry that hash."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object (the exit code is the same)")] = False,
) -> None:
    """Recompute the hash chain; exit 1 naming the first bad seq if a row was altered.

    Prints the newest row's anchor (SEQ:HASH): keep it somewhere the database's owner cannot edit
    (a ticket, a chat message, another machine) and pass it back with --anchor later.

    Exit codes: 0 the chain is intact (and the anchor matches); 1 a row was altered or removed;
    2 a malformed --anchor.
    """
    import json

    from app import bootstrap
    from app.ledger import parse_anchor

    report = bootstrap.ledger().verify(anchor=None if anchor is None else parse_anchor(anchor))
    if as_json:
        doc = {
            "ok": report.ok,
            "rows": report.rows,
            "anchor": report.anchor,
            "anchor_checked": anchor is not None,
            "first_bad_seq": report.first_bad_seq,
            "problem": report.problem,
        }
        typer.echo(json.dumps(doc))
        if not report.ok:
            raise typer.Exit(1)
        return
    if report.ok:
        typer.echo(f"ledger ok: {report.rows} events, chain intact" + (", anchor matches" if anchor else ""))
        if report.anchor:
            typer.echo(f"anchor: {report.anchor}")
        return
    typer.echo(f"ledger CORRUPT at seq {report.first_bad_seq}: {report.problem}", err=True)
    raise typer.Exit(1)


@app.command("note")
def note(
    text: Annotated[str, typer.Argument(help="What the operator did or saw.")],
    job: Annotated[str | None, typer.Option(help="The job this note is about.")] = None,
    instance: Annotated[str | None, typer.Option(help="The instance this note is about.")] = None,
) -> None:
    """Append an operator's note (e.g. "destroyed by hand in the vendor console")."""
    from app import bootstrap
    from app.ledger import Event

    if not text.strip():
        from app.errors import UserError

        raise UserError('an empty note says nothing. Fix: tuneharness ledger note "what happened"')
    row = bootstrap.ledger().append(Event(kind="operator_note", job=job, instance=instance, reason=text))
    typer.echo(f"noted as seq {row.seq}")


@app.command("lock-down")
def lock_down(
    role: Annotated[str, typer.Option(help="The PostgreSQL role the workers and the CLI will connect as.")],
    print_only: Annotated[bool, typer.Option("--print", help="Print the statements instead of running them.")] = False,
) -> None:
    """Let ROLE run the application while it may only INSERT and SELECT the ledger (PostgreSQL).

    Run as the tables' owner, after every upgrade; then point TUNEHARNESS_DB_URL at ROLE. Not owning
    the table, ROLE can neither UPDATE/DELETE ledger rows nor disable the triggers that refuse it.
    """
    from sqlalchemy import text

    from app import bootstrap
    from app.db import init_db, is_postgres, ledger_role_grants, write_transaction
    from app.errors import UserError

    stmts = ledger_role_grants(role)
    if print_only:
        typer.echo(";\n".join(stmts) + ";")
        return
    engine = bootstrap.engine()
    if not is_postgres(engine):
        raise UserError("lock-down needs PostgreSQL (SQLite has no roles). Fix: set TUNEHARNESS_DB_URL to PostgreSQL")
    init_db(engine)
    with write_transaction(engine, lock="tuneharness.schema") as conn:
        for stmt in stmts:
            conn.execute(text(stmt))
    typer.echo(f"role {role}: SELECT and INSERT on the ledger, full use of the other tables ({len(stmts)} grants)")
