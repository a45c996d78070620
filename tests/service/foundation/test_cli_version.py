"""`tuneharness --version` prints the installed version and exits 0, before any sub-command runs."""

from __future__ import annotations

from importlib.metadata import version

from typer.testing import CliRunner

from app.cli.main import cli


def test_version_prints_the_distribution_version() -> None:
    """One line, `tuneharness <version>` as installed, exit 0."""
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0
    assert result.output == f"tuneharness {version('tuneharness')}\n"
