"""`tuneharness doctor`: check what the fleet needs and say how to fix what is missing."""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from beat_schedule import BEAT_SCHEDULE


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""


def register(cli: typer.Typer) -> None:
    cli.command("doctor")(doctor)


def _broker(url: str) -> Check:
    from app.stack import broker_reachable

    if broker_reachable(url):
        return Check("broker", True, url)
    return Check(
        "broker",
        False,
        f"unreachable at {url}",
        "start redis-server, set TUNEHARNESS_BROKER_URL, or run `tuneharness up`",
    )


def _database() -> Check:
    from app import bootstrap
    from app.errors import TuneharnessError

    s = bootstrap.settings()
    try:
        bootstrap.engine(s)
    except TuneharnessError as exc:
        return Check("database", False, str(exc), "see the message above")
    except Exception as exc:
        return Check(
            "database",
            False,
            f"{type(exc).__name__}: {str(exc).splitlines()[0]}",
            "check TUNEHARNESS_DB_URL and that the server is running",
        )
    from sqlalchemy.engine import make_url

    return Check("database", True, make_url(s.db_url).render_as_string(hide_password=True))


def _sshd() -> Check:
    path = shutil.which("sshd") or ("/usr/sbin/sshd" if Path("/usr/sbin/sshd").exists() else None)
    if path:
        return Check("sshd", True, path)
    return Check(
        "sshd",
        False,
        "OpenSSH server not installed (needed for the simulated hosts and tests)",
        "apt-get install openssh-server",
    )


def _torch() -> Check:
    try:
        import torch
    except Exception as exc:
        return Check("torch", False, f"cannot import torch: {exc}", "pip install 'torch==2.13.0' (CPU wheel)")
    cuda = "CUDA available" if torch.cuda.is_available() else "no CUDA (control plane and CPU tests only)"
    return Check("torch", True, f"{torch.__version__}; {cuda}")


def _beat() -> Check:
    from app import bootstrap
    from app.liveness import last_successes, overdue

    intervals = {name: float(str(entry["schedule"])) for name, entry in BEAT_SCHEDULE.items()}
    last = last_successes(bootstrap.engine())
    stack = bootstrap.running_stack()
    if stack is not None:
        # A stack `up` started has had only its own lifetime to run them: a task is late three
        # intervals after the later of its last success and the stack's start, not before.
        last = {name: max(last.get(name, stack.started_at), stack.started_at) for name in intervals}
    late = overdue(last, intervals, now=time.time())
    if not late:
        return Check("beat", True, f"{len(intervals)} periodic tasks on time")
    names = ", ".join(f"{o.name} ({'never ran' if o.age_s is None else f'{o.age_s:.0f}s ago'})" for o in late)
    from app.alerts import Alert

    bootstrap.notifier(background=False).notify(
        Alert(
            "beat_overdue",
            f"periodic tasks overdue by more than three intervals: {names}",
            key=f"beat_overdue:{int(time.time() // 3600)}",
        )
    )
    return Check(
        "beat",
        False,
        f"overdue by more than three intervals: {names}",
        "start exactly one beat (`tuneharness up` does) and a worker on the maintenance queue",
    )


def _stack() -> Check:
    """The stack `tuneharness up` recorded for this home (every command uses its broker and sim)."""
    from app import bootstrap, stackstate

    home = bootstrap.settings().home
    recorded = stackstate.read(home)
    stack = bootstrap.running_stack()
    if stack is not None:
        sim = f", sim {stack.sim_url}" if stack.sim_url else ""
        since = time.strftime("%H:%M:%S", time.localtime(stack.started_at))
        return Check("stack", True, f"`up` pid {stack.pid} since {since}{sim}")
    if recorded is not None:
        return Check(
            "stack",
            False,
            f"{stackstate.state_path(home)} names `up` pid {recorded.pid}, which is gone",
            "run `tuneharness up` again (it replaces the file), or delete the file",
        )
    return Check("stack", True, "no `tuneharness up` for this home; settings come from the environment")


