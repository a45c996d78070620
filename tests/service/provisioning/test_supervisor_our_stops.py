"""Our own stops are not host losses: a training host that the budget monitor, the reaper, the idle
watchdog or the operator stopped pauses its job (no quarantine, no `host_lost`, nothing rented)
until the stop's reason is gone; the real supervisor, driven poll by poll on the sim market."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from app.jobs import JobStore, parse_job_text
from app.ledger import Ledger
from app.market import Instance, Market
from app.services.guardrails import sweep_budgets, sweep_idle, sweep_ttl
from app.services.receipts import build_receipt
from tests.service.provisioning.test_supervisor_service import JOB, Harness, _training
from tests.support.jobfiles import sim_needs_section, train_section


def _job_record(h: Harness) -> JobStore:
    """The job's row in the job table, so its phase and detail can be read as `tuneharness jobs` shows them."""
    jobs = JobStore(h.engine)
    text = f"name: ours\n{train_section()}{sim_needs_section()}"
    jobs.add(parse_job_text(text, check_files=False), job_id=JOB)
    h.sup.jobs = jobs
    return jobs


def _training_job(h: Harness) -> tuple[str, int, JobStore]:
    """A job handed a host, its trainer started and at step 6 with a checkpoint pulled."""
    jobs = _job_record(h)
    h.prov.ttl_s = 6 * 3600.0  # a kill-time well past this test's hours
    inst, seq = h.start()
    seq, _, _ = h.poll(seq)
    host = h.hosts[inst]
    _training(host, 6)
    host.write_complete("checkpoints/step-00000005", {"trainer_state.pt": b"state"}, step=5, kind="checkpoint")
    seq, _, _ = h.poll(seq)
    return inst, seq, jobs


def _no_loss(h: Harness, inst: str) -> None:
    """Nothing of a host loss happened: no host_lost, no alert, no penalty, the job still on that host."""
    assert "host_lost" not in h.kinds() and "host_lost" not in h.notifier.kinds()
    machine = h.market.referee.host_of(inst).machine_id
    view = h.prov.reputation.get("sim", machine)
    assert view is None or not view.record.failures
    state = h.prov.state(JOB)
    assert state is not None and state[0].phase == "training" and state[0].attempt is not None
    assert state[0].attempt.instance_id == inst and machine not in state[0].excluded


class _IdleGpu:
    """The sim market as the idle watchdog sees a trainer that stopped using its GPU: utilisation 0."""

    def __init__(self, market: Market) -> None:
        self.market = market
        self.name = market.name

    def status(self, instance_id: str) -> Instance:
        return replace(self.market.status(instance_id), gpu_util=0.0)

    def stop(self, instance_id: str) -> None:
        self.market.stop(instance_id)


def _rentals_of_job(h: Harness) -> int:
    return len(h.prov.rentals.all(job=JOB))


def _payloads(h: Harness, kind: str) -> list[dict[str, object]]:
    return [dict(r.payload) for r in Ledger(h.engine).rows(job=JOB, kind=kind)]


