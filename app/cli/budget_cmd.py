"""`tuneharness budget`: caps, reservations and what is left."""

from __future__ import annotations

import json
from typing import Annotated

import typer

app = typer.Typer(help="Spend caps. Nothing is created without a reservation against one.", no_args_is_help=True)


@app.command("set")
def set_cap(
    name: Annotated[str, typer.Argument(help="'default', a job id, 'day', 'week', 'month' or 'gpu-minutes-day'.")],
    cap_usd: Annotated[float | None, typer.Option("--cap-usd", help="The cap in dollars.")] = None,
    cap_gpu_minutes: Annotated[float | None, typer.Option("--cap-gpu-minutes", help="A cap in GPU minutes.")] = None,
) -> None:
    """Create or change a cap (an explicit edit, recorded in the ledger).

    'day', 'week' and 'month' count only the current UTC period; 'gpu-minutes-day' is charged
    GPU minutes at reservation time, before a create.
    """
    from app import bootstrap
    from app.errors import UserError
    from app.numbers import MAX_USD, finite

    if (cap_usd is None) == (cap_gpu_minutes is None):
        raise UserError("give exactly one of --cap-usd N or --cap-gpu-minutes N")
    # Checked before the database is opened: `nan`, `inf` and `1e309` parse as floats.
    option = "--cap-usd" if cap_usd is not None else "--cap-gpu-minutes"
    finite(cap_usd if cap_usd is not None else cap_gpu_minutes, option, minimum=0, maximum=MAX_USD)
    if cap_gpu_minutes is not None:
        bootstrap.budget().set_cap(name, cap_gpu_minutes, unit="gpu_minutes")
        typer.echo(f"budget {name}: cap {cap_gpu_minutes:.0f} GPU minutes")
        return
    assert cap_usd is not None
    bootstrap.budget().set_cap(name, cap_usd)
    typer.echo(f"budget {name}: cap ${cap_usd:.2f}")


@app.command("show")
def show(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Caps, reserved, spent and left."""
    from app import bootstrap

    rows = bootstrap.budget().status()
    if as_json:
        typer.echo(
            json.dumps(
                [
                    {
                        "name": r.name,
                        "cap_usd": r.cap_usd,
                        "reserved_usd": r.reserved_usd,
                        "spent_usd": r.spent_usd,
                        "left_usd": r.left_usd,
                        "unit": r.unit,
                        "period": r.period,
                    }
                    for r in rows
                ],
                indent=2,
            )
        )
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="budgets")
    for col in ("name", "period", "unit", "cap", "reserved", "spent", "left"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r.name,
            r.period,
            r.unit,
            f"{r.cap_usd:.2f}",
            f"{r.reserved_usd:.4f}",
            f"{r.spent_usd:.4f}",
            f"{r.left_usd:.4f}",
        )
    Console().print(table)