def _vendors() -> list[Check]:
    """One read-only call per vendor with a key set (like `sky check`); a vendor without one is skipped."""
    from app import bootstrap
    from app.vendorcheck import check

    out = []
    for name in bootstrap.MARKETS:
        v = check(name, bootstrap.market)
        detail = v.detail
        if name == "sim":  # which marketplace `--provider sim` reaches from this shell
            url = os.environ.get("TUNEHARNESS_SIM_URL")
            where = f"the shared marketplace at {url}" if url else "an in-process marketplace (no shared one runs)"
            detail = f"{where}; {v.detail}" if v.ok else v.detail
        out.append(Check(f"vendor {name}", v.ok, detail, v.fix))
    return out


def _fleet(db_is_sqlite: bool) -> Check:
    """The workers answering on the broker, and whether their database can be shared: SQLite is a
    file on one machine, so workers on two machines each write their own (PostgreSQL is the fleet's)."""
    from app import bootstrap

    try:
        hosts = bootstrap.worker_hosts()
    except Exception as exc:  # the broker refused the broadcast: the broker check says why
        return Check("workers", True, f"not asked ({type(exc).__name__})")
    if not hosts:
        return Check("workers", True, "none answered a ping in 2 s (start them: `tuneharness up`, or compose)")
    n = sum(len(v) for v in hosts.values())
    detail = f"{n} worker(s) on {len(hosts)} machine(s): {', '.join(sorted(hosts))}"
    if db_is_sqlite and len(hosts) > 1:
        return Check(
            "workers",
            False,
            detail + "; the database is SQLite, a file each machine sees alone",
            "point every worker's TUNEHARNESS_DB_URL at one PostgreSQL (docs/deploy.md)",
        )
    return Check("workers", True, detail)


def _artifacts() -> Check:
    """Whether this machine's artifact store is the one the fleet's workers share (PostgreSQL only)."""
    from app import bootstrap
    from app.errors import UserError

    try:
        detail = bootstrap.check_fleet_store(record=False)
    except UserError as exc:
        fix = "the same shared TUNEHARNESS_ARTIFACTS on every machine (docs/deploy.md)"
        return Check("artifacts", False, str(exc), fix)
    return Check("artifacts", True, detail or "SQLite: one machine, its own store")


def _blocked_jobs() -> Check:
    from app import bootstrap

    blocked = bootstrap.jobs().blocked()
    if not blocked:
        return Check("jobs", True, "no job is blocked")
    return Check(
        "jobs",
        False,
        f"{len(blocked)} blocked: " + "; ".join(f"{r.job_id}: {r.detail}" for r in blocked),
        "fix what each says, then `tuneharness resume JOB`",
    )


def doctor(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Check stack, broker, database, sshd, torch, vendors, beat, workers, artifacts, blocked jobs; exit 1 on a problem.

    A fleet whose workers answer from more than one machine needs PostgreSQL: SQLite is refused.
    """
    from app import bootstrap

    s = bootstrap.settings()
    checks = [_stack(), _broker(s.broker_url), _database(), _sshd(), _torch(), *_vendors()]
    if checks[1].ok and checks[2].ok:
        checks.append(_beat())
    if checks[1].ok:
        checks.append(_fleet(not s.is_postgres))
    if checks[2].ok:
        checks.append(_artifacts())
        checks.append(_blocked_jobs())
    if as_json:
        typer.echo(json.dumps([c.__dict__ for c in checks], indent=2))
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(title="tuneharness doctor")
        for col in ("check", "", "detail", "fix"):
            table.add_column(col, overflow="fold")
        for c in checks:
            table.add_row(c.name, "[green]ok[/]" if c.ok else "[red]FAIL[/]", c.detail, c.fix)
        Console().print(table)
    if not all(c.ok for c in checks):
        raise typer.Exit(1)
