"""The nemesis (tests/support/nemesis.py): a seeded run of many jobs with process, broker and vendor
faults interleaved, every invariant checked after every step; and proof that each checker catches
the violation it is there for, so the run cannot pass by checking nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from app.market import LaunchSpec, OfferQuery
from support.faultlab import record, rounds
from support.nemesis import InvariantViolation, Nemesis, NemesisConfig, scratch_dir

pytestmark = [pytest.mark.faults, pytest.mark.slow]


@pytest.fixture
def root() -> Iterator[Path]:
    with scratch_dir() as d:
        yield d


def test_a_seeded_nemesis_run_breaks_no_invariant(root: Path) -> None:
    """Jobs run to an end through kills at every create step, lost and doubled messages, a broker
    restart, paused and doubled beats and vendor faults; no check after any step finds a violation,
    no (job, attempt) is created twice, and every job ends."""
    jobs = rounds(ci=25, full=100)
    result = Nemesis(NemesisConfig(seed=7, jobs=jobs), root).run()
    assert result.violations == 0 and result.duplicates == 0
    assert result.checks >= result.steps > 0
    assert result.completed + result.failed + result.cancelled == jobs
    assert sum(result.faults.values()) > 0
    record(
        "nemesis",
        criterion="no invariant broken after any step; no (job, attempt) created twice; every job ends",
        rounds=jobs,
        steps=result.steps,
        checks=result.checks,
        faults=sum(result.faults.values()),
        creates=result.creates,
        duplicates=result.duplicates,
        violations=result.violations,
        completed=result.completed,
        failed=result.failed,
    )


def _quiet(root: Path) -> Nemesis:
    """A nemesis with no job run yet: its checks pass on the empty fleet."""
    n = Nemesis(NemesisConfig(seed=3, jobs=1), root)
    n.check(full=True)
    return n


def test_an_instance_no_rental_knows_is_caught(root: Path) -> None:
    """An instance at the vendor under a label the registry does not hold is a violation."""
    n = _quiet(root)
    offer = n.market.inner.search_offers(OfferQuery())[0]
    n.market.inner.create(offer, LaunchSpec(image="img", disk_gb=20, label="th-stranger-a1-k1", ssh_public_key="k"))
    with pytest.raises(InvariantViolation, match=r"no rental knows it.*--seed 3"):
        n.check()


def test_a_reservation_over_its_cap_is_caught(root: Path) -> None:
    """Reserved plus spent above a cap is a violation (written behind the budget's back)."""
    n = _quiet(root)
    n.rentals.budget.set_cap("job-x", 1.0)
    n.rentals.budget.reserve("job-x", 0.6, job="job-x")
    n.check()
    with n.engine.begin() as conn:
        conn.execute(text("UPDATE budget_reservations SET amount_usd = 1.5 WHERE budget = 'job-x'"))
    with pytest.raises(InvariantViolation, match=r"budget job-x: reserved \+ spent 1\.5"):
        n.check()


def test_a_tampered_ledger_row_is_caught(root: Path) -> None:
    """A ledger row altered after it was checked fails the full verify."""
    n = _quiet(root)
    n.rentals.budget.set_cap("job-x", 1.0)
    n.check(full=True)
    with n.engine.begin() as conn:
        conn.execute(text("DROP TRIGGER IF EXISTS ledger_no_update"))
        conn.execute(text("UPDATE ledger_events SET reason = 'rewritten' WHERE seq = 1"))
    with pytest.raises(InvariantViolation, match="ledger does not verify"):
        n.check(full=True)


def test_a_second_create_for_one_attempt_is_caught(root: Path) -> None:
    """Two vendor creates under one rental's label are a violation."""
    n = _quiet(root)
    n.market.creates_by_label["th-job-0000-a1-k1"] += 2
    with pytest.raises(InvariantViolation, match="more than one vendor create"):
        n.check()


def test_a_job_with_no_future_wake_up_is_caught(root: Path) -> None:
    """A booting job with no message, no wake-up and no supervision is stuck."""
    from app.policy.provisioning import new_job
    from app.policy.ranking import JobShape, Requirements

    n = _quiet(root)
    job = new_job("job-0000", req=Requirements(), shape=JobShape(download_gb=1.0, train_s=60.0, disk_gb=20.0))
    n.svc.save([(job, 0, None)])
    n.phase["job-0000"] = "provisioning"
    with pytest.raises(InvariantViolation, match=r"job job-0000 .* is stuck"):
        n.check()
