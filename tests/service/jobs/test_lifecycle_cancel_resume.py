"""`tuneharness cancel` and `tuneharness resume` at the service level: the real provisioning service
and supervisor on the sim market and a virtual clock (the supervisor tests' harness)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from app.errors import UserError
from app.jobs import JobStore, parse_job_text
from app.ledger import Ledger
from app.policy.lifecycle import is_cancelled
from app.policy.provisioning import TrainerStatus
from app.services.lifecycle import Lifecycle
from tests.service.provisioning.test_supervisor_service import JOB, Harness, _training
from tests.support.jobfiles import sim_needs_section, train_section


def _job(h: Harness) -> JobStore:
    jobs = JobStore(h.engine)
    jobs.add(parse_job_text(f"name: life\n{train_section()}{sim_needs_section()}", check_files=False), job_id=JOB)
    h.sup.jobs = jobs
    return jobs


def _training_job(h: Harness) -> tuple[str, int, JobStore]:
    """A job training on a sim host at step 6, its step-5 checkpoint pulled."""
    jobs = _job(h)
    h.prov.ttl_s = 6 * 3600.0
    inst, seq = h.start()
    jobs.set_phase(JOB, "training", detail=f"on {inst}")
    seq, _, _ = h.poll(seq)
    _training(h.hosts[inst], 6)
    h.hosts[inst].write_complete("checkpoints/step-00000005", {"trainer_state.pt": b"state"}, step=5, kind="checkpoint")
    seq, _, _ = h.poll(seq)
    return inst, seq, jobs


def _lifecycle(h: Harness, sent: list[str]) -> Lifecycle:
    return Lifecycle(h.sup, enqueue=sent.append)


def _held_reservations(h: Harness) -> set[str]:
    budget = h.prov.rentals.budget
    return {rid for name in budget.caps() for rid in budget.held(name)}


def test_cancel_stops_the_host_never_destroys_it_and_settles_its_reservations(tmp_path: Path) -> None:
    """Given a training job, when the operator cancels it, then its host is stopped (not destroyed,
    stopped_by operator), the rental's reservations are settled with what it billed, the job is
    cancelled in the job table and in its provisioning state, and a ledger event and an alert say so."""
    h = Harness(tmp_path)
    inst, _, jobs = _training_job(h)
    rental = h.prov.rentals.by_instance("sim", inst)
    assert rental is not None and set(h.prov.rentals.reservations_of(rental.id)) & _held_reservations(h)
    h.clock.advance(600)

    report = _lifecycle(h, []).cancel(JOB, reason="wrong data")

    assert report.stopped == (inst,) and report.errors == () and report.checkpoints == {JOB: 5}
    assert h.market.status(inst).state == "stopped" and not h.destroyed(inst)
    after = h.prov.rentals.by_instance("sim", inst)
    assert after is not None and after.state == "stopped"
    assert not set(h.prov.rentals.reservations_of(rental.id)) & _held_reservations(h)
    assert math.isclose(report.settled_usd, h.prov.rentals.spent_usd(after, now=h.clock.now()), rel_tol=1e-9)
    stop = [r for r in Ledger(h.engine).rows(kind="instance_stopped") if r.instance == inst]
    assert [r.payload["stopped_by"] for r in stop] == ["operator"]
    rec = jobs.get(JOB)
    assert rec is not None and rec.phase == "cancelled" and "wrong data" in rec.detail
    state = h.prov.state(JOB)
    assert state is not None and is_cancelled(state[0]) and state[0].attempt is None
    assert "job_cancelled" in h.kinds() and "job_cancelled" in h.notifier.kinds()


def test_a_cancelled_jobs_pending_tasks_are_no_ops_and_redrive_skips_it(tmp_path: Path) -> None:
    """Given a cancelled job, its queued monitor task ends on a stale chain, a provisioning step and a
    loss reported by the supervisor rent nothing, nothing moves it out of `cancelled`, and redrive
    finds no overdue wake-up for it."""
    h = Harness(tmp_path)
    inst, seq, jobs = _training_job(h)
    rentals_before = len(h.prov.rentals.all(job=JOB))
    _lifecycle(h, []).cancel(JOB)

    assert h.sup.poll(JOB, seq).next == "none"
    h.clock.advance(3 * 3600)
    assert h.prov.step(JOB).phase == "failed"
    lost = h.prov.observe(JOB, TrainerStatus(instance=h.market.status(inst), phase="failed", work_s=6.0))
    assert lost.phase == "failed" and lost.wake_at is None
    assert jobs.set_phase(JOB, "training", detail="a late poll") is False
    assert h.prov.overdue(grace_wall_s=0.0) == []
    assert len(h.prov.rentals.all(job=JOB)) == rentals_before
    rec = jobs.get(JOB)
    assert rec is not None and rec.phase == "cancelled"


def test_a_job_cancelled_before_its_first_step_is_never_provisioned(tmp_path: Path) -> None:
    """Given a submitted job not provisioned yet, when it is cancelled, then a late `provision` (start)
    rents nothing."""
    h = Harness(tmp_path)
    _job(h)
    _lifecycle(h, []).cancel(JOB)
    spec = h.sup.jobs.get(JOB)
    assert spec is not None
    from app.jobs import spec_from_dict

    s = spec_from_dict(spec.spec)
    step = h.prov.start(JOB, req=s.needs.requirements(), shape=s.shape())
    assert step.phase == "failed" and h.prov.rentals.all(job=JOB) == []


def test_resume_goes_on_from_the_newest_checkpoint_on_a_fresh_rental_with_a_new_budget(tmp_path: Path) -> None:
    """Given a cancelled job whose step-5 checkpoint was pulled, when the operator resumes it with
    $3 more, then its cap is what it used plus $3, it is enqueued, provisioning rents a fresh host,
    and the supervisor pushes the step-5 checkpoint there and starts the trainer from it."""
    h = Harness(tmp_path)
    inst, _, jobs = _training_job(h)
    sent: list[str] = []
    life = _lifecycle(h, sent)
    life.cancel(JOB)
    used = next(s for s in h.prov.rentals.budget.status() if s.name == JOB)

    report = life.resume(JOB, budget_usd=3.0)

    assert sent == [JOB] and report.from_steps == {JOB: 5}
    cap = next(s for s in h.prov.rentals.budget.status() if s.name == JOB).cap_usd
    assert math.isclose(cap, used.spent_usd + used.reserved_usd + 3.0, rel_tol=1e-9)
    rec = jobs.get(JOB)
    assert rec is not None and rec.phase == "queued" and rec.budget_usd == cap
    state = h.prov.state(JOB)
    assert state is not None and state[0].phase == "queued"
    fresh = h.provision(h.prov.step(JOB))
    assert fresh != inst
    assert h.prov.rentals.by_instance("sim", inst).state == "stopped"  # type: ignore[union-attr]
    seq = h.sup.arm(JOB, fresh)
    h.poll(seq)
    assert h.hosts[fresh].launches == 1
    assert (h.hosts[fresh].root / "tuneharness-jobs" / JOB / "job" / "checkpoints" / "step-00000005").is_dir()
    watch = h.sup.watch(JOB)
    assert watch is not None and watch[0].resume_step == 5 and watch[0].lost_at is None
    assert [r.payload["from_steps"] for r in Ledger(h.engine).rows(kind="job_resumed_by_operator")] == [{JOB: 5}]


@pytest.mark.parametrize(
    ("verb", "job", "budget", "needle"),
    [
        ("cancel", "job-nope", None, "no job 'job-nope'"),
        ("resume", "job-nope", None, "no job 'job-nope'"),
        ("resume", JOB, None, "it still runs"),
        ("resume", JOB, math.nan, "--budget-usd nan"),
        ("resume", JOB, -1.0, "--budget-usd -1.0"),
    ],
)
def test_bad_input_is_one_line_naming_the_fix_and_writes_nothing(
    tmp_path: Path, verb: str, job: str, budget: float | None, needle: str
) -> None:
    """An unknown job, a running job to resume, or a budget that is not a finite positive amount is
    refused with one line that names the fix; nothing is written (ledger, job table, rentals)."""
    h = Harness(tmp_path)
    _, _, jobs = _training_job(h)
    sent: list[str] = []
    life = _lifecycle(h, sent)
    before = (len(Ledger(h.engine).rows()), jobs.get(JOB), h.prov.rentals.all())
    with pytest.raises(UserError) as err:
        if verb == "cancel":
            life.cancel(job)
        else:
            life.resume(job, budget_usd=budget)
    assert needle in str(err.value) and "Fix:" in str(err.value) and "\n" not in str(err.value)
    assert (len(Ledger(h.engine).rows()), jobs.get(JOB), h.prov.rentals.all()) == before and sent == []


def test_a_done_job_cannot_be_cancelled_and_a_cancelled_one_not_twice(tmp_path: Path) -> None:
    """Cancel refuses a job with nothing running (done, or cancelled already with every host stopped)."""
    h = Harness(tmp_path)
    _training_job(h)
    life = _lifecycle(h, [])
    life.cancel(JOB)
    with pytest.raises(UserError, match="cancelled already"):
        life.cancel(JOB)
    h.sup.jobs.reopen(JOB, phase="done", detail="finished")
    with pytest.raises(UserError, match="is done"):
        life.cancel(JOB)


def test_a_job_paused_at_its_budget_resumes_on_its_own_host_with_more_budget(tmp_path: Path) -> None:
    """Given a training job whose host the budget monitor stopped at its cap (paused), resume without
    a budget is refused naming the fix; with $4 more its cap is raised, nothing is enqueued or rented,
    and the supervisor's next look starts the same host again."""
    from app.services.guardrails import sweep_budgets

    h = Harness(tmp_path)
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
    sent: list[str] = []
    life = _lifecycle(h, sent)
    with pytest.raises(UserError, match="paused at its budget"):
        life.resume(JOB)
    rented = len(h.prov.rentals.all(job=JOB))

    report = life.resume(JOB, budget_usd=4.0)

    assert report.waits_for_budget and sent == [] and report.caps_usd[JOB] > 4.0
    h.hosts[inst].unreachable = False
    h.poll(seq)
    assert h.market.status(inst).state == "running" and len(h.prov.rentals.all(job=JOB)) == rented


