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
def verify() -> None:
    """Recompute the hash chain; exit 1 naming the first bad seq if a row was altered."""
    from app import bootstrap

    report = bootstrap.ledger().verify()
    if report.ok:
        typer.echo(f"ledger ok: {report.rows} events, chain intact")
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
