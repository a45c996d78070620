"""`tuneharness receipt`: spend by job, provider and reason; what still bills, per hour, now."""

from __future__ import annotations

import json
from typing import Annotated

import typer


def register(cli: typer.Typer) -> None:
    cli.command("receipt")(receipt)


def receipt(
    since: Annotated[str | None, typer.Option(help="Only rentals alive on or after this date (YYYY-MM-DD).")] = None,
    job: Annotated[str | None, typer.Option(help="Only this job.")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """What was spent and why: GPU vs storage vs traffic, dead hosts, idle time, what still bills."""
    import time
    from datetime import UTC, datetime

    from app import bootstrap
    from app.errors import UserError
    from app.rentals import Rentals
    from app.services.receipts import build_receipt

    since_ts = 0.0
    if since:
        try:
            since_ts = datetime.fromisoformat(since).replace(tzinfo=UTC).timestamp()
        except ValueError:
            raise UserError(f"--since {since!r} is not a date. Fix: use YYYY-MM-DD") from None
    engine = bootstrap.engine()
    data = build_receipt(Rentals(engine), bootstrap.ledger(), now=time.time(), since=since_ts, job=job).as_dict()
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(
        f"total ${data['total_usd']:.4f}: GPU ${data['gpu_usd']:.4f}, storage ${data['storage_usd']:.4f}, "
        f"traffic ${data['traffic_usd']:.4f}"
    )
    console.print(
        f"dead hosts {data['dead_hosts']} cost ${data['dead_host_cost_usd']:.4f}; "
        f"idle GPU time billed {data['idle_seconds_billed']:.0f}s"
    )
    console.print(
        f"still billing ${data['billing_per_hour_now']:.4f}/h: running {data['running']}, stopped {data['stopped']}"
    )
    for title, key in (("by job", "by_job"), ("by provider", "by_provider"), ("by reason", "by_reason")):
        table = Table(title=title)
        table.add_column(title.split()[-1])
        table.add_column("$")
        for k, v in data[key].items():
            table.add_row(k, f"{v:.4f}")
        console.print(table)
