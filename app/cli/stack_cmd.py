"""`tuneharness up`: the local stack, in the foreground, until Ctrl-C.

What it started (broker, shared simulated marketplace, Flower, the web pages, logs) is recorded in
TUNEHARNESS_HOME/run/stack.json while it runs, so a command in any other shell finds it
(`app.stackstate`).
"""

from __future__ import annotations

import math
from typing import Annotated

import typer


def register(cli: typer.Typer) -> None:
    cli.command("up")(up)


def up(
    no_flower: Annotated[bool, typer.Option("--no-flower", help="Do not start Flower.")] = False,
    no_web: Annotated[bool, typer.Option("--no-web", help="Do not serve the web pages.")] = False,
    concurrency: Annotated[int, typer.Option(help="Worker processes.")] = 2,
    sim: Annotated[
        str | None,
        typer.Option(
            "--sim",
            help="also serve a shared simulated marketplace on this trace (a file or a shipped trace's name, "
            "e.g. smoke); every shell's `--provider sim` then uses it",
        ),
    ] = None,
    sim_scale: Annotated[
        float, typer.Option("--sim-scale", help="with --sim: simulated seconds per wall second")
    ] = 1.0,
) -> None:
    """Start a local stack (redis if none is reachable, a worker, one beat, Flower, the web pages); Ctrl-C stops all."""
    import os
    import signal
    import threading
    import time

    from app import bootstrap, stackstate
    from app.errors import UserError
    from app.stack import Stack

    if not 1 <= concurrency <= 64:
        raise UserError(f"--concurrency {concurrency} is not in 1..64. Fix: e.g. --concurrency 2")
    if not (math.isfinite(sim_scale) and sim_scale > 0):
        raise UserError(f"--sim-scale {sim_scale!r} is not a positive number. Fix: e.g. --sim-scale 10")
    settings = bootstrap.settings()
    running = stackstate.read(settings.home)
    if running is not None and running.alive():
        raise UserError(
            f"a stack already runs for {settings.home} (pid {running.pid}, broker {running.broker_url}). "
            "Fix: use it (every command finds it), or stop it with Ctrl-C in its shell first"
        )
    bootstrap.check_worker_config()
    bootstrap.engine(settings)  # create the database before the children race to
    stack = Stack(
        settings,
        run_dir=settings.home / "run",
        flower=not no_flower,
        web=not no_web,
        worker_concurrency=concurrency,
        sim_trace=sim,
        sim_scale=sim_scale,
    )
    stopping = threading.Event()

    def _on_signal(signum: int, _frame: object) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    with stack:
        recorded = stackstate.write(settings.home, stack.state(started_at=time.time()))
        try:
            typer.echo(f"broker   {stack.broker_url}")
            typer.echo(f"database {settings.db_url}")
            if stack.sim_url:
                typer.echo(f"sim      {stack.sim_url} (shared simulated marketplace)")
            if not no_flower:
                auth = "basic auth" if settings.flower_user else "no auth (set TUNEHARNESS_FLOWER_USER/_PASSWORD)"
                typer.echo(f"flower   http://{settings.flower_address}:{settings.flower_port} ({auth})")
            if stack.web_url:
                typer.echo(f"web      {stack.web_url} (read-only pages; `tuneharness report --html F` for a file)")
            typer.echo(f"logs     {stack.run_dir}")
            typer.echo(f"state    {recorded} (other shells find this stack there)")
            typer.echo("running; Ctrl-C stops everything")
            while not stopping.wait(1.0):
                for line in stack.check_alive():
                    typer.echo(line)
            typer.echo("stopping...")
        finally:
            stackstate.remove(settings.home, pid=os.getpid())
    typer.echo("stopped")
