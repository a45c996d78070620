"""The budget monitor's pass and a job's own budget guard send a number of database statements that
does not grow with the number of live rentals or caps: per-rental or per-cap queries in a loop made
the pass outgrow its period near 1,000 jobs."""

from __future__ import annotations

from collections import Counter

from app.alerts import InMemoryNotifier
from app.rentals import Rentals
from app.services.guardrails import sweep_budgets
from providers.sim import VirtualClock
from tests.support.query_count import add_live_rentals, counting

from .conftest import host, make_market, rent


def _statements(rentals: Rentals, *, now: float, only_job: str | None = None) -> tuple[int, Counter[str]]:
    with counting(rentals.engine) as seen:
        report = sweep_budgets(rentals.budget, notifier=InMemoryNotifier(), rentals=rentals, now=now, only_job=only_job)
    assert not report.errors
    return sum(seen.values()), seen


def test_a_pass_costs_the_same_statements_for_20_and_200_live_rentals(tmp_path, clock: VirtualClock) -> None:  # type: ignore[no-untyped-def]
    """Given 20, then 200 live rentals each under a cap of its own, one budget-monitor pass sends the
    same number of statements, and no query twice."""
    from app.db import init_db, make_engine

    counts = []
    for live in (20, 200):
        engine = make_engine(f"sqlite:///{tmp_path / f'th-{live}.db'}")
        init_db(engine)
        rentals = Rentals(engine)
        add_live_rentals(rentals, live, now=clock.now())
        total, seen = _statements(rentals, now=clock.now() + 3600)
        repeated = {text: n for text, n in seen.items() if n > 1 and not text.startswith("BEGIN")}
        assert not repeated, repeated
        counts.append(total)
        engine.dispose()
    assert counts[0] == counts[1], counts


def test_a_job_guard_on_a_shared_cap_costs_the_same_for_2_and_40_other_rentals(
    rentals: Rentals, clock: VirtualClock
) -> None:
    """Given one job on a cap shared with 2, then 40 other jobs' rentals, the job's own guard sends the
    same number of statements (every rental under the cap still counted)."""
    market = make_market([host(0)], clock)
    rent(rentals, market, clock, "mine", machine="m-0")
    add_live_rentals(rentals, 2, now=clock.now(), cap="default", prefix="few")
    few, _ = _statements(rentals, now=clock.now() + 60, only_job="mine")
    add_live_rentals(rentals, 38, now=clock.now(), cap="default", prefix="many")
    many, _ = _statements(rentals, now=clock.now() + 60, only_job="mine")
    assert few == many, (few, many)
