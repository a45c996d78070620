"""`tuneharness doctor`: check what the fleet needs and say how to fix what is missing."""

from __future__ import annotations

import json
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
    late = overdue(last_successes(bootstrap.engine()), intervals, now=time.time())
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


def doctor(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Check broker, database, sshd, torch and beat liveness; exit 1 if something needs fixing."""
    from app import bootstrap

    s = bootstrap.settings()
    checks = [_broker(s.broker_url), _database(), _sshd(), _torch()]
    if checks[0].ok and checks[1].ok:
        checks.append(_beat())
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
