"""The durable reputation store and the `tuneharness hosts` commands, on a fresh SQLite file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.db import init_db, make_engine
from app.errors import UserError
from app.ledger import Ledger
from app.policy.reputation import DEFAULT_QUARANTINE_S, is_quarantined
from app.reputation import ReputationStore

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def store(tmp_path: Path) -> ReputationStore:
    engine = make_engine(f"sqlite:///{tmp_path / 'th.db'}")
    init_db(engine)
    return ReputationStore(engine)


def test_events_accumulate_durably(store: ReputationStore) -> None:
    """Create, boot, preflight and slice events add up on one row per machine."""
    for event in ("create", "boot", "preflight_passed", "slice_finished"):
        store.record("vast", "m-1", event, now=10.0)
    view = store.get("vast", "m-1")
    assert view is not None
    r = view.record
    assert (r.creates, r.booted, r.preflight_passed, r.slices_finished, r.last_seen_at) == (1, 1, 1, 1, 10.0)
    assert store.get("vast", "m-2") is None


def test_failures_keep_reason_time_and_evidence(store: ReputationStore) -> None:
    """A failure is stored with its evidence and quarantines the machine for the window."""
    store.record("vast", "m-1", "failure", now=100.0, reason="boot_frozen", evidence="line unchanged 240s")
    view = store.get("vast", "m-1")
    assert view is not None and view.evidence == ("line unchanged 240s",)
    assert view.record.failures == (("boot_frozen", 100.0),)
    assert is_quarantined(view.record, now=100.0 + DEFAULT_QUARANTINE_S - 1)
    d = view.to_dict(now=200.0)
    assert d["quarantined"] is True and d["failures"] == [
        {"reason": "boot_frozen", "at": 100.0, "evidence": "line unchanged 240s"}
    ]


def test_records_for_ranking(store: ReputationStore) -> None:
    """The ranking gets records keyed by machine id, per provider."""
    store.record("vast", "m-1", "create", now=1.0)
    store.record("runpod", "p-1", "create", now=1.0)
    assert set(store.records()) == {"m-1", "p-1"}
    assert set(store.records("vast")) == {"m-1"}


def test_unquarantine_lifts_and_writes_the_ledger(store: ReputationStore, tmp_path: Path) -> None:
    """The operator lifts a permanent quarantine; the history stays; the ledger records it."""
    store.record("vast", "m-1", "failure", now=1.0, reason="vram_short", evidence="8 GB of 24")
    ledger = Ledger(store._engine)
    rec = store.unquarantine("m-1", ledger=ledger)
    assert not is_quarantined(rec, now=2.0) and rec.failures == (("vram_short", 1.0),)
    rows = [r for r in ledger.rows() if r.kind == "host_unquarantined"]
    assert len(rows) == 1 and rows[0].machine == "m-1"


def test_unquarantine_unknown_or_ambiguous_is_a_user_error(store: ReputationStore) -> None:
    """An unknown id, or one two providers share, says what to do."""
    with pytest.raises(UserError, match="tuneharness hosts"):
        store.unquarantine("nope")
    store.record("vast", "x", "create", now=1.0)
    store.record("runpod", "x", "create", now=1.0)
    with pytest.raises(UserError, match="--provider"):
        store.unquarantine("x")
    assert store.unquarantine("x", provider="runpod").provider == "runpod"


def cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TUNEHARNESS_HOME": str(home), "PYTHONPATH": str(ROOT)}
    env.pop("TUNEHARNESS_DB_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "app.cli.main", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_hosts_cli_lists_and_unquarantines(tmp_path: Path) -> None:
    """`hosts --json` works on a brand-new home; `hosts unquarantine` lifts a quarantine."""
    home = tmp_path / "home"
    out = cli(home, "hosts", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []
    engine = make_engine(f"sqlite:///{home / 'tuneharness.db'}")
    init_db(engine)
    ReputationStore(engine).record("sim", "m-7", "failure", now=1.0, reason="gpu_mismatch", evidence="RTX 3080")
    listed = json.loads(cli(home, "hosts", "--json").stdout)
    assert listed[0]["machine_id"] == "m-7" and listed[0]["quarantine"] == "permanent"
    assert cli(home, "hosts").returncode == 0
    out = cli(home, "hosts", "unquarantine", "m-7")
    assert out.returncode == 0 and "may be rented again" in out.stdout
    assert json.loads(cli(home, "hosts", "--json").stdout)[0]["quarantined"] is False
    bad = cli(home, "hosts", "unquarantine", "m-404")
    assert bad.returncode == 2 and "Fix:" in bad.stderr
