"""`tuneharness submit JOB.yaml` and `tuneharness jobs`: hand work to the fleet and see its phase."""

from __future__ import annotations

import json
from typing import Annotated

import typer


def register(cli: typer.Typer) -> None:
    """Add `submit` and `jobs` as top-level commands."""
    cli.command("submit")(submit)
    cli.command("jobs")(jobs)


def submit(
    job_file: Annotated[str, typer.Argument(help="the job file (YAML)")],
    check: Annotated[bool, typer.Option("--check", help="only validate the file; enqueue nothing")] = False,
) -> None:
    """Validate a job file, record the job and enqueue it; print its id. The fleet does the rest."""
    from app.api import submit as submit_job
    from app.jobs import load_job_file

    spec = load_job_file(job_file)
    if check:
        typer.echo(f"{job_file}: ok ({spec.name})")
        return
    typer.echo(submit_job(spec))


def jobs(as_json: Annotated[bool, typer.Option("--json", help="print a JSON list")] = False) -> None:
    """List submitted jobs and their phase."""
    from app.api import list_jobs

    rows = [r.to_dict() for r in list_jobs()]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        typer.echo("no jobs yet: tuneharness submit JOB.yaml")
        return
    import time

    from rich.console import Console
    from rich.table import Table

    table = Table(title="jobs")
    for col in ("job", "name", "phase", "budget $", "submitted", "detail"):
        table.add_column(col)
    for r in rows:
        submitted = time.strftime("%Y-%m-%d %H:%M", time.gmtime(float(r["created_at"])))
        budget = "-" if r["budget_usd"] is None else f"{r['budget_usd']:.2f}"
        table.add_row(str(r["job_id"]), str(r["name"]), str(r["phase"]), budget, submitted, str(r["detail"]))
    Console().print(table)
