"""A job's own monitor chain holds its budget caps at every poll, so a paused or lost beat (whose
budget monitor is the usual stop) cannot let a host bill past its cap."""

from __future__ import annotations

from pathlib import Path

from app.ledger import Ledger
from tests.service.provisioning.test_supervisor_service import JOB, Harness, _training


def test_without_any_budget_monitor_the_poll_stops_the_host_at_the_cap(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    inst, seq = h.start()
    seq, _, _ = h.poll(seq)
    _training(h.hosts[inst], 3)
    seq, _, _ = h.poll(seq)
    assert h.market.status(inst).state == "running"
    h.clock.advance(3600)
    h.prov.rentals.budget.set_cap(JOB, 0.02)  # spent already, and no beat to notice
    _training(h.hosts[inst], 9)
    h.poll(seq)
    assert h.market.status(inst).state != "running"
    (stop,) = [r for r in Ledger(h.engine).rows(job=JOB) if r.kind == "instance_stopped"]
    assert stop.reason == "budget_stop" and stop.payload["stopped_by"] == "budget"
    rental = h.prov.rentals.by_instance("sim", inst)
    assert rental is not None and rental.state == "stopped"  # stopped, never destroyed


def test_a_job_within_its_cap_is_left_alone(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    inst, seq = h.start()
    seq, _, _ = h.poll(seq)
    _training(h.hosts[inst], 3)
    h.clock.advance(600)
    assert h.sup.guard_budget(JOB) == []
    h.poll(seq)
    assert h.market.status(inst).state == "running"
