"""One training poll sends a bounded number of database statements, the same whatever the number of
other live rentals in the fleet: the poll runs for every job every period, so a statement per rental
in it costs the fleet squared."""

from __future__ import annotations

from pathlib import Path

from app.liveness import BUDGET_MONITOR_CLEAN, record_success
from tests.service.provisioning.test_supervisor_service import Harness, _training
from tests.support.query_count import add_live_rentals, counting

# A steady poll's statements, BEGINs included: its claim, the job's state, the host's rental, the
# job file, the provisioning step (lease, state, save) and the save; plus the job's own budget guard
# when the beat's monitor does not cover the poll. Raise only with a reason.
MAX_COVERED = 25
MAX_GUARDED = 45


def _poll_statements(tmp: Path, live: int) -> tuple[int, int]:
    h = Harness(tmp)
    inst, seq = h.start()
    seq, _, _ = h.poll(seq)
    _training(h.hosts[inst], 3)
    seq, _, _ = h.poll(seq)
    add_live_rentals(h.prov.rentals, live, now=h.clock.now())
    _training(h.hosts[inst], 5)
    with counting(h.engine) as guarded:
        seq, nxt, _ = h.poll(seq)
    assert nxt == "monitor"
    record_success(h.engine, BUDGET_MONITOR_CLEAN, h.clock.now())
    _training(h.hosts[inst], 7)
    with counting(h.engine) as covered:
        _, nxt, _ = h.poll(seq)
    assert nxt == "monitor" and not any(r.kind == "supervisor_error" for r in h.prov.ledger.rows())
    h.engine.dispose()
    return sum(guarded.values()), sum(covered.values())


def test_a_poll_costs_the_same_statements_beside_5_and_60_live_rentals(tmp_path: Path) -> None:
    """Given 5, then 60 other jobs' live rentals, a steady training poll sends the same number of
    statements, within its bound, with and without its own budget guard."""
    (tmp_path / "few").mkdir()
    (tmp_path / "many").mkdir()
    few = _poll_statements(tmp_path / "few", 5)
    many = _poll_statements(tmp_path / "many", 60)
    assert few == many, (few, many)
    guarded, covered = few
    assert covered <= MAX_COVERED and guarded <= MAX_GUARDED, few
