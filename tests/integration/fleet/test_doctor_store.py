"""`tuneharness doctor` says whether this machine's artifact store is the one the fleet's workers share."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from app.artifacts import LocalArtifactStore
from app.db import init_db, make_engine
from app.fleetstore import check_fleet_store

REPO = Path(__file__).resolve().parents[3]


def _artifacts_check(env: dict[str, str]) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-m", "app.cli.main", "doctor", "--json"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    checks = {c["name"]: c for c in json.loads(out.stdout)}
    return dict(checks["artifacts"])


@pytest.mark.slow
@pytest.mark.postgres
def test_doctor_fails_on_a_store_of_its_own_and_passes_on_the_fleets(
    th_env: dict[str, str], pg_url: str, tmp_path: Path
) -> None:
    """With the fleet's store recorded, doctor on another store fails naming the fleet's; on it, passes."""
    shared, mine = tmp_path / "shared", tmp_path / "mine"
    engine = make_engine(pg_url)
    init_db(engine)
    check_fleet_store(engine, LocalArtifactStore(shared), str(shared), record=True)
    engine.dispose()
    env = {**th_env, "TUNEHARNESS_DB_URL": pg_url}
    other = _artifacts_check({**env, "TUNEHARNESS_ARTIFACTS": str(mine)})
    assert other["ok"] is False and str(shared) in str(other["detail"]) and "TUNEHARNESS_ARTIFACTS" in str(other["fix"])
    assert not mine.exists()  # doctor records nothing
    same = _artifacts_check({**env, "TUNEHARNESS_ARTIFACTS": str(shared)})
    assert same["ok"] is True and "shared store" in str(same["detail"])


@pytest.mark.slow
def test_doctor_on_sqlite_has_nothing_to_share(th_env: dict[str, str]) -> None:
    """On SQLite, the one-machine default, the machine's own store is the store."""
    check = _artifacts_check(th_env)
    assert check["ok"] is True and "SQLite" in str(check["detail"])
