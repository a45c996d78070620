"""An out-of-memory death heals itself: the next slice runs half the micro-batch with twice the
accumulation, written into job.json on the same host, at most twice; the third oom stops the job
with the reason. The ledger records each change and `status` shows the values in force."""

from __future__ import annotations

import json
from pathlib import Path

from app.ledger import Ledger
from app.services.supervisor import Bundle, TriageAnswer, remote_job_root
from tests.service.provisioning.test_supervisor_service import JOB, Harness, _training


class OomHarness(Harness):
    def bundle(self, _job: str) -> Bundle:
        base = super().bundle(_job)
        return Bundle({**base.job_json, "batch_size": 8, "grad_accum": 1}, base.files)


def _oom(h: Harness, inst: str, seq: int, step: int) -> tuple[int, str]:
    host = h.hosts[inst]
    _training(host, step)
    host.alive, host.exit_code = False, 137
    seq, nxt, _ = h.poll(seq)
    return seq, nxt


def _host_job(h: Harness, inst: str) -> dict:  # type: ignore[type-arg]
    return json.loads((h.hosts[inst].root / remote_job_root(JOB) / "job" / "job.json").read_text())  # type: ignore[attr-defined]


def test_oom_halves_the_micro_batch_twice_then_stops_the_job(tmp_path: Path) -> None:
    h = OomHarness(tmp_path, triage=TriageAnswer("oom", "resume with a smaller micro-batch", remedy="same_host"))
    h.sup.cfg = type(h.sup.cfg)(monitor_s=30.0, repoll_s=10.0, max_same_host_restarts=5)
    inst, seq = h.start()
    seq, _, _ = h.poll(seq)
    assert (_host_job(h, inst)["batch_size"], _host_job(h, inst).get("grad_accum", 1)) == (8, 1)

    seq, nxt = _oom(h, inst, seq, 3)
    assert nxt == "monitor" and (_host_job(h, inst)["batch_size"], _host_job(h, inst)["grad_accum"]) == (4, 2)
    seq, nxt = _oom(h, inst, seq, 4)
    assert nxt == "monitor" and (_host_job(h, inst)["batch_size"], _host_job(h, inst)["grad_accum"]) == (2, 4)
    watched = h.sup.watch(JOB)
    assert watched is not None and watched[0].micro_batch == [2, 4] and watched[0].oom_halvings == 2

    _, nxt = _oom(h, inst, seq, 5)
    assert nxt == "none"
    rows = Ledger(h.engine).rows(job=JOB)
    halved = [r.payload for r in rows if r.kind == "micro_batch_halved"]
    assert [(p["before"], p["after"]) for p in halved] == [([8, 1], [4, 2]), ([4, 2], [2, 4])]
    died = [r.payload for r in rows if r.kind == "trainer_died"]
    assert [d["route"] for d in died] == ["same_host", "same_host", "stop"]
    assert "halving the micro-batch 2 times" in died[-1]["triage_action"]
    rental = h.prov.rentals.by_instance("sim", inst)
    assert rental is not None and rental.state == "stopped"  # stopped for the operator, never destroyed
    rec = h.sup.jobs.get(JOB) if h.sup.jobs is not None else None
    assert rec is None or rec.phase == "failed"


def test_a_replacement_host_gets_the_halved_micro_batch_in_its_bundle(tmp_path: Path) -> None:
    h = OomHarness(tmp_path, triage=TriageAnswer("oom", "resume with a smaller micro-batch", remedy="same_host"))
    h.sup.cfg = type(h.sup.cfg)(monitor_s=30.0, repoll_s=10.0, max_same_host_restarts=0)  # oom replaces the host
    inst, seq = h.start()
    seq, _, _ = h.poll(seq)
    _, nxt = _oom(h, inst, seq, 3)
    assert nxt == "provision"
    plan = h.sup.transfer_plan(JOB)
    (job_json,) = [f.local for f in plan.files if f.remote == "job/job.json"]
    sent = json.loads(Path(job_json).read_text())
    assert (sent["batch_size"], sent["grad_accum"]) == (4, 2)
