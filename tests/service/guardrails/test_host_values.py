"""The supervisor believes a host's status.json only within bounds, so no host value keeps a money stop waiting."""

from __future__ import annotations

import time
from pathlib import Path

from app.services.supervisor import checkpoint_safe, step_advanced_at
from tests.service.provisioning.test_supervisor_service import JOB, Harness, _iso, _training


def test_a_host_cannot_keep_its_checkpoint_unsafe_with_impossible_steps(tmp_path: Path) -> None:
    """A step past max_steps, a step going backwards and a checkpoint ahead of the step are not believed."""
    h = Harness(tmp_path)
    inst, seq = h.start()
    seq, _, _ = h.poll(seq)
    host = h.hosts[inst]
    _training(host, 5)
    host.write_complete("checkpoints/step-00000004", {"trainer_state.pt": b"state"}, step=4, kind="checkpoint")
    host.status["last_checkpoint_step"] = 4
    seq, _, _ = h.poll(seq)
    assert checkpoint_safe(h.engine, JOB)
    advanced = step_advanced_at(h.engine, JOB, inst)
    assert advanced is not None
    host.status = {
        "step": 10**9,
        "max_steps": 10**9,
        "phase": "training",
        "last_checkpoint_step": 10**9,
        "updated_at": _iso(time.time()),
    }
    seq, _, _ = h.poll(seq)
    watch = h.sup.watch(JOB)
    assert watch is not None and watch[0].step == 5 and watch[0].host_checkpoint_step == 4
    assert watch[0].max_steps == 20  # the first report's; a host cannot raise it later
    assert checkpoint_safe(h.engine, JOB)
    host.status = {"step": 3, "phase": "training", "last_checkpoint_step": 2, "updated_at": _iso(time.time())}
    seq, _, _ = h.poll(seq)
    watch = h.sup.watch(JOB)
    assert watch is not None and watch[0].step == 5 and watch[0].host_checkpoint_step == 4
    assert step_advanced_at(h.engine, JOB, inst) == advanced  # no believed progress since
    assert step_advanced_at(h.engine, JOB, "another-instance") is None
