"""`tuneharness cancel JOB`, `tuneharness resume JOB` and `tuneharness logs JOB [-f]`: end a job
for now, continue it from its newest pulled checkpoint, and read its trainer's train.log
(docs/lifecycle.md)."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from app.services.lifecycle import Lifecycle

__all__ = ["register"]

EXIT_CODES = "Exit codes: 0 done; 1 a vendor refused a stop (run it again); 2 bad input, nothing written."


def register(cli: typer.Typer) -> None:
    """Add `cancel`, `resume` and `logs` as top-level commands."""
    cli.command("cancel", epilog=EXIT_CODES)(cancel)
    cli.command("resume", epilog="Exit codes: 0 resumed; 2 bad input or no broker, nothing written.")(resume)
    cli.command("logs", epilog="Exit codes: 0 the log (or none kept) shown; 2 unknown job.")(logs)


def _lifecycle(*, enqueue: bool = False) -> Lifecycle:
    from app import bootstrap
    from app.services.lifecycle import Lifecycle

    return Lifecycle(bootstrap.supervisor(), enqueue=bootstrap.enqueue_job if enqueue else None)


def cancel(
    job: Annotated[str, typer.Argument(help="the job id (tuneharness jobs)")],
    reason: Annotated[str, typer.Option("--reason", help="why, for the ledger and the alert")] = "no reason given",
    as_json: Annotated[bool, typer.Option("--json", help="print what was stopped and settled as JSON")] = False,
) -> None:
    """Cancel a job: stop its hosts (never destroy), settle its reservations, end its chains. It is
    never recovered; `tuneharness resume JOB` continues it from its newest pulled checkpoint."""
    report = _lifecycle().cancel(job, reason=reason)
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2))
    else:
        stopped = ", ".join(report.stopped) or "none running"
        typer.echo(f"cancelled {job}: stopped {stopped}; ${report.settled_usd:.4f} settled")
        for run, step in report.checkpoints.items():
            typer.echo(f"  {run}: resume would go on from step {step}")
        for err in report.errors:
            typer.echo(f"  not stopped: {err}", err=True)
    if report.errors:
        typer.echo(f"error: {len(report.errors)} host(s) not stopped. Fix: tuneharness cancel {job} again", err=True)
        raise typer.Exit(1)


def resume(
    job: Annotated[str, typer.Argument(help="the job id (tuneharness jobs)")],
    budget_usd: Annotated[
        float | None,
        typer.Option("--budget-usd", help="dollars more for the continuation (the cap becomes what it used plus this)"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the runs, their steps and caps as JSON")] = False,
) -> None:
    """Continue a cancelled, failed or budget-stopped job from its newest pulled checkpoint, on a
    fresh rental or a held host."""
    from app import bootstrap

    life = _lifecycle(enqueue=True)
    life.check_resume(job, budget_usd=budget_usd)  # bad input first: nothing written, broker or not
    bootstrap.require_broker()
    report = life.resume(job, budget_usd=budget_usd)
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2))
        return
    for run, step in report.from_steps.items():
        cap = report.caps_usd.get(run)
        typer.echo(f"resumed {run} from step {step}" + ("" if cap is None else f" (cap ${cap:.2f})"))
    if report.waits_for_budget:
        typer.echo("its stopped host starts again once the budget has room (the supervisor's next look)")


def logs(
    job: Annotated[str, typer.Argument(help="the job id (tuneharness jobs)")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="keep reading across slices and host changes")] = False,
    every_s: Annotated[float, typer.Option("--every", help="-f: seconds between reads")] = 5.0,
    as_json: Annotated[bool, typer.Option("--json", help="print the log per host as JSON (not with -f)")] = False,
) -> None:
    """The trainer's train.log: from the host while it trains, from the pulled copy after."""
    from app import bootstrap
    from app.errors import UserError
    from app.services.joblogs import follow as follow_log
    from app.services.joblogs import read_log

    store = bootstrap.jobs()
    if store.get(job) is None:
        raise UserError(f"no job {job!r}. Fix: pick an id from `tuneharness jobs`")
    runs = [r for r in store.runs(job).values() if r is not None]
    if runs:
        raise UserError(f"job {job} trains one run per gate seed. Fix: tuneharness logs {runs[0].job_id}")
    if follow and as_json:
        raise UserError("--follow and --json do not mix. Fix: pass one of them")
    sup = bootstrap.supervisor()
    if follow:

        def wait() -> bool:
            time.sleep(max(0.5, every_s))
            return True

        for line in follow_log(sup, job, wait=wait):
            typer.echo(line)
        return
    chunks = read_log(sup, job)
    if as_json:
        typer.echo(
            json.dumps(
                [
                    {"instance": c.instance_id, "machine": c.machine_id, "source": c.source, "log": c.text}
                    for c in chunks
                ],
                indent=2,
            )
        )
        return
    for c in chunks:
        if c.source == "none":
            typer.echo(f"no train.log for {job}: nothing trains now and no copy was pulled", err=True)
            continue
        typer.echo(f"== host {c.machine_id} ({c.instance_id}, {c.source}) ==")
        typer.echo(c.text.rstrip("\n"))
