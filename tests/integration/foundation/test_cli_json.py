"""Every command that reads offers --json; `ledger verify --json` keeps its exit codes."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import typer

from app.cli.main import cli as tuneharness

# Commands that act, serve or write a file: their output is not a record to read back.
NOT_READS = {
    "stop",
    "destroy",
    "up",
    "extend",
    "metrics",  # Prometheus's own text format is its machine-readable form
    "report",
    "web",
    "ledger note",
    "ledger lock-down",
    "budget set",
    "sim serve",
    "triage train-specialist",
    "hosts unquarantine",
    "triage",  # --jsonl: JSON lines in, JSON lines out
    "research start",  # enqueues a run and prints its id
    "research stop",
}


def _commands(c: Any, path: list[str]) -> list[tuple[str, Any]]:
    subs = getattr(c, "commands", None)
    if not subs:
        return [(" ".join(path), c)]
    out = [(" ".join(path), c)] if getattr(c, "invoke_without_command", False) else []
    for name, sub in subs.items():
        out += _commands(sub, [*path, name])
    return out


def test_every_read_command_has_json() -> None:
    found = _commands(typer.main.get_command(tuneharness), [])
    missing = [
        name
        for name, c in found
        if name not in NOT_READS and "--json" not in {o for p in c.params for o in getattr(p, "opts", [])}
    ]
    assert not missing, f"read commands without --json: {missing}"
    assert {name for name, _ in found} >= NOT_READS, "the exemptions name commands that exist"


def test_ledger_verify_json_intact_then_corrupt(cli, th_home: Path) -> None:  # type: ignore[no-untyped-def]
    assert cli("ledger", "note", "first").returncode == 0
    out = cli("ledger", "verify", "--json")
    doc = json.loads(out.stdout)
    assert out.returncode == 0 and doc["ok"] and doc["rows"] == 1 and doc["anchor"].startswith("1:")
    db = sqlite3.connect(th_home / "tuneharness.db")
    db.execute("DROP TRIGGER ledger_no_update")
    db.execute("UPDATE ledger_events SET reason = 'rewritten' WHERE seq = 1")
    db.commit()
    db.close()
    out = cli("ledger", "verify", "--json")
    doc = json.loads(out.stdout)
    assert out.returncode == 1 and not doc["ok"] and doc["first_bad_seq"] == 1 and doc["problem"]
