"""`tuneharness up`: the local stack, in the foreground, until Ctrl-C."""

from __future__ import annotations

from typing import Annotated

import typer


def register(cli: typer.Typer) -> None:
    cli.command("up")(up)


def up(
    no_flower: Annotated[bool, typer.Option("--no-flower", help="Do not start Flower.")] = False,
    concurrency: Annotated[int, typer.Option(help="Worker processes.")] = 2,
) -> None:
    """Start a local stack (redis if none is reachable, a worker, one beat, Flower); Ctrl-C stops all."""
    import signal
    import threading

    from app import bootstrap
    from app.stack import Stack

    settings = bootstrap.settings()
    bootstrap.check_worker_config()
    bootstrap.engine(settings)  # create the database before the children race to
    stack = Stack(settings, run_dir=settings.home / "run", flower=not no_flower, worker_concurrency=concurrency)
    stopping = threading.Event()

    def _on_signal(signum: int, _frame: object) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    with stack:
        typer.echo(f"broker   {stack.broker_url}")
        typer.echo(f"database {settings.db_url}")
        if not no_flower:
            auth = "basic auth" if settings.flower_user else "no auth (set TUNEHARNESS_FLOWER_USER/_PASSWORD)"
            typer.echo(f"flower   http://{settings.flower_address}:{settings.flower_port} ({auth})")
        typer.echo(f"logs     {stack.run_dir}")
        typer.echo("running; Ctrl-C stops everything")
        while not stopping.wait(1.0):
            stack.check_alive()
        typer.echo("stopping...")
    typer.echo("stopped")
