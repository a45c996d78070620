"""Reserve before spend: concurrent reservations never overshoot a budget, on either database."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import Engine

from app.budget import Budget
from app.db import init_db, make_engine
from app.errors import BudgetExceeded, UserError


@pytest.fixture
def engine(db_url: str) -> Engine:
    eng = make_engine(db_url)
    init_db(eng)
    return eng


def _race(budget: Budget, name: str, n: int) -> int:
    barrier = threading.Barrier(n)
    wins: list[str] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        barrier.wait()
        try:
            r = budget.reserve(name, 1.0, job=f"{name}-{i}")
            with lock:
                wins.append(r.id)
        except BudgetExceeded:
            pass
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    return len(wins)


@pytest.mark.slow
def test_twenty_concurrent_reservations_against_room_for_two(engine: Engine) -> None:
    """20 threads reserve $1 each against a $2.50 cap, 100 times: exactly 2 succeed every time."""
    budget = Budget(engine)
    for round_ in range(100):
        name = f"race-{round_}"
        budget.set_cap(name, 2.5)
        assert _race(budget, name, 20) == 2, f"round {round_}"
        status = {s.name: s for s in budget.status()}[name]
        assert status.reserved_usd == 2.0
    assert budget.ledger.verify().ok


def test_release_gives_room_back_and_settle_replaces_the_amount(engine: Engine) -> None:
    """Released reservations free their amount; settled ones count what was actually spent."""
    budget = Budget(engine)
    budget.set_cap("b", 2.0)
    a = budget.reserve("b", 1.5, job="j1")
    with pytest.raises(BudgetExceeded):
        budget.reserve("b", 1.0, job="j2")
    budget.release(a.id, reason="create never happened")
    c = budget.reserve("b", 1.0, job="j2")
    budget.settle(c.id, 0.25, reason="instance destroyed")
    budget.reserve("b", 1.75, job="j3")
    kinds = [r.kind for r in budget.ledger.rows()]
    assert kinds.count("budget_reserved") == 3 and "budget_refused" in kinds
    assert "budget_released" in kinds and "budget_settled" in kinds


def test_same_idempotency_key_reserves_once(engine: Engine) -> None:
    """A retried create that reserves with the same key does not reserve twice."""
    budget = Budget(engine)
    budget.set_cap("b", 1.0)
    a = budget.reserve("b", 1.0, job="j", idempotency_key="j:reserve:1")
    b = budget.reserve("b", 1.0, job="j", idempotency_key="j:reserve:1")
    assert a.id == b.id


def test_unknown_budget_is_a_user_error(engine: Engine) -> None:
    """Reserving against a budget that does not exist says how to create it."""
    with pytest.raises(UserError, match="budget set"):
        Budget(engine).reserve("nope", 1.0)


def test_several_caps_reserve_all_or_nothing(engine: Engine) -> None:
    """A create reserves against job, day and GPU-minute caps at once; one refusal reserves nothing."""
    budget = Budget(engine)
    budget.set_cap("job-1", 5.0)
    budget.set_cap("day", 3.0)
    budget.set_cap("gpu-minutes-day", 90)
    got = budget.reserve_many([("job-1", 2.0), ("day", 2.0), ("gpu-minutes-day", 60)], job="job-1")
    assert [r.budget for r in got] == ["job-1", "day", "gpu-minutes-day"]
    with pytest.raises(BudgetExceeded) as info:
        budget.reserve_many([("job-1", 2.0), ("day", 2.0), ("gpu-minutes-day", 20)], job="job-1")
    assert info.value.budget == "day"  # the refusal names the cap
    status = {s.name: s for s in budget.status()}
    assert status["job-1"].reserved_usd == 2.0  # the job cap's part was rolled back too
    assert status["gpu-minutes-day"].unit == "gpu_minutes" and status["day"].period == "day"


def test_period_caps_count_only_their_period(engine: Engine) -> None:
    """Yesterday's reservations do not count against today's cap."""
    from datetime import UTC, datetime, timedelta

    budget = Budget(engine)
    budget.set_cap("day", 1.0)
    yesterday = (datetime.now(UTC) - timedelta(days=1)).timestamp()
    budget.reserve("day", 1.0, now=yesterday)
    budget.reserve("day", 1.0)  # today: fits again
    with pytest.raises(BudgetExceeded):
        budget.reserve("day", 0.5)
