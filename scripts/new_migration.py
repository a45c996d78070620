"""Write the next schema migration from the difference between the models and the newest revision.

Builds a throwaway SQLite database at the newest revision, lets Alembic compare it with the models
(every module in app.db.TABLE_MODULES) and writes app/migrations/versions/NNNN_<slug>.py with the
operations it found. Read the file before committing it: Alembic cannot tell a rename from a drop
and an add, sees no CHECK constraints or triggers, and a new NOT NULL column on a table with rows
needs a server_default (or a data step) to upgrade an existing home.

    python scripts/new_migration.py "add jobs.priority"
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("message", help="what the migration changes, in a few words")
    args = ap.parse_args()
    slug = re.sub(r"[^a-z0-9]+", "_", args.message.lower()).strip("_")[:48]
    if not slug:
        sys.exit('error: the message has no letters or digits. Fix: name the change, e.g. "add jobs.priority"')

    from alembic import command

    from app.db import init_db, make_engine
    from app.migrations import alembic_config, drift, head_revision

    head = head_revision()
    with tempfile.TemporaryDirectory() as tmp:
        engine = make_engine(f"sqlite:///{Path(tmp) / 'head.db'}")
        init_db(engine)
        with engine.begin() as conn:
            if not drift(conn):
                print(f"the models match revision {head}: nothing to write")
                return
            rev_id = f"{int(head) + 1:04d}" if head.isdigit() else None
            command.revision(alembic_config(conn), message=args.message, autogenerate=True, rev_id=rev_id)
        engine.dispose()
    print("now read it, run it: .venv/bin/pytest -q tests/service/foundation/test_migrations.py")


if __name__ == "__main__":
    main()
