"""The supervisor triages a dead trainer with what it knows beside the log tail: a run that ended at
its last step is relaunched on the same host (it ends at once with its adapter), however alarming
its tail; a trainer SIGKILLed with a healthy log is taken for the OOM killer."""

from __future__ import annotations

from pathlib import Path

from app.ledger import Ledger
from app.services.supervisor import TriageAnswer
from tests.service.provisioning.test_supervisor_service import JOB, Harness, _training


def _died(h: Harness) -> dict:  # type: ignore[type-arg]
    (row,) = [r for r in Ledger(h.engine).rows(job=JOB) if r.kind == "trainer_died"]
    return row.payload


def test_a_trainer_that_died_at_its_last_step_is_completed_and_relaunched_on_its_host(tmp_path: Path) -> None:
    h = Harness(tmp_path, triage=TriageAnswer("cuda_fault", "replace the host", remedy="replace_host"))
    inst, seq = h.start()
    seq, _, _ = h.poll(seq)
    host = h.hosts[inst]
    _training(host, 20)  # max_steps 20: the last step's checkpoint was written, then it died
    host.status["phase"] = "failed"
    host.alive, host.exit_code = False, 1
    _, nxt, _ = h.poll(seq)
    died = _died(h)
    assert died["triage_state"] == "completed" and died["route"] == "same_host"
    assert "step 20 of 20" in died["evidence"][0]
    assert nxt == "monitor" and host.launches == 2
    rental = h.prov.rentals.by_instance("sim", inst)
    assert rental is not None and rental.state == "active"


def test_the_same_alarming_tail_one_step_earlier_replaces_the_host(tmp_path: Path) -> None:
    h = Harness(tmp_path, triage=TriageAnswer("cuda_fault", "replace the host", remedy="replace_host"))
    inst, seq = h.start()
    seq, _, _ = h.poll(seq)
    host = h.hosts[inst]
    _training(host, 19)
    host.status["phase"] = "failed"
    host.alive, host.exit_code = False, 1
    _, nxt, _ = h.poll(seq)
    assert _died(h)["triage_state"] == "cuda_fault" and nxt == "provision"


def test_a_sigkilled_trainer_with_a_healthy_log_is_oom_on_the_same_host(tmp_path: Path) -> None:
    h = Harness(tmp_path, triage=TriageAnswer("progressing", "restart the slice", remedy="continue"))
    inst, seq = h.start()
    seq, _, _ = h.poll(seq)
    host = h.hosts[inst]
    _training(host, 7)
    host.alive, host.exit_code = False, 137
    _, nxt, _ = h.poll(seq)
    died = _died(h)
    assert died["triage_state"] == "oom" and died["route"] == "same_host" and "SIGKILL" in died["evidence"][0]
    assert nxt == "monitor" and host.launches == 2
