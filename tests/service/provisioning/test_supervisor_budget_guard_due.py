"""A job's poll leaves its caps to the beat's budget monitor while that monitor's last pass still
covers the next poll, and holds them itself when the monitor has gone quiet: one read per poll
instead of a pass over the job's caps."""

from __future__ import annotations

from pathlib import Path

from app.liveness import BUDGET_MONITOR_CLEAN, record_success
from tests.service.provisioning.test_supervisor_service import JOB, Harness, _training


def _training_at_cap(tmp_path: Path) -> tuple[Harness, str, int]:
    h = Harness(tmp_path)
    inst, seq = h.start()
    seq, _, _ = h.poll(seq)
    _training(h.hosts[inst], 3)
    seq, _, _ = h.poll(seq)
    h.clock.advance(3600)
    h.prov.rentals.budget.set_cap(JOB, 0.02)  # spent already
    _training(h.hosts[inst], 9)
    return h, inst, seq


def test_a_fresh_budget_monitor_pass_leaves_the_cap_to_the_monitor(tmp_path: Path) -> None:
    """Given a job past its cap and a budget monitor pass 5 s ago, the poll does not stop the host:
    the monitor's next pass comes before the cap can be overrun."""
    h, inst, seq = _training_at_cap(tmp_path)
    record_success(h.engine, BUDGET_MONITOR_CLEAN, h.clock.now() - 5.0)
    h.poll(seq)
    assert h.market.status(inst).state == "running"


def test_a_quiet_budget_monitor_leaves_the_cap_to_the_poll(tmp_path: Path) -> None:
    """Given a job past its cap and a budget monitor last seen 10 minutes ago, the poll stops the host."""
    h, inst, seq = _training_at_cap(tmp_path)
    record_success(h.engine, BUDGET_MONITOR_CLEAN, h.clock.now() - 600.0)
    h.poll(seq)
    assert h.market.status(inst).state != "running"


def test_a_budget_monitor_pass_with_errors_leaves_the_cap_to_the_poll(tmp_path: Path) -> None:
    """Given a job past its cap and a monitor pass 5 s ago that reported an error (its last clean pass
    long ago), the poll stops the host: a failed stop covers nothing."""
    h, inst, seq = _training_at_cap(tmp_path)
    record_success(h.engine, "budget-monitor", h.clock.now() - 5.0)
    record_success(h.engine, BUDGET_MONITOR_CLEAN, h.clock.now() - 600.0)
    h.poll(seq)
    assert h.market.status(inst).state != "running"
