"""`tuneharness metrics [--serve]`: the money and health figures for Prometheus (app/metrics.py)."""

from __future__ import annotations

import threading
from typing import Annotated

import typer

from app.errors import UserError

__all__ = ["metrics", "register"]


def register(cli: typer.Typer) -> None:
    cli.command("metrics")(metrics)


def _intervals() -> dict[str, float]:
    from beat_schedule import BEAT_SCHEDULE

    return {name: float(str(entry["schedule"])) for name, entry in BEAT_SCHEDULE.items()}


def metrics(
    serve: Annotated[bool, typer.Option("--serve", help="answer Prometheus scrapes until interrupted")] = False,
    host: Annotated[str, typer.Option(help="the address to listen on with --serve")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="the port to listen on with --serve")] = 0,
    allow_remote: Annotated[
        bool,
        typer.Option(
            "--allow-remote",
            help="listen on an address other machines reach (a private network such as docker compose's)",
        ),
    ] = False,
) -> None:
    """Print the fleet's money and health metrics once (Prometheus text format), or serve them.

    Every figure is read from the database at each scrape: spend rate, spend by cause, each budget
    cap with what is reserved and spent, rentals and jobs by state, dead hosts, stops by reason,
    recoveries and their median/p90, beat tasks' liveness, triage states (docs/deploy.md: Metrics).

    Exit codes: 0 ok; 2 a bad option or an address refused.
    """
    from app import bootstrap
    from app.metrics import DEFAULT_PORT, FleetCollector, exposition

    collector = FleetCollector(bootstrap.engine, intervals_s=_intervals())
    if not serve:
        typer.echo(exposition(collector), nl=False)
        return
    port = port or DEFAULT_PORT
    if not 1 <= port <= 65535:
        raise UserError(f"--port {port} is not a TCP port. Fix: pass a port from 1 to 65535")
    from app.stack import is_loopback

    if not is_loopback(host) and not allow_remote:
        raise UserError(
            f"metrics would listen on {host}, which other machines may reach, and they show the fleet's spend. "
            "Fix: keep --host 127.0.0.1 (Prometheus on this machine or an SSH tunnel), or pass --allow-remote "
            "on a private network"
        )
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)  # type: ignore[arg-type]
    try:
        start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise UserError(f"cannot listen on {host}:{port} ({exc.strerror}). Fix: pass another --port") from None
    typer.echo(f"metrics on http://{host}:{port}/metrics (ctrl-c to stop)", err=True)
    stop = threading.Event()
    try:
        while not stop.wait(3600):
            pass
    except KeyboardInterrupt:
        typer.echo("stopped", err=True)