def test_a_gated_job_is_cancelled_and_resumed_with_all_its_runs(tmp_path: Path) -> None:
    """A gated job cancels each of its seed runs (a run alone is refused, naming its job) and resumes
    them all, the new budget split evenly, the job training again."""
    from app.jobs import seed_run_id

    h = Harness(tmp_path)
    jobs = JobStore(h.engine)
    h.sup.jobs = jobs
    gate = "gate:\n  config: {metric: accuracy}\n  eval: eval.jsonl\n  baseline: predictions:base.jsonl\n"
    spec = parse_job_text(f"name: gated\n{train_section()}{sim_needs_section()}{gate}", check_files=False)
    jobs.add(spec, job_id="g")
    runs = [seed_run_id("g", s) for s in spec.seeds]
    for run, seed in zip(runs, spec.seeds, strict=True):
        jobs.add(spec.seed_run(seed, parent="g"), job_id=run)
    jobs.set_phase("g", "training", detail="one run per seed")
    sent: list[str] = []
    life = _lifecycle(h, sent)
    with pytest.raises(UserError, match="tuneharness cancel g"):
        life.cancel(runs[0])

    assert life.cancel("g").runs == tuple(runs)
    assert [r.phase for r in jobs.list()] == ["cancelled"] * 3
    assert all((st := h.prov.state(r)) is not None and is_cancelled(st[0]) for r in runs)

    report = life.resume("g", budget_usd=4.0)
    assert sent == runs and report.caps_usd == {r: 2.0 for r in runs}
    assert {r.job_id: r.phase for r in jobs.list()} == {"g": "training", **{r: "queued" for r in runs}}
