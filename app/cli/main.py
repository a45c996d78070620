"""Entry point of the `tuneharness` console script.

Sub-commands live in sibling modules, each exposing a `typer.Typer` named `app` (or plain
commands registered with `register(cli)`). A `UserError` anywhere becomes one line on stderr and
exit code 2: a person's mistake never prints a traceback.
"""

from __future__ import annotations

import sys

import typer

from app.cli import (
    budget_cmd,
    db_cmd,
    doctor_cmd,
    gate_cmd,
    hosts_cmd,
    jobs_cmd,
    ledger_cmd,
    lifecycle_cmd,
    market_cmd,
    metrics_cmd,
    plan_cmd,
    receipt_cmd,
    report_cmd,
    research_cmd,
    schema_cmd,
    sim_cmd,
    stack_cmd,
    status_cmd,
    triage_cmd,
    web_cmd,
)
from app.cli.helpstyle import install as _plain_help_types
from app.errors import UserError

_plain_help_types()

cli = typer.Typer(
    name="tuneharness",
    help="Dependable fine-tuning on cheap, hostile GPU marketplaces.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,  # --install-completion / --show-completion for bash, zsh, fish, PowerShell
    rich_markup_mode="markdown",  # one paragraph of a docstring reads as one paragraph in --help
)


def _version() -> str:
    """The installed distribution's version (a source checkout that was never installed says so)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tuneharness")
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"tuneharness {_version()}")
        raise typer.Exit()


@cli.callback()
def _main(
    version: bool = typer.Option(
        False, "--version", help="Print the version and exit.", callback=_print_version, is_eager=True
    ),
) -> None:
    """Dependable fine-tuning on cheap, hostile GPU marketplaces."""


cli.add_typer(ledger_cmd.app, name="ledger")
cli.add_typer(budget_cmd.app, name="budget")
cli.add_typer(db_cmd.app, name="db")
cli.add_typer(market_cmd.app, name="market")
cli.add_typer(gate_cmd.app, name="gate")
cli.add_typer(sim_cmd.app, name="sim")
cli.add_typer(triage_cmd.app, name="triage")
cli.add_typer(hosts_cmd.app, name="hosts")
cli.add_typer(research_cmd.app, name="research")
cli.add_typer(schema_cmd.app, name="schema")
stack_cmd.register(cli)
doctor_cmd.register(cli)
jobs_cmd.register(cli)
lifecycle_cmd.register(cli)
receipt_cmd.register(cli)
metrics_cmd.register(cli)
status_cmd.register(cli)
report_cmd.register(cli)
web_cmd.register(cli)
plan_cmd.register(cli)
# stop and destroy last: the everyday verbs come first in --help
market_cmd.register(cli)


def run() -> None:
    """Console-script entry: run the CLI, turning user errors into one clear line."""
    try:
        from app import bootstrap

        bootstrap.configured()  # the config file's profile and the vendors' key files, before any command
        cli()
    except UserError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    run()
