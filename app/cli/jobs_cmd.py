"""`tuneharness submit JOB.yaml`, `tuneharness jobs` and `tuneharness extend JOB`: hand work to the
fleet, see its phase, and give a job's running hosts more time before their kill-time."""

from __future__ import annotations

import json
import math
import time
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from app.services.submit_plan import SubmitPlan


jobs_app = typer.Typer(
    help="List submitted jobs and their phase; `jobs show JOB` for one job's timeline.",
    invoke_without_command=True,
    no_args_is_help=False,
)


def register(cli: typer.Typer) -> None:
    """Add `submit`, `jobs` (with `jobs show`) and `extend` as top-level commands."""
    cli.command("submit")(submit)
    cli.add_typer(jobs_app, name="jobs")
    cli.command("extend")(extend)


def submit(
    job_file: Annotated[str, typer.Argument(help="the job file (YAML)")],
    check: Annotated[bool, typer.Option("--check", help="only validate the file; enqueue nothing")] = False,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="show the offers it would rent now, their all-in cost, kill-time and reservations; "
            "create, reserve and enqueue nothing",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON (the job id, or the --dry-run plan)")] = False,
    top: Annotated[int, typer.Option("--top", help="--dry-run: how many offers to show (1-50)")] = 5,
) -> None:
    """Validate a job file, record the job and enqueue it; print its id. The fleet does the rest."""
    from app.errors import UserError
    from app.jobs import load_job_file

    if check and dry_run:
        raise UserError("--check and --dry-run are two different answers. Fix: pass one of them")
    if not 1 <= top <= 50:
        raise UserError(f"--top {top} is not in 1..50. Fix: e.g. --top 5")
    spec = load_job_file(job_file)
    if check:
        typer.echo(json.dumps({"ok": True, "name": spec.name}) if as_json else f"{job_file}: ok ({spec.name})")
        return
    if dry_run:
        from app import bootstrap
        from app.services.submit_plan import plan_submission

        svc = bootstrap.provisioning()
        plan = plan_submission(spec, svc, now=svc.clock.now(), top=top)
        if as_json:
            typer.echo(json.dumps(plan.to_dict(), indent=2))
        else:
            _print_plan(plan)
        return
    from app.api import submit as submit_job

    job_id = submit_job(spec, warn=lambda message: typer.echo(f"warning: {message}", err=True))
    typer.echo(json.dumps({"job_id": job_id}) if as_json else job_id)


def _when(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(epoch))


def _print_plan(plan: SubmitPlan) -> None:
    runs = f"{plan.runs} training runs (one per gate seed), each" if plan.runs > 1 else "one training run"
    budget = "no cap of its own" if plan.budget_per_run_usd is None else f"a ${plan.budget_per_run_usd:.2f} cap"
    typer.echo(f"dry run of {plan.source} ({plan.name}): nothing created, reserved or enqueued")
    typer.echo(f"{runs} with {budget}; searched {', '.join(plan.providers)}: {plan.searched} offer(s)")
    if plan.offers:
        typer.echo("what provisioning would try first, in order (expected $: failed attempts priced in):")
    for o in plan.offers:
        gpus = "" if o.offer.num_gpus == 1 else f"{o.offer.num_gpus}x "
        typer.echo(
            f"{o.rank:>2}. {o.offer.provider}:{o.offer.offer_id}  {gpus}{o.offer.gpu_name}  "
            f"${o.all_in_usd_per_hour:.4f}/h all-in  expected ${o.delivered_usd:.4f}  "
            f"kill after {o.kill_after_s / 3600.0:.1f} h"
        )
        reserves = ", ".join(
            (f"{r.cap} ${r.amount:.2f}" if r.unit == "usd" else f"{r.cap} {r.amount:.1f} min")
            + ("" if r.left_before is None else f" of {r.left_before:.2f} left")
            for r in o.reservations
        )
        typer.echo(f"    reserves {reserves or 'nothing (no cap)'}")
    if plan.offers:
        typer.echo(
            f"the first rental would be stopped at {_when(plan.offers[0].kill_at)} unless extended "
            "(tuneharness extend JOB --hours H)"
        )
    for note in plan.notes:
        typer.echo(f"note: {note}")


