"""A cancel that lands while the supervisor starts a paused job's host again never leaves that host
billing: before the start the restart is refused, and after it the host is stopped again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.services.guardrails import sweep_budgets
from app.services.lifecycle import Lifecycle
from tests.service.jobs.test_lifecycle_cancel_resume import _training_job
from tests.service.provisioning.test_supervisor_service import JOB, Harness


def _paused_at_budget(h: Harness) -> tuple[str, int]:
    inst, seq, jobs = _training_job(h)
    budget = h.prov.rentals.budget
    h.clock.advance(3600)
    budget.set_cap(JOB, 0.01)
    sweep_budgets(
        budget, rentals=h.prov.rentals, markets={"sim": h.market}, now=h.clock.now(), job_phase=lambda job: "training"
    )
    h.hosts[inst].unreachable = True
    seq, _, _ = h.poll(seq)
    rec = jobs.get(JOB)
    assert rec is not None and rec.phase == "paused"
    h.hosts[inst].unreachable = False
    budget.set_cap(JOB, 100.0)  # the reason for the pause is gone: the next look restarts the host
    return inst, seq


def _cancel_first(h: Harness, name: str) -> None:
    """The cancel lands just before the supervisor's call to `name` on its rentals."""
    rentals = h.prov.rentals
    real = getattr(rentals, name)

    def cancelled_then(*args: Any, **kwargs: Any) -> Any:
        Lifecycle(h.sup, enqueue=lambda job: None).cancel(JOB, reason="operator, mid-poll")
        setattr(rentals, name, real)
        return real(*args, **kwargs)

    setattr(rentals, name, cancelled_then)


def test_a_cancel_before_the_start_refuses_the_restart(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    inst, seq = _paused_at_budget(h)
    _cancel_first(h, "reserve_for")
    h.poll(seq)
    assert h.market.status(inst).state != "running"
    assert h.sup.jobs.get(JOB).phase == "cancelled"  # type: ignore[union-attr]
    assert not any(e.kind == "instance_started" for e in h.prov.rentals.ledger.rows(job=JOB))


def test_a_cancel_between_the_check_and_the_start_is_undone_by_a_stop(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    inst, seq = _paused_at_budget(h)
    _cancel_first(h, "restart")
    h.poll(seq)
    assert h.market.status(inst).state != "running"
    stops = [e for e in h.prov.rentals.ledger.rows(job=JOB, kind="instance_stopped")]
    assert stops[-1].reason == "the job was cancelled while its host restarted"
    assert h.sup.jobs.get(JOB).phase == "cancelled"  # type: ignore[union-attr]
