"""The operator's lifecycle verbs: `tuneharness cancel JOB` and `tuneharness resume JOB`.

Cancel ends a job where it stands, for good until the operator resumes it:

1. the job (and a gated job's training runs) is marked `cancelled` first, so a task still in
   flight ends quietly (`JobStore.set_phase` never moves a cancelled job; the provisioning shell
   schedules nothing for one);
2. under each run's step lease, its provisioning state is ended (`app.policy.lifecycle.cancel_job`:
   `failed`, no wake-up), so no step, redrive or recovery rents for it again; its standby jobs end;
3. every host it rents (training, standby, held) is stopped, never destroyed (`stopped_by`:
   operator), and each stopped rental's reservations are settled with what it billed;
4. its monitor chain ends (`SupervisorService.end_chain`); a `job_cancelled` ledger event and an
   alert say what was stopped and from which pulled checkpoint a resume would go on.

An interrupted cancel (a vendor that refused a stop) leaves the job `cancelled` with a host still
running: cancelling it again finishes the work.

Resume continues a cancelled, failed or budget-stopped job from its newest pulled checkpoint: the
provisioning state is queued again (`reopen_job`), and provisioning rents a fresh host or adopts a
held one; the supervisor pushes the newest pulled checkpoint onto it, as after a lost host. A
new budget (`budget_usd`) is money for the continuation: the job's cap becomes what it has used
plus that amount. A job paused at its budget keeps its stopped host: more budget is all it needs,
and its supervisor starts that host again.

An intent whose create was never confirmed is not touched here: the create may still come, so the
reconciler stops what appears under its label, and redrive releases the intent when nothing does.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from app.alerts import Alert
from app.artifacts import latest_checkpoint
from app.errors import UserError
from app.jobs import JobRecord, spec_from_dict
from app.ledger import Event
from app.market import MarketError
from app.numbers import MAX_USD
from app.policy.lifecycle import cancel_job, reopen_job
from app.policy.provisioning import Stop, new_job
from app.policy.supervision import StopReason
from app.rentals import Rental
from app.services.supervisor import SupervisorService

__all__ = ["CANCELLABLE", "RESUMABLE", "CancelReport", "Lifecycle", "ResumeReport"]

CANCELLABLE = ("queued", "provisioning", "training", "paused", "blocked")
RESUMABLE = ("cancelled", "failed", "paused", "blocked")  # paused: only at its budget; blocked: once fixed
Enqueue = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class CancelReport:
    job_id: str
    runs: tuple[str, ...]
    stopped: tuple[str, ...]  # instance ids stopped now
    settled_usd: float  # what the settled rentals billed
    checkpoints: dict[str, int] = field(default_factory=dict)  # run -> newest pulled checkpoint step (0: none)
    errors: tuple[str, ...] = ()  # stops a vendor refused: cancel again to finish

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "runs": list(self.runs),
            "stopped": list(self.stopped),
            "settled_usd": round(self.settled_usd, 6),
            "checkpoints": dict(self.checkpoints),
            "errors": list(self.errors),
        }


@dataclass(frozen=True, slots=True)
class ResumeReport:
    job_id: str
    runs: tuple[str, ...]
    from_steps: dict[str, int]  # run -> the pulled checkpoint step it continues from (0: the start)
    caps_usd: dict[str, float]  # run -> its cap now (runs whose cap was given)
    waits_for_budget: bool = False  # a job paused at its budget: its supervisor starts its host again

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "runs": list(self.runs),
            "from_steps": dict(self.from_steps),
            "caps_usd": {k: round(v, 6) for k, v in self.caps_usd.items()},
            "waits_for_budget": self.waits_for_budget,
        }


class Lifecycle:
    """Cancel and resume, on the supervisor's services (provisioning, jobs, store, ledger, notifier)."""

    def __init__(self, supervisor: SupervisorService, *, enqueue: Enqueue | None = None) -> None:
        self.sup = supervisor
        self.prov = supervisor.provisioning
        self.jobs = supervisor.jobs
        self.ledger = supervisor.ledger
        self.enqueue = enqueue

    # -- reads --------------------------------------------------------------------------------
    def _job(self, job_id: str, verb: str) -> JobRecord:
        rec = self.jobs.get(job_id)
        if rec is None:
            raise UserError(f"no job {job_id!r}. Fix: pick an id from `tuneharness jobs`")
        parent = rec.spec.get("parent")
        if parent:
            raise UserError(
                f"{job_id} is a training run of job {parent}. Fix: tuneharness {verb} {parent} (all its runs)"
            )
        return rec

    def _runs(self, rec: JobRecord) -> list[JobRecord]:
        """A gated job's training runs; the job itself otherwise."""
        runs = self.jobs.runs(rec.job_id)
        return [r for r in runs.values() if r is not None] if runs else [rec]

    def _live(self, run_id: str, *, blocked: bool = False) -> bool:
        """Does anything of the run still spend or step (a cancel to finish)? A blocked run's chain
        has ended (nothing steps it), so only a host it still rents counts."""
        if self.prov.rentals.all(job=run_id, states=("active",)):
            return True
        if blocked:
            return False
        loaded = self.prov.state(run_id)
        return loaded is not None and loaded[0].phase not in ("done", "failed")

    def checkpoint_step(self, run_id: str) -> int:
        """The newest checkpoint pulled off the run's hosts (0: none; a resume starts from scratch)."""
        name = latest_checkpoint(self.sup.store, job=run_id)
        return 0 if name is None else int(name.split("-")[1])

    # -- cancel -------------------------------------------------------------------------------
    def cancel(self, job_id: str, *, reason: str = "no reason given") -> CancelReport:
        """Stop every host of the job (never destroy), settle its reservations, end its chains."""
        rec = self._job(job_id, "cancel")
        runs = self._runs(rec)
        # a cancel that was interrupted, or a job failed while something of it still runs (a task
        # that killed its worker fails the job, not its host): cancelling it stops what runs
        finishing = rec.phase in ("cancelled", "failed") and any(self._live(r.job_id) for r in runs)
        if rec.phase not in CANCELLABLE and not finishing:
            raise UserError(f"job {job_id} is {rec.phase}, nothing of it runs to cancel. Fix: {_cancel_fix(rec.phase)}")
        why = f"cancelled by the operator: {reason}"
        ids = tuple(r.job_id for r in runs if r.phase in CANCELLABLE or self._live(r.job_id))
        for jid in dict.fromkeys([*ids, job_id]):
            self.jobs.set_phase(jid, "cancelled", detail=why)
        stopped: list[str] = []
        errors: list[str] = []
        settled = 0.0
        for run_id in ids:
            s, e, usd = self._cancel_run(run_id, reason=why)
            stopped += s
            errors += e
            settled += usd
        report = CancelReport(
            job_id, ids, tuple(stopped), settled, {r: self.checkpoint_step(r) for r in ids}, tuple(errors)
        )
        now = self.prov.clock.now()
        self.ledger.append(
            Event(
                kind="job_cancelled",
                job=job_id,
                reason=why,
                amount_usd=report.settled_usd,
                payload=report.to_dict(),
                idempotency_key=f"{job_id}:cancelled:{int(now * 1000)}",
            )
        )
        steps = ", ".join(f"{r} from step {s}" for r, s in report.checkpoints.items())
        self.sup.notifier.notify(
            Alert(
                "job_cancelled",
                f"{len(stopped)} host(s) stopped, ${settled:.2f} settled; resume would go on {steps}",
                job=job_id,
                details={"stopped": len(stopped), "errors": len(errors), "reason": reason},
                key=f"job_cancelled:{job_id}:{int(now * 1000)}",
            )
        )
        return report

    def _cancel_run(self, run_id: str, *, reason: str) -> tuple[list[str], list[str], float]:
        prov = self.prov
        now = prov.clock.now()
        stops: list[Stop] = []
        with prov.leases.held(run_id) as held:
            if not held:
                raise UserError(
                    f"a provisioning step of {run_id} held it for over {prov.leases.wait_s:.0f}s; the job is marked "
                    "cancelled, its hosts are not stopped yet. Fix: run `tuneharness cancel` again"
                )
            loaded = prov.state(run_id)
            if loaded is None:  # not provisioned yet: a state that is already over, so `provision` rents nothing
                rec = self.jobs.get(run_id)
                spec = spec_from_dict(rec.spec) if rec is not None else None
                if spec is not None:
                    fresh = new_job(run_id, req=spec.needs.requirements(), shape=spec.shape())
                    prov.save([(cancel_job(fresh, reason=reason)[0], 0, None)])
            elif loaded[0].phase not in ("done", "failed"):
                ended, acts = cancel_job(loaded[0], reason=reason)
                stops += [a for a in acts if isinstance(a, Stop)]
                prov.save([(ended, loaded[1], None)])
        for sj in prov.pool.standby_jobs(run_id):
            st = prov.state(sj.job_id)
            if st is not None and st[0].phase not in ("done", "failed"):
                prov.save([(replace(st[0], phase="done", attempt=None, failure=reason), st[1], None)])
        for h in prov.pool.held(owner=run_id):
            prov.pool.end(h.id, reason=reason, now=now)
        self.sup.end_chain(run_id)
        stopped: list[str] = []
        errors: list[str] = []
        # the policy's stop of its training host first, then every other host rented under its name
        # (standby hosts, held hosts, an attempt a standby job had booting)
        first = [r for a in stops if (r := prov.rental_of(a.instance_id)) is not None and r.job == run_id]
        rest = [r for r in prov.rentals.all(job=run_id, states=("active",)) if r.id not in {f.id for f in first}]
        for rental in first:
            self._keep_log(rental)
        for rental in [*first, *rest]:
            try:
                if self._stop(rental, reason=reason, now=now):
                    stopped.append(rental.instance_id or rental.id)
            except MarketError as exc:
                errors.append(f"{rental.instance_id}: {exc}")
        settled = 0.0
        still_held = self._held_reservations()
        for rental in prov.rentals.all(job=run_id, states=("stopped", "destroyed", "lost")):
            if set(prov.rentals.reservations_of(rental.id)) & still_held:
                settled += prov.rentals.spent_usd(rental, now=now)
                prov.rentals.settle(rental.id, now=now, reason=reason)
        return stopped, errors, settled

    def _keep_log(self, rental: Rental) -> None:
        """Pull the training host's train.log before it stops (best effort: `tuneharness logs` reads it)."""
        from app.services.joblogs import keep_train_log
        from app.ssh import SSHError

        if rental.instance_id is None:
            return
        try:
            inst = self.prov.market_for(rental.provider).status(rental.instance_id)
            shell = self.sup.shell_for(inst, rental.opened_by)
        except (MarketError, OSError, SSHError):
            return
        try:
            keep_train_log(
                shell, self.sup.store, job_id=rental.job, instance_id=rental.instance_id, staging=self.sup.staging
            )
        finally:
            shell.close()

    def _held_reservations(self) -> set[str]:
        """Every reservation still held, under any cap."""
        budget = self.prov.rentals.budget
        out: set[str] = set()
        for name in budget.caps():
            out |= budget.held(name)
        return out

    def _stop(self, rental: Rental, *, reason: str, now: float) -> bool:
        """Stop one host of a cancelled job: the operator's stop, never a destroy."""
        prov = self.prov
        moved = prov.rentals.stop(
            rental.id,
            market=prov.market_for(rental.provider),
            reason=reason,
            kind="instance_stopped",
            now=now,
            evidence={"stopped_by": StopReason.OPERATOR.value},
        )
        if rental.instance_id is not None:
            prov.pool.off_risk(rental.provider, rental.instance_id, lost=False, now=now)
        return moved

    # -- resume -------------------------------------------------------------------------------
    def check_resume(self, job_id: str, *, budget_usd: float | None) -> list[JobRecord]:
        """The runs a resume would continue; `UserError` (nothing written) when it cannot."""
        if budget_usd is not None and not (math.isfinite(budget_usd) and 0 < budget_usd <= MAX_USD):
            raise UserError(
                f"--budget-usd {budget_usd!r} is not an amount in (0, {MAX_USD:g}]. "
                "Fix: give dollars, e.g. --budget-usd 5"
            )
        rec = self._job(job_id, "resume")
        if rec.phase not in RESUMABLE:
            raise UserError(f"job {job_id} is {rec.phase}: {_resume_fix(rec.phase)}")
        runs = [r for r in self._runs(rec) if r.phase in RESUMABLE]
        if rec.phase == "paused" or any(r.phase == "paused" for r in runs):
            for r in runs:
                if r.phase == "paused" and self._paused_by(r.job_id) != StopReason.BUDGET.value:
                    raise UserError(
                        f"job {r.job_id} is paused ({self._paused_by(r.job_id)}), not at its budget: it resumes on "
                        "its own once the reason is gone. Fix: `tuneharness extend` for a kill-time, or wait"
                    )
            if budget_usd is None:
                raise UserError(
                    f"job {job_id} is paused at its budget. "
                    f"Fix: tuneharness resume {job_id} --budget-usd N (N more dollars)"
                )
        if not runs:
            raise UserError(f"job {job_id} has no cancelled or failed run to resume. Fix: see `tuneharness jobs show`")
        if any(self._live(r.job_id, blocked=r.phase == "blocked") and r.phase != "paused" for r in runs):
            raise UserError(
                f"something of job {job_id} still runs. Fix: tuneharness cancel {job_id} first, then resume it"
            )
        if budget_usd is None:
            for r in runs:
                left = self._left_usd(r.job_id)
                if left is not None and left <= 0:
                    raise UserError(
                        f"job {r.job_id} has no budget left. "
                        f"Fix: tuneharness resume {job_id} --budget-usd N (N more dollars)"
                    )
        return runs

    def _paused_by(self, run_id: str) -> str | None:
        rows = self.ledger.rows(job=run_id, kind="job_paused")
        return str(rows[-1].payload.get("stopped_by")) if rows else None

    def _cap_name(self, run_id: str) -> str:
        return run_id if run_id in self.prov.rentals.budget.caps() else "default"

    def _left_usd(self, run_id: str) -> float | None:
        name = self._cap_name(run_id)
        for s in self.prov.rentals.budget.status():
            if s.name == name and s.unit == "usd" and s.period == "total":
                return s.left_usd
        return None

    def _used_usd(self, run_id: str) -> float:
        for s in self.prov.rentals.budget.status():
            if s.name == run_id and s.unit == "usd" and s.period == "total":
                return s.spent_usd + s.reserved_usd
        return 0.0

    def resume(self, job_id: str, *, budget_usd: float | None = None) -> ResumeReport:
        """Continue the job from its newest pulled checkpoint (see the module's docstring)."""
        runs = self.check_resume(job_id, budget_usd=budget_usd)
        rec = self.jobs.get(job_id)
        assert rec is not None
        now = self.prov.clock.now()
        share = None if budget_usd is None else budget_usd / len(runs)
        caps: dict[str, float] = {}
        from_steps: dict[str, int] = {}
        paused = False
        for r in runs:
            step = self.checkpoint_step(r.job_id)
            from_steps[r.job_id] = step
            cap = None
            if share is not None:
                cap = min(MAX_USD, self._used_usd(r.job_id) + share)
                self.prov.rentals.budget.set_cap(
                    r.job_id, cap, reason=f"tuneharness resume {job_id}: ${share:.2f} more"
                )
                caps[r.job_id] = cap
            if r.phase == "paused":  # at its budget: the supervisor starts its stopped host again
                paused = True
                continue
            self._reopen(r.job_id)
            self.jobs.reopen(
                r.job_id,
                phase="queued",
                detail=f"resumed by the operator from step {step}",
                budget_usd=cap,
            )
        if rec.job_id not in from_steps:  # a gated job: its runs train again
            self.jobs.reopen(job_id, phase="training", detail="resumed by the operator: " + ", ".join(from_steps))
        report = ResumeReport(job_id, tuple(r.job_id for r in runs), from_steps, caps, paused)
        self.ledger.append(
            Event(
                kind="job_resumed_by_operator",
                job=job_id,
                reason="tuneharness resume",
                amount_usd=budget_usd,
                payload=report.to_dict(),
                idempotency_key=f"{job_id}:resumed_by_operator:{int(now * 1000)}",
            )
        )
        for r in runs:
            if r.phase != "paused" and self.enqueue is not None:
                self.enqueue(r.job_id)
        return report

    def _reopen(self, run_id: str) -> None:
        prov = self.prov
        with prov.leases.held(run_id) as held:
            if not held:
                raise UserError(f"a provisioning step of {run_id} still holds it. Fix: try again in a minute")
            loaded = prov.state(run_id)
            if loaded is not None:
                prov.save([(reopen_job(loaded[0]), loaded[1], prov.clock.now())])


def _cancel_fix(phase: str) -> str:
    if phase == "cancelled":
        return "it is cancelled already; `tuneharness resume JOB` continues it"
    if phase == "evaluating":
        return "its adapters are pulled and being judged on the control plane; wait for the gate's decision"
    return "nothing to do; `tuneharness resume JOB` continues a failed job"


def _resume_fix(phase: str) -> str:
    if phase == "done":
        return "it finished; nothing to resume. Fix: submit a new job to train further"
    if phase == "evaluating":
        return "its adapters are being judged. Fix: wait for the gate's decision"
    return (
        "it still runs; only a cancelled, failed, blocked or budget-stopped job resumes. "
        "Fix: tuneharness cancel JOB first, or let it run"
    )
