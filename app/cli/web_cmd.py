"""`tuneharness web`: the read-only pages on this machine (app/web/server.py)."""

from __future__ import annotations

from typing import Annotated

import typer

__all__ = ["register", "web"]


def register(cli: typer.Typer) -> None:
    cli.command("web")(web)


def web(
    host: Annotated[str, typer.Option(help="the address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="the port to listen on")] = 0,
) -> None:
    """Serve the read-only pages: fleet, money, reliability and each job, refreshed live.

    Bound to 127.0.0.1 by default; another address needs TUNEHARNESS_FLOWER_USER and
    TUNEHARNESS_FLOWER_PASSWORD (the pages ask for Flower's credentials). Nothing is fetched from
    the internet: the stylesheet and the script ship in the package (docs/web.md).

    Exit codes: 0 stopped with Ctrl-C; 2 a bad option or an address refused.
    """
    from app import bootstrap
    from app.errors import UserError
    from app.web.server import DEFAULT_PORT, serve

    port = port or DEFAULT_PORT
    if not 1 <= port <= 65535:
        raise UserError(f"--port {port} is not a TCP port. Fix: pass a port from 1 to 65535")
    s = bootstrap.settings()
    try:
        serve(
            host,
            port,
            user=s.flower_user,
            password=s.flower_password,
            ready=lambda url: typer.echo(f"web pages on {url} (ctrl-c to stop)", err=True),
        )
    except KeyboardInterrupt:
        typer.echo("stopped", err=True)
