"""The ledger stays append-only against a replica-role session and a role that may only INSERT and
SELECT it; an anchor written down elsewhere finds a rewritten history."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from app.db import init_db, ledger_role_grants, make_engine
from app.errors import UserError
from app.ledger import Event, Ledger, parse_anchor


def _fill(ledger: Ledger, n: int = 3) -> None:
    for i in range(n):
        ledger.append(Event(kind="instance_created", job="j1", instance=f"i{i}", reason="test"))


@pytest.fixture
def pg_engine(pg_url: str) -> Engine:
    eng = make_engine(pg_url)
    init_db(eng)
    return eng


@pytest.mark.postgres
def test_replica_session_cannot_bypass_the_triggers(pg_engine: Engine) -> None:
    """A superuser session with session_replication_role = replica is still refused an UPDATE."""
    ledger = Ledger(pg_engine)
    _fill(ledger)
    with pytest.raises(DBAPIError, match="append-only"), pg_engine.begin() as conn:
        conn.execute(text("SET LOCAL session_replication_role = replica"))
        conn.execute(text("UPDATE ledger_events SET reason = 'forged' WHERE seq = 2"))
    assert ledger.verify().ok


@pytest.mark.postgres
def test_init_db_upgrades_origin_only_triggers_to_always(pg_engine: Engine) -> None:
    """A database whose triggers were installed origin-only (as before) gets ALWAYS on the next init."""
    with pg_engine.begin() as conn:
        conn.execute(text("ALTER TABLE ledger_events ENABLE TRIGGER ledger_no_update"))
    init_db(pg_engine)
    with pg_engine.begin() as conn:
        modes = dict(
            conn.execute(
                text("SELECT tgname, tgenabled FROM pg_trigger WHERE tgrelid = 'ledger_events'::regclass")
            ).all()
        )
    assert modes == {"ledger_no_update": "A", "ledger_no_truncate": "A"}


@pytest.mark.postgres
def test_application_role_may_only_insert_and_select_the_ledger(pg_engine: Engine, pg_url: str) -> None:
    """Connected as the locked-down role: appends and reads work, UPDATE/DELETE/disabling triggers do not."""
    role = f"th_app_{uuid.uuid4().hex[:8]}"
    admin = pg_engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'pw'")
        for stmt in ledger_role_grants(role):
            conn.execute(stmt)
    try:
        app_engine = make_engine(pg_engine.url.set(username=role, password="pw").render_as_string(hide_password=False))
        init_db(app_engine)  # the application's own start-up: nothing to replace, nothing refused
        ledger = Ledger(app_engine)
        _fill(ledger)
        assert len(ledger.rows()) == 3
        for sql in (
            "UPDATE ledger_events SET reason = 'x'",
            "DELETE FROM ledger_events",
            "ALTER TABLE ledger_events DISABLE TRIGGER ALL",
            "SET session_replication_role = replica",
        ):
            with pytest.raises(DBAPIError), app_engine.begin() as c:
                c.execute(text(sql))
        assert ledger.verify().ok
        app_engine.dispose()
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE {role}")


def test_role_name_is_checked() -> None:
    """A role name that is not a plain identifier is refused before any SQL is built."""
    with pytest.raises(UserError, match="plain PostgreSQL role name"):
        ledger_role_grants('x"; DROP TABLE ledger_events; --')


def test_anchor_catches_a_rewritten_chain(sqlite_url: str) -> None:
    """A whole chain rewritten consistently verifies on its own, but not against the anchor taken before."""
    from app.ledger import _HASHED_FIELDS, GENESIS_HASH, row_hash

    eng = make_engine(sqlite_url)
    init_db(eng)
    ledger = Ledger(eng)
    _fill(ledger)
    before = ledger.verify()
    assert before.ok and before.anchor is not None and before.head_seq == 3
    anchor = parse_anchor(before.anchor)
    with eng.begin() as conn:
        for name in ("ledger_no_update", "ledger_no_delete", "ledger_no_replace"):
            conn.execute(text(f"DROP TRIGGER {name}"))
        prev = GENESIS_HASH
        for r in conn.execute(text("SELECT * FROM ledger_events ORDER BY seq")).mappings().all():
            fields = {**{k: r[k] for k in _HASHED_FIELDS}, "reason": "rewritten"}
            h = row_hash(prev, fields)
            conn.execute(
                text("UPDATE ledger_events SET reason='rewritten', prev_hash=:p, row_hash=:h WHERE seq=:s"),
                {"p": prev, "h": h, "s": r["seq"]},
            )
            prev = h
    assert ledger.verify().ok  # the chain alone cannot tell
    report = ledger.verify(anchor=anchor)
    assert not report.ok and report.first_bad_seq == 3 and "anchor" in (report.problem or "")
    truncated = ledger.verify(anchor=(99, anchor[1]))
    assert not truncated.ok and "missing" in (truncated.problem or "")


@pytest.mark.parametrize("bad", ["", "3", "x:abc", "3:" + "g" * 64, "3:" + "a" * 63])
def test_bad_anchor_is_a_user_error(bad: str) -> None:
    """An anchor not in SEQ:HASH form is refused with the fix."""
    with pytest.raises(UserError, match="SEQ:HASH"):
        parse_anchor(bad)


def test_cli_prints_the_anchor_and_checks_it(cli) -> None:  # type: ignore[no-untyped-def]
    """`ledger verify` prints SEQ:HASH; `--anchor` passes it back; a malformed anchor exits 2 in one line."""
    assert cli("ledger", "note", "first").returncode == 0
    out = cli("ledger", "verify")
    assert out.returncode == 0, out.stderr
    anchor = out.stdout.strip().splitlines()[-1].removeprefix("anchor: ")
    assert parse_anchor(anchor)[0] == 1
    assert cli("ledger", "note", "second").returncode == 0
    again = cli("ledger", "verify", "--anchor", anchor)
    assert again.returncode == 0 and "anchor matches" in again.stdout
    bad = cli("ledger", "verify", "--anchor", "nonsense")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1 and "SEQ:HASH" in bad.stderr
