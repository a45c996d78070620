"""The ledger is append-only in the database itself and its hash chain exposes any edit."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from app.db import init_db, is_postgres, make_engine
from app.ledger import GENESIS_HASH, Event, Ledger


@pytest.fixture
def engine(db_url: str) -> Engine:
    eng = make_engine(db_url)
    init_db(eng)
    return eng


def _fill(ledger: Ledger, n: int = 5) -> None:
    for i in range(n):
        ledger.append(
            Event(
                kind="instance_created",
                job="j1",
                instance=f"i{i}",
                provider="sim",
                machine=f"m{i}",
                rate_usd_per_hour=0.11 * (i + 1),
                amount_usd=None,
                reason="test",
                payload={"i": i, "nested": {"a": [1, 2]}},
            )
        )


def test_rows_chain_from_genesis(engine: Engine) -> None:
    """Each row links to the previous row's hash, starting from the genesis hash."""
    ledger = Ledger(engine)
    _fill(ledger, 3)
    rows = ledger.rows()
    assert [r.seq for r in rows] == [1, 2, 3]
    assert rows[0].prev_hash == GENESIS_HASH
    assert rows[1].prev_hash == rows[0].row_hash and rows[2].prev_hash == rows[1].row_hash
    assert rows[2].payload == {"i": 2, "nested": {"a": [1, 2]}}
    assert ledger.verify().ok


def test_same_idempotency_key_appends_once(engine: Engine) -> None:
    """A retried task that appends with the same key gets the first row back."""
    ledger = Ledger(engine)
    a = ledger.append(Event(kind="created", job="j", idempotency_key="j:create:1"))
    b = ledger.append(Event(kind="created", job="j", reason="retry", idempotency_key="j:create:1"))
    assert a.seq == b.seq and b.reason == ""
    assert len(ledger.rows()) == 1


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE ledger_events SET amount_usd = 0 WHERE seq = 2",
        "DELETE FROM ledger_events WHERE seq = 2",
        "DELETE FROM ledger_events",
    ],
)
def test_database_rejects_update_and_delete(engine: Engine, sql: str) -> None:
    """UPDATE and DELETE are refused by triggers, whoever sends them."""
    ledger = Ledger(engine)
    _fill(ledger)
    with pytest.raises(DBAPIError, match="append-only"), engine.begin() as conn:
        conn.execute(text(sql))
    assert len(ledger.rows()) == 5 and ledger.verify().ok


def test_database_rejects_replace_and_upsert(engine: Engine) -> None:
    """INSERT OR REPLACE (SQLite), upserts over an existing row and TRUNCATE (PostgreSQL) fail."""
    ledger = Ledger(engine)
    _fill(ledger)
    if is_postgres(engine):
        statements = [
            """INSERT INTO ledger_events SELECT * FROM ledger_events WHERE seq = 1
               ON CONFLICT (seq) DO UPDATE SET reason = 'rewritten'""",
            "TRUNCATE ledger_events",
        ]
    else:
        statements = [
            "INSERT OR REPLACE INTO ledger_events SELECT * FROM ledger_events WHERE seq = 1",
            "REPLACE INTO ledger_events SELECT * FROM ledger_events WHERE seq = 1",
            """INSERT INTO ledger_events SELECT * FROM ledger_events WHERE seq = 1
               ON CONFLICT (seq) DO UPDATE SET reason = 'rewritten'""",
        ]
    for sql in statements:
        with pytest.raises(DBAPIError, match="append-only"), engine.begin() as conn:
            conn.execute(text(sql))
    assert [r.reason for r in ledger.rows()] == ["test"] * 5
    assert ledger.verify().ok


def _drop_triggers(engine: Engine) -> None:
    with engine.begin() as conn:
        if is_postgres(engine):
            conn.execute(text("DROP TRIGGER ledger_no_update ON ledger_events"))
        else:
            conn.execute(text("DROP TRIGGER ledger_no_update"))
            conn.execute(text("DROP TRIGGER ledger_no_delete"))


def test_verify_names_the_first_altered_row(engine: Engine) -> None:
    """An edit made with the triggers dropped is caught, and its seq named."""
    ledger = Ledger(engine)
    _fill(ledger)
    _drop_triggers(engine)
    with engine.begin() as conn:
        conn.execute(text("UPDATE ledger_events SET amount_usd = 0.01 WHERE seq = 3"))
    report = ledger.verify()
    assert not report.ok and report.first_bad_seq == 3 and "altered" in (report.problem or "")


def test_verify_catches_a_removed_row(engine: Engine) -> None:
    """Removing a row from the middle breaks the link of the row after it."""
    ledger = Ledger(engine)
    _fill(ledger)
    _drop_triggers(engine)
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM ledger_events WHERE seq = 2"))
    report = ledger.verify()
    assert not report.ok and report.first_bad_seq == 3


def test_verify_catches_a_rehashed_row(engine: Engine) -> None:
    """Recomputing one row's hash after editing it still breaks the next row's link."""
    from app.ledger import row_hash

    ledger = Ledger(engine)
    _fill(ledger)
    _drop_triggers(engine)
    r2 = ledger.rows()[1]
    fields = {**r2.as_dict(), "reason": "forged"}
    fields["payload"] = '{"i":1,"nested":{"a":[1,2]}}'
    forged = row_hash(r2.prev_hash, fields)
    with engine.begin() as conn:
        conn.execute(text("UPDATE ledger_events SET reason='forged', row_hash=:h WHERE seq=2"), {"h": forged})
    report = ledger.verify()
    assert not report.ok and report.first_bad_seq == 3


def test_filters_by_job_and_kind(engine: Engine) -> None:
    """rows() filters by job and by kind."""
    ledger = Ledger(engine)
    ledger.append(Event(kind="a", job="j1"))
    ledger.append(Event(kind="b", job="j2"))
    ledger.append(Event(kind="b", job="j1"))
    assert [r.kind for r in ledger.rows(job="j1")] == ["a", "b"]
    assert [r.job for r in ledger.rows(kind="b")] == ["j2", "j1"]
