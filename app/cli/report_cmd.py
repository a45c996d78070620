"""`tuneharness report --html FILE`: the web pages as one self-contained file to mail or archive."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

__all__ = ["register", "report"]


def register(cli: typer.Typer) -> None:
    cli.command("report")(report)


def report(
    html: Annotated[
        Path, typer.Option("--html", help="write the report to this file (inline style and plots, no script)")
    ],
) -> None:
    """Fleet, money, reliability and every job in one HTML file that references nothing outside it."""
    import os
    import tempfile

    from app.errors import UserError
    from app.web.data import default_source
    from app.web.report import build_report

    text = build_report(default_source())
    target = html.expanduser()
    if not target.parent.is_dir():
        raise UserError(f"{target.parent} is not a directory. Fix: create it or pass another --html path")
    fd, tmp = tempfile.mkstemp(prefix=".report-", suffix=".html", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    typer.echo(f"wrote {target} ({len(text.encode('utf-8')) // 1024} KiB)")
