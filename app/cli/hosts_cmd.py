"""`tuneharness hosts`: renter-side reputation and quarantine of every machine we rented."""

from __future__ import annotations

import json
from typing import Annotated

import typer

app = typer.Typer(
    help="What each rented machine delivered for us, and which are quarantined.",
    invoke_without_command=True,
)


@app.callback()
def hosts(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="print a JSON list")] = False,
) -> None:
    """List every machine: creates, boots, preflights passed, slices finished, failures, quarantine."""
    if ctx.invoked_subcommand is not None:
        return
    import time

    from app import bootstrap

    now = time.time()
    views = [v.to_dict(now=now) for v in bootstrap.reputation().hosts()]
    if as_json:
        typer.echo(json.dumps(views, indent=2))
        return
    if not views:
        typer.echo("no machines rented yet")
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="hosts")
    for col in (
        "provider",
        "machine",
        "creates",
        "booted",
        "preflight ok",
        "slices",
        "failures",
        "last failure",
        "p(deliver)",
        "quarantine",
    ):
        table.add_column(col)
    for v in views:
        table.add_row(
            str(v["provider"]),
            str(v["machine_id"]),
            str(v["creates"]),
            str(v["booted"]),
            str(v["preflight_passed"]),
            str(v["slices_finished"]),
            str(len(v["failures"])),  # type: ignore[arg-type]
            str(v["last_failure"] or "-"),
            f"{v['delivery_probability']:.2f}",
            str(v["quarantine"] or "-"),
        )
    Console().print(table)


@app.command("unquarantine")
def unquarantine(
    machine_id: Annotated[str, typer.Argument(help="the machine id, as `tuneharness hosts` shows it")],
    provider: Annotated[
        str | None, typer.Option("--provider", help="needed only when two providers share the id")
    ] = None,
) -> None:
    """Lift a machine's quarantine (the operator's decision; its history stays; ledger event)."""
    from app import bootstrap

    rec = bootstrap.reputation().unquarantine(machine_id, provider=provider, ledger=bootstrap.ledger())
    typer.echo(f"{rec.provider}:{rec.machine_id} may be rented again")


@app.command("held")
def held(
    as_json: Annotated[bool, typer.Option("--json", help="print a JSON list")] = False,
    all_states: Annotated[bool, typer.Option("--all", help="also hosts adopted or released since")] = False,
) -> None:
    """Verified hosts kept running for the next compatible job, or as standby for a job's recoveries."""
    import time

    from app import bootstrap
    from app.services.pool import Pool

    states = ("held", "adopted", "released") if all_states else ("held",)
    rows = [h.to_dict() for h in Pool(bootstrap.engine()).held(states=states)]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        typer.echo("no held hosts")
        return
    from rich.console import Console
    from rich.table import Table

    now = time.time()
    table = Table(title="held hosts")
    for col in ("instance", "machine", "gpu", "$/h", "job", "standby", "held work", "state", "hold left"):
        table.add_column(col)
    for h in rows:
        left = float(h["hold_until"]) - now
        table.add_row(
            str(h["instance_id"]),
            str(h["machine_id"]),
            str(h["gpu_name"]),
            f"{h['dph_total']:.3f}",
            str(h["owner"]),
            "yes" if h["standby"] else "-",
            "yes" if h["held_work"] else "-",
            str(h["state"]),
            f"{left / 60:.0f} min" if h["state"] == "held" and left > 0 else "-",
        )
    Console().print(table)
