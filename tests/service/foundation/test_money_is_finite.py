"""NaN and infinity are never money: the budget refuses them, and so does the database itself."""

from __future__ import annotations

import math

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import IntegrityError

from app.budget import Budget
from app.db import MONEY_COLUMNS, init_db, make_engine
from app.errors import UserError
from app.ledger import Event, Ledger

BAD = [math.nan, math.inf, -math.inf, float("1e309")]

# A row per money table with the money column left to the test (the other columns are plain).
_ROWS = {
    "budget_caps": ("name, cap_usd, unit, period, updated_at", "'c', :v, 'usd', 'total', 'x'"),
    "budget_reservations": (
        "id, budget, amount_usd, state, idempotency_key, created_at, created_ts",
        "'r', 'c', :v, 'held', 'k', 'x', 0",
    ),
    "jobs": (
        "job_id, name, phase, spec_json, budget_usd, created_at, updated_at, detail",
        "'j', 'n', 'queued', '{}', :v, 0, 0, ''",
    ),
}


def _insert(engine: Engine, table: str, value: float) -> None:
    cols, vals = _ROWS[table]
    with engine.begin() as conn:
        conn.execute(text(f"INSERT INTO {table} ({cols}) VALUES ({vals})"), {"v": value})


@pytest.fixture
def engine(db_url: str) -> Engine:
    e = make_engine(db_url)
    init_db(e)
    return e


@pytest.mark.parametrize("value", BAD, ids=["nan", "inf", "-inf", "1e309"])
@pytest.mark.parametrize("table", sorted(_ROWS))
def test_the_database_refuses_a_non_finite_amount_inserted_directly(engine: Engine, table: str, value: float) -> None:
    """A direct INSERT of NaN or an infinity into a money column fails on SQLite and PostgreSQL
    (SQLite itself stores a NaN as NULL: in a column that may be NULL the row goes in without one)."""
    if engine.dialect.name == "sqlite" and math.isnan(value) and table == "jobs":
        _insert(engine, table, value)
        with engine.connect() as conn:
            assert conn.execute(text(f"SELECT budget_usd FROM {table}")).scalar() is None
        return
    with pytest.raises(IntegrityError):
        _insert(engine, table, value)


def test_a_finite_amount_still_goes_in(engine: Engine) -> None:
    """The CHECKs let ordinary amounts through."""
    for table in _ROWS:
        _insert(engine, table, 12.5)


@pytest.mark.parametrize("value", [*BAD, -1.0], ids=["nan", "inf", "-inf", "1e309", "negative"])
def test_a_cap_that_is_not_a_finite_amount_is_refused_and_nothing_is_written(engine: Engine, value: float) -> None:
    """set_cap refuses NaN, infinities and negatives with a UserError naming the cap; no row, no event."""
    budget = Budget(engine)
    with pytest.raises(UserError, match="budget day: the cap"):
        budget.set_cap("day", value)
    assert budget.caps() == [] and budget.ledger.rows() == []


@pytest.mark.parametrize("value", BAD, ids=["nan", "inf", "-inf", "1e309"])
def test_a_reservation_or_settlement_of_a_non_finite_amount_is_refused(engine: Engine, value: float) -> None:
    """reserve and settle refuse a non-finite amount before touching the database."""
    budget = Budget(engine)
    budget.set_cap("job-1", 10.0)
    with pytest.raises(ValueError, match="finite"):
        budget.reserve("job-1", value)
    res = budget.reserve("job-1", 1.0)
    with pytest.raises(ValueError, match="finite"):
        budget.settle(res.id, value, reason="test")
    assert [s.reserved_usd for s in budget.status()] == [1.0]


@pytest.mark.parametrize("field", ["amount_usd", "rate_usd_per_hour"])
def test_the_ledger_refuses_a_non_finite_amount(engine: Engine, field: str) -> None:
    """A ledger event with a NaN amount or rate is refused (SQLite would store the NaN as NULL)."""
    ledger = Ledger(engine)
    with pytest.raises(ValueError, match=field):
        ledger.append(Event(kind="test", **{field: math.nan}))
    assert ledger.rows() == []


def test_a_database_created_before_the_checks_gets_them_on_start(db_url: str) -> None:
    """init_db on tables made without the CHECKs adds an equivalent guard (PostgreSQL: the
    constraint; SQLite: triggers), and the rows already there stay."""
    engine = make_engine(db_url)
    with engine.begin() as conn:  # the old schema: no CHECK on the cap
        conn.execute(
            text(
                "CREATE TABLE budget_caps (name VARCHAR NOT NULL PRIMARY KEY, cap_usd FLOAT NOT NULL, "
                "unit VARCHAR NOT NULL, period VARCHAR NOT NULL, updated_at VARCHAR NOT NULL)"
            )
        )
    _insert(engine, "budget_caps", 3.0)
    init_db(engine)
    init_db(engine)  # idempotent
    with pytest.raises(IntegrityError, match="money"), engine.begin() as conn:
        conn.execute(text("UPDATE budget_caps SET cap_usd = :v"), {"v": math.inf})
    assert [s.cap_usd for s in Budget(engine).status()] == [3.0]


def test_every_money_column_is_guarded() -> None:
    """The catalogue of money columns names real columns of real tables."""
    engine = make_engine("sqlite:///:memory:")
    init_db(engine)
    from sqlmodel import SQLModel

    for table, column, _ in MONEY_COLUMNS:
        t = SQLModel.metadata.tables[table]
        assert column in t.c and any(f"money_finite_{table}_{column}" == c.name for c in t.constraints)
