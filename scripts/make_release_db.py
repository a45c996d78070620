"""Write the database of a past release as SQL fixtures, for the upgrade tests.

Runs the release's own code (extracted read-only with `git archive REV`, never checked out) against a
new SQLite file and a new PostgreSQL database, fills in a few rows (budget caps, a reservation and its
settlement, ledger events, a job), and dumps each as plain SQL:

    tests/fixtures/db/release-REV.sqlite.sql     (sqlite3's .dump)
    tests/fixtures/db/release-REV.postgres.sql   (pg_dump --inserts, no owners or grants)

    python scripts/make_release_db.py --rev 8382a93
    python scripts/make_release_db.py --rev 8382a93 --no-postgres

tests/service/foundation/test_migrations.py loads them and upgrades each with today's code.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import subprocess
import sys
import tarfile
import tempfile
import uuid
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "fixtures" / "db"
PG_ADMIN_URL = os.environ.get("TUNEHARNESS_TEST_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
PACKAGES = ("app", "workers", "providers", "gate", "trainer", "beat_schedule.py")

# Runs inside the release's code: its init_db, its ledger and budget, one raw job row.
FILL = """
import sys
from datetime import datetime, timezone
from sqlalchemy import text
from app.budget import Budget
from app.db import init_db, make_engine
from app.ledger import Event, Ledger

engine = make_engine(sys.argv[1])
init_db(engine)
ledger = Ledger(engine)
at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
ledger.append(Event(kind="operator_note", reason="fixture: before the upgrade", at=at))
ledger.append(Event(kind="instance_created", job="job-fixture", instance="i-1", provider="sim", machine="m-1",
                    rate_usd_per_hour=0.42, reason="fixture rental", payload={"offer": "o-1"}, at=at))
ledger.append(Event(kind="instance_destroyed", job="job-fixture", instance="i-1", provider="sim",
                    amount_usd=0.21, reason="fixture teardown", at=at))
budget = Budget(engine, ledger)
budget.set_cap("fixture-total", 25.0)
held = budget.reserve("fixture-total", 2.5)
budget.settle(held.id, 1.75, reason="fixture settlement")
with engine.begin() as conn:
    conn.execute(text(
        "INSERT INTO jobs (job_id, name, phase, spec_json, budget_usd, created_at, updated_at, detail) "
        "VALUES ('job-fixture', 'fixture', 'done', '{}', 5.0, 1767323045.0, 1767323045.0, 'fixture job')"
    ))
assert ledger.verify().ok
engine.dispose()
"""


def extract(rev: str, into: Path) -> None:
    """The release's packages, read from git without touching the working tree or the index."""
    archive = subprocess.run(["git", "archive", "--format=tar", rev, *PACKAGES], cwd=ROOT, capture_output=True)
    if archive.returncode != 0:
        sys.exit(f"error: git archive {rev} failed: {archive.stderr.decode().strip()}. Fix: name a commit of this repo")
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")


def fill(code: Path, url: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(code), "HF_HUB_OFFLINE": "1"}
    subprocess.run([sys.executable, "-c", FILL, url], cwd=code, env=env, check=True)


def sqlite_fixture(code: Path, work: Path, out: Path) -> None:
    db = work / "release.db"
    fill(code, f"sqlite:///{db}")
    conn = sqlite3.connect(db)
    try:
        out.write_text("\n".join(conn.iterdump()) + "\n", encoding="utf-8")
    finally:
        conn.close()


def postgres_fixture(code: Path, out: Path) -> None:
    import psycopg

    name = f"th_release_{uuid.uuid4().hex[:10]}"
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        fill(code, f"{base}/{name}".replace("postgresql://", "postgresql+psycopg://", 1))
        dump = subprocess.run(
            ["pg_dump", "--inserts", "--no-owner", "--no-privileges", "--no-comments", f"{base}/{name}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    # psql's own commands (\restrict) are not SQL: the tests load the file through a driver.
    sql = [line for line in dump.splitlines() if not line.startswith("\\")]
    out.write_text("\n".join(sql) + "\n", encoding="utf-8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", default="8382a93", help="the release's commit")
    ap.add_argument("--no-postgres", action="store_true", help="write the SQLite fixture only")
    args = ap.parse_args()
    if not args.no_postgres and shutil.which("pg_dump") is None:
        sys.exit("error: pg_dump not found. Fix: apt-get install postgresql-client, or pass --no-postgres")
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        code, work = Path(tmp) / "code", Path(tmp) / "work"
        code.mkdir()
        work.mkdir()
        extract(args.rev, code)
        sqlite_fixture(code, work, OUT / f"release-{args.rev}.sqlite.sql")
        print(f"wrote {OUT / f'release-{args.rev}.sqlite.sql'}")
        if not args.no_postgres:
            postgres_fixture(code, OUT / f"release-{args.rev}.postgres.sql")
            print(f"wrote {OUT / f'release-{args.rev}.postgres.sql'}")


if __name__ == "__main__":
    main()
