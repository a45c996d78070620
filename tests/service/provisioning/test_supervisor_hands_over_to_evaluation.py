"""The supervisor's finish of a gated job's seed run: the last run's pulled adapter hands the job to `evaluate_job`."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import tests.service.provisioning.test_supervisor_service as sup_tests
from app.jobs import JobStore, parse_job_text, seed_run_id
from tests.support.jobfiles import train_section

GATED = (
    "name: gated\n"
    + train_section("none")
    + """\
needs:
  gpu: [RTX 3090]
gate:
  config: {metric: accuracy}
  eval: eval.jsonl
  baseline: predictions:baseline.jsonl
"""
)


def _finish(h: sup_tests.Harness) -> tuple[str, sup_tests.FakeHost]:
    inst, seq = h.start()
    seq, _, _ = h.poll(seq)
    host = h.hosts[inst]
    host.write_complete(
        "adapter", {"adapter_model.safetensors": b"weights", "trainer_meta.json": b"{}"}, step=20, kind="adapter"
    )
    host.status = {"step": 20, "max_steps": 20, "phase": "finished", "updated_at": sup_tests._iso(time.time())}
    host.alive, host.exit_code = False, 0
    return str(seq), host


@pytest.mark.parametrize("other_done", [True, False])
def test_the_last_seed_run_to_finish_enqueues_the_evaluation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, other_done: bool
) -> None:
    """Given seed 2's run done, when seed 1's adapter is pulled, the poll says `evaluate` the job (now
    `evaluating`); with seed 2 still training it says nothing more and the job waits."""
    run = seed_run_id("job-g", 1)
    monkeypatch.setattr(sup_tests, "JOB", run)
    h = sup_tests.Harness(tmp_path)
    jobs = JobStore(h.engine)
    spec = parse_job_text(GATED, source="job.yaml", base_dir=tmp_path, check_files=False)
    jobs.add(spec, job_id="job-g")
    for seed in spec.seeds:
        jobs.add(spec.seed_run(seed, parent="job-g"), job_id=seed_run_id("job-g", seed))
    jobs.set_phase("job-g", "training")
    if other_done:
        assert jobs.run_finished(seed_run_id("job-g", 2), detail="adapter pulled") is None

    seq, _host = _finish(h)
    step = h.sup.poll(run, int(seq))

    assert jobs.get(run).phase == "done"  # type: ignore[union-attr]
    assert h.store.exists(f"jobs/{run}/adapter/COMPLETE")
    if other_done:
        assert step.next == "evaluate" and step.evaluate == "job-g"
        assert jobs.get("job-g").phase == "evaluating"  # type: ignore[union-attr]
    else:
        assert step.next == "none" and step.evaluate is None
        assert jobs.get("job-g").phase == "training"  # type: ignore[union-attr]