def extend(
    job: Annotated[str, typer.Argument(help="the job id (tuneharness jobs)")],
    hours: Annotated[float, typer.Option("--hours", help="move each host's kill-time this much later")],
    reason: Annotated[str, typer.Option("--reason", help="why, for the ledger")] = "operator: the job needs longer",
) -> None:
    """Give a job's hosts more time: their kill-time moves later, one ledger event each (a job
    paused at its kill-time resumes on the same host)."""
    from app import bootstrap
    from app.errors import UserError
    from app.rentals import MAX_EXTEND_S, Rentals

    if not (math.isfinite(hours) and 0 < hours <= MAX_EXTEND_S / 3600.0):
        raise UserError(
            f"--hours {hours:g} is not in (0, {MAX_EXTEND_S / 3600.0:g}]. Fix: give the extra hours, e.g. --hours 2"
        )
    store = bootstrap.jobs()
    if store.get(job) is None:
        raise UserError(f"no job {job!r}. Fix: pick an id from `tuneharness jobs`")
    rentals = Rentals(bootstrap.engine(), ledger=bootstrap.ledger())
    ids = [job, *(r.job_id for r in store.runs(job).values() if r is not None)]
    # stopped ones too: a job paused at its kill-time resumes once its host's kill-time lies ahead
    running = [r for jid in ids for r in rentals.all(states=("intent", "active", "stopped"), job=jid)]
    if not running:
        raise UserError(f"job {job} has no host to extend. Fix: check `tuneharness status`")
    for r in running:
        after = rentals.extend_kill_time(r.id, by_s=hours * 3600.0, reason=reason, now=time.time())
        if after is not None:
            typer.echo(f"{r.instance_id or r.id}: kill-time {_when(r.kill_at)} -> {_when(after.kill_at)}")


@jobs_app.callback()
def jobs(
    ctx: typer.Context, as_json: Annotated[bool, typer.Option("--json", help="print a JSON list")] = False
) -> None:
    """List submitted jobs and their phase."""
    if ctx.invoked_subcommand is not None:
        return
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


@jobs_app.command("show", epilog="Exit codes: 0 shown; 2 unknown job.")
def show(
    job: Annotated[str, typer.Argument(help="the job id (tuneharness jobs)")],
    as_json: Annotated[bool, typer.Option("--json", help="print the timeline as JSON")] = False,
) -> None:
    """One job's timeline: phases, hosts, failures with evidence, recoveries, slices, money by cause."""
    from app import bootstrap
    from app.rentals import Rentals
    from app.services.timeline import job_timeline

    t = job_timeline(
        job, jobs=bootstrap.jobs(), ledger=bootstrap.ledger(), rentals=Rentals(bootstrap.engine()), now=time.time()
    )
    if as_json:
        typer.echo(json.dumps(t, indent=2))
        return
    j = t["job"]
    budget = "no cap" if j["budget_usd"] is None else f"budget ${j['budget_usd']:.2f}"
    typer.echo(f"{j['job_id']} ({j['name']}): {j['phase']}, {budget}; {j['detail']}")
    for r in t["runs"]:
        typer.echo(f"  run {r['job_id']}: {r['phase']}; {r['detail']}")
    typer.echo("phases:")
    for p in t["phases"]:
        typer.echo(f"  {p['at'][:19]}  {p['kind']:<24} {p['run']}  {p['reason'][:80]}")
    typer.echo(f"hosts ({t['slices']} slice(s)):")
    for h in t["hosts"]:
        rate = "?" if h["usd_per_hour"] is None else f"${h['usd_per_hour']:.3f}/h"
        typer.echo(
            f"  {h['instance']}  {h['machine']}  {h['provider']}  {h['state']:<9} {rate}  {h['slices']} slice(s)"
        )
    typer.echo("failures:" if t["failures"] else "failures: none")
    for f in t["failures"]:
        seen = f" ({f['cause']})" if f["cause"] else ""
        typer.echo(f"  {f['at'][:19]}  {f['kind']:<14} {f['machine']}{seen}  {f['reason'][:60]}  {f['evidence'][:60]}")
    typer.echo("recoveries:" if t["recoveries"] else "recoveries: none")
    for r in t["recoveries"]:
        took = "-" if r["recovery_s"] is None else f"{float(r['recovery_s']):.0f} s"
        typer.echo(f"  {r['at'][:19]}  {r['cause']} on {r['lost_machine']} -> {r['machine']}: {took}")
    money = ", ".join(f"{k} ${v:.4f}" for k, v in t["money_by_cause_usd"].items()) or "nothing billed"
    typer.echo(f"money: ${t['total_usd']:.4f} ({money})")