def test_a_budget_stop_mid_training_pauses_the_job_until_the_cap_has_room(tmp_path: Path) -> None:
    """Given a job training on a sim host, when the budget monitor stops its host at the cap, then the
    job is paused naming the budget (no quarantine, no host_lost, no replacement rented) for as long as
    the cap is full; once the operator raises the cap the same host is started again, its pause is
    not billed as GPU time, and the trainer is launched on it from the pulled checkpoint."""
    h = Harness(tmp_path)
    inst, seq, jobs = _training_job(h)
    rented = _rentals_of_job(h)
    budget = h.prov.rentals.budget
    h.clock.advance(3600)
    budget.set_cap(JOB, 0.01)  # already spent
    report = sweep_budgets(
        budget,
        rentals=h.prov.rentals,
        markets={"sim": h.market},
        now=h.clock.now(),
        checkpoint_safe=lambda job: True,
        end_job=lambda job, cap, evidence: h.prov.end_at_cap(job, cap=cap, evidence=evidence) != [],
        job_phase=lambda job: rec.phase if (rec := jobs.get(job)) is not None else None,
    )
    assert report.stopped == [inst] and h.market.status(inst).state == "stopped"
    stopped_at = h.clock.now()
    h.hosts[inst].unreachable = True  # a stopped host answers no SSH
    for _ in range(4):
        seq, nxt, _ = h.poll(seq, advance_s=60)
        assert nxt == "monitor"
    _no_loss(h, inst)
    assert _rentals_of_job(h) == rented
    rec = jobs.get(JOB)
    assert rec is not None and rec.phase == "paused" and "budget" in rec.detail and "cap" in rec.detail
    (paused,) = _payloads(h, "job_paused")
    assert paused["stopped_by"] == "budget" and paused["step"] == 6

    budget.set_cap(JOB, 50.0)  # the operator raises the cap
    h.hosts[inst].unreachable = False
    seq, nxt, _ = h.poll(seq)
    assert nxt == "monitor" and h.market.status(inst).state == "running"
    assert h.prov.rentals.by_instance("sim", inst).state == "active"  # type: ignore[union-attr]
    assert _payloads(h, "job_resumed")[0]["stopped_by"] == "budget"
    launches = h.hosts[inst].launches
    seq, nxt, _ = h.poll(seq)
    assert h.hosts[inst].launches == launches + 1  # the bundle pushed again, the trainer started
    assert (h.hosts[inst].root / "tuneharness-jobs" / JOB / "job" / "checkpoints" / "step-00000005").is_dir()
    rec = jobs.get(JOB)
    assert rec is not None and rec.phase == "training"
    _no_loss(h, inst)
    # The receipt bills the pause as storage only: GPU up to the stop, then again from the restart.
    restarted_at = float(_payloads(h, "instance_started")[0]["at"])  # type: ignore[arg-type]
    rental = h.prov.rentals.by_instance("sim", inst)
    assert rental is not None
    receipt = build_receipt(h.prov.rentals, Ledger(h.engine), now=h.clock.now())
    shares = [c for c in receipt.rentals if c.instance_id == inst]
    assert [c.end_reason for c in shares] == ["stopped, then started again", "running"]
    gpu = sum(c.gpu_usd for c in shares)
    ran_s = (stopped_at - rental.created_at) + (h.clock.now() - restarted_at)
    assert abs(gpu - (rental.rate_usd_per_hour or 0.0) * ran_s / 3600.0) < 1e-9


def test_a_resumed_job_is_not_judged_a_hang_for_its_pause(tmp_path: Path) -> None:
    """A resumed job is not judged a hang for the time it spent paused: until it passes the step it
    had reached, its progress is not fed to the stall window."""
    h = Harness(tmp_path)
    inst, seq, _ = _training_job(h)
    h.prov.rentals.budget.set_cap(JOB, 0.0001)
    sweep_budgets(
        h.prov.rentals.budget,
        rentals=h.prov.rentals,
        markets={"sim": h.market},
        now=h.clock.now(),
        job_phase=lambda job: "training",
    )
    h.clock.advance(4 * 3600)  # paused far longer than the stall window
    seq, _, _ = h.poll(seq)
    h.prov.rentals.budget.set_cap(JOB, 50.0)
    seq, _, _ = h.poll(seq)  # host started again
    seq, _, _ = h.poll(seq)  # trainer relaunched from step 5
    _training(h.hosts[inst], 5)
    seq, nxt, _ = h.poll(seq)
    assert nxt == "monitor"
    _training(h.hosts[inst], 7)  # past the step reached before the pause: judged as usual again
    seq, nxt, _ = h.poll(seq)
    assert nxt == "monitor"
    _no_loss(h, inst)
    assert h.sup.watch(JOB)[0].resumed_launch_at is None  # type: ignore[index]


