"""`tuneharness budget`: caps, reservations and what is left."""

from __future__ import annotations

import json
from typing import Annotated

import typer

app = typer.Typer(help="Spend caps. Nothing is created without a reservation against one.", no_args_is_help=True)


@app.command("set")
def set_cap(
    name: Annotated[str, typer.Argument(help="Budget name, e.g. 'default' or a job id.")],
    cap_usd: Annotated[float, typer.Option("--cap-usd", help="The cap in dollars.")],
) -> None:
    """Create or change a cap (an explicit edit, recorded in the ledger)."""
    from app import bootstrap

    bootstrap.budget().set_cap(name, cap_usd)
    typer.echo(f"budget {name}: cap ${cap_usd:.2f}")


@app.command("show")
def show(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Caps, reserved, spent and left."""
    from app import bootstrap

    rows = bootstrap.budget().status()
    if as_json:
        typer.echo(json.dumps([
            {"name": r.name, "cap_usd": r.cap_usd, "reserved_usd": r.reserved_usd,
             "spent_usd": r.spent_usd, "left_usd": r.left_usd} for r in rows], indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="budgets")
    for col in ("name", "cap $", "reserved $", "spent $", "left $"):
        table.add_column(col)
    for r in rows:
        table.add_row(r.name, f"{r.cap_usd:.2f}", f"{r.reserved_usd:.4f}", f"{r.spent_usd:.4f}", f"{r.left_usd:.4f}")
    Console().print(table)
