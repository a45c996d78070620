"""The CLI as a user meets it: clear one-line errors, ledger commands, exit codes."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from subprocess import CompletedProcess

Cli = Callable[..., CompletedProcess[str]]


def test_help_lists_the_command_groups(cli: Cli) -> None:
    """`tuneharness --help` works with nothing running."""
    out = cli("--help")
    assert out.returncode == 0
    for word in ("ledger", "budget", "up", "doctor"):
        assert word in out.stdout


def test_bad_setting_is_one_line_exit_2_no_traceback(cli: Cli, th_env: dict[str, str]) -> None:
    """An invalid database URL names the variable and the fix, exits 2, prints no traceback."""
    out = cli("ledger", "show", env={**th_env, "TUNEHARNESS_DB_URL": "mysql://root@localhost/x"})
    assert out.returncode == 2
    assert "TUNEHARNESS_DB_URL" in out.stderr and "Fix:" in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_unreachable_postgres_is_one_line_exit_2(cli: Cli, th_env: dict[str, str]) -> None:
    """A database server that is not there is reported in one line with exit code 2."""
    env = {**th_env, "TUNEHARNESS_DB_URL": "postgresql://nobody@127.0.0.1:1/none"}
    out = cli("ledger", "show", env=env)
    assert out.returncode == 2, out.stderr
    assert "database unreachable" in out.stderr and "Traceback" not in out.stderr


def test_note_show_and_verify_on_a_brand_new_home(cli: Cli) -> None:
    """A note lands in a ledger created on demand; show lists it; verify passes."""
    assert cli("ledger", "note", "destroyed i-7 by hand in the vendor console", "--instance", "i-7").returncode == 0
    rows = json.loads(cli("ledger", "show", "--json").stdout)
    assert rows[0]["kind"] == "operator_note" and rows[0]["instance"] == "i-7"
    out = cli("ledger", "verify")
    assert out.returncode == 0 and "1 events" in out.stdout


def test_verify_exits_1_naming_the_first_bad_seq(cli: Cli, th_home: Path) -> None:
    """An edit made behind the triggers' back makes verify exit 1 and name the seq."""
    for i in range(4):
        assert cli("ledger", "note", f"note {i}").returncode == 0
    db = sqlite3.connect(th_home / "tuneharness.db")
    db.execute("DROP TRIGGER ledger_no_update")
    db.execute("UPDATE ledger_events SET reason = 'nothing happened' WHERE seq = 2")
    db.commit()
    db.close()
    out = cli("ledger", "verify")
    assert out.returncode == 1
    assert "seq 2" in out.stderr


def test_budget_set_show_and_empty_note_refused(cli: Cli) -> None:
    """Caps are set explicitly and shown; an empty note is a user error."""
    assert cli("budget", "set", "default", "--cap-usd", "25").returncode == 0
    shown = json.loads(cli("budget", "show", "--json").stdout)
    assert shown == [
        {
            "name": "default",
            "cap_usd": 25.0,
            "reserved_usd": 0.0,
            "spent_usd": 0.0,
            "left_usd": 25.0,
            "unit": "usd",
            "period": "total",
        }
    ]
    assert cli("budget", "set", "gpu-minutes-day", "--cap-gpu-minutes", "120").returncode == 0
    assert cli("budget", "set", "day").returncode == 2
    out = cli("ledger", "note", "  ")
    assert out.returncode == 2 and "empty note" in out.stderr
    out = cli("budget", "set", "default", "--cap-usd", "-1")
    assert out.returncode == 2 and "Traceback" not in out.stderr