def test_a_kill_time_stop_pauses_the_job_with_reason_kill_time(tmp_path: Path) -> None:
    """Given a job training, when the reaper stops its host past the kill-time, then the job is paused
    with reason kill_time (it needs a longer kill-time): no loss, no replacement, and it stays paused."""
    h = Harness(tmp_path)
    inst, seq, jobs = _training_job(h)
    rented = _rentals_of_job(h)
    rental = h.prov.rentals.by_instance("sim", inst)
    assert rental is not None
    h.clock.set(rental.kill_at + 1)
    assert sweep_ttl(h.prov.rentals, {"sim": h.market}, now=h.clock.now()).stopped == [inst]
    h.hosts[inst].unreachable = True
    for _ in range(3):
        seq, nxt, _ = h.poll(seq, advance_s=120)
        assert nxt == "monitor"
    _no_loss(h, inst)
    assert _rentals_of_job(h) == rented and h.market.status(inst).state == "stopped"
    rec = jobs.get(JOB)
    assert rec is not None and rec.phase == "paused" and "kill-time" in rec.detail
    assert [p["stopped_by"] for p in _payloads(h, "job_paused")] == ["kill_time"]
    # the operator extends the kill-time (`tuneharness extend`): the same host starts again
    after = h.prov.rentals.extend_kill_time(rental.id, by_s=3 * 3600.0, reason="needs longer", now=h.clock.now())
    assert after is not None and after.kill_at == rental.kill_at + 3 * 3600.0
    h.hosts[inst].unreachable = False
    seq, nxt, _ = h.poll(seq)
    assert nxt == "monitor" and h.market.status(inst).state == "running"
    assert [p["stopped_by"] for p in _payloads(h, "job_resumed")] == ["kill_time"]
    assert _rentals_of_job(h) == rented


def test_an_idle_stop_of_a_training_host_restarts_it_without_a_loss(tmp_path: Path) -> None:
    """Given a job training whose GPU the idle watchdog saw idle past its grace, when the watchdog stops
    the host, then the supervisor starts the same host again (the job still needs it): no quarantine,
    no host_lost, no new rental."""
    h = Harness(tmp_path)
    inst, seq, _ = _training_job(h)
    rented = _rentals_of_job(h)
    markets = {"sim": _IdleGpu(h.market)}
    for _ in range(3):
        sweep_idle(h.prov.rentals, markets, now=h.clock.now(), grace_s=60.0)  # type: ignore[arg-type]
        h.clock.advance(60)
    assert h.market.status(inst).state == "stopped"
    seq, nxt, _ = h.poll(seq)
    assert nxt == "monitor" and h.market.status(inst).state == "running"
    assert [p["stopped_by"] for p in _payloads(h, "job_resumed")] == ["idle"]
    seq, _, _ = h.poll(seq)
    _no_loss(h, inst)
    assert _rentals_of_job(h) == rented


def test_an_operator_stop_pauses_until_the_operator_resumes(tmp_path: Path) -> None:
    """A host the operator stopped (`tuneharness stop`) pauses its job, and the job says that only the
    operator resumes it; it is never treated as lost."""
    h = Harness(tmp_path)
    inst, seq, jobs = _training_job(h)
    rental = h.prov.rentals.by_instance("sim", inst)
    assert rental is not None
    h.market.stop(inst)
    h.prov.rentals.transition(
        rental.id,
        to="stopped",
        from_states=("active",),
        kind="rental_stopped",
        reason="operator stopped it",
        now=h.clock.now(),
        evidence={"stopped_by": "operator"},
    )
    h.hosts[inst].unreachable = True
    for _ in range(3):
        seq, nxt, _ = h.poll(seq)
        assert nxt == "monitor"
    _no_loss(h, inst)
    rec = jobs.get(JOB)
    assert rec is not None and rec.phase == "paused" and "only the operator" in rec.detail


def test_a_host_the_vendor_stops_is_still_lost(tmp_path: Path) -> None:
    """The vendor stopping the host (our registry still says active) is a loss as before: host_lost,
    the machine recorded, the job re-queued."""
    h = Harness(tmp_path)
    inst, seq, _ = _training_job(h)
    h.market.stop(inst)
    h.hosts[inst].unreachable = True
    seq, _, _ = h.poll(seq)
    _, nxt, _ = h.poll(seq)
    assert nxt == "provision" and "host_lost" in h.kinds() and "job_paused" not in h.kinds()
    state = h.prov.state(JOB)
    assert state is not None and state[0].phase == "queued"
