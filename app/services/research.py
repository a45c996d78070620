"""The research run's driver: feeds experiment results to `app.policy.research` and applies its actions.

Each experiment seed is an ordinary job (`<run>-<exp>-s<seed>`) submitted the way `tuneharness
submit` does it, so reservations, provisioning, preflight, supervision, recovery and the ledger apply
unchanged. Before a job is recorded, its cap is reserved out of the run's own budget cap
(`research-<run>`); when the job ends that reservation is settled with what the job cost (the
receipt: rentals and ledger).

The run's state is in the fleet's database (`app.researchstore`), so a tick may run on any worker on
any machine. One writer at a time: the tick and the stop hold the run's lease, and each saved state
is a compare-and-set on the run's sequence number. The files under TUNEHARNESS_HOME/research/<run>/
are exported from the database after every tick and stop.

Crash safety: actions are idempotent (a job id that exists is not submitted again, a reservation has
an idempotency key, an experiment already recorded is not recorded again, the best config is
rewritten whole), and the policy's state is saved after they are applied. A tick that dies half-way
is repeated from the saved state and does the same things again, harmlessly.
"""

from __future__ import annotations

import json
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, select

from app.artifacts import ArtifactError, ArtifactStore
from app.budget import Budget
from app.db import read_connection
from app.jobs import JobSpec, JobStore
from app.ledger import Event, Ledger
from app.policy.research import (
    Action,
    Cancel,
    ExperimentEnded,
    ExperimentPlan,
    Finish,
    Launch,
    NewBest,
    Observation,
    Phase,
    Record,
    ResearchState,
    Start,
    Stop,
    decide,
    dump_state,
    load_state,
    new_state,
)
from app.rentals import Rentals
from app.research import ResearchFile, research_root
from app.researchstore import WAIT_S, ResearchRunStore, research_runs

__all__ = ["ENDED_PHASES", "ResearchService", "SeedFacts", "budget_name", "experiment_job_id", "experiment_line"]

# A job in one of these phases will not change by itself: its experiment can be judged.
ENDED_PHASES = ("done", "failed", "cancelled", "blocked")


def budget_name(run_id: str) -> str:
    return f"research-{run_id}"


def experiment_job_id(run_id: str, exp_id: str, seed: int) -> str:
    return f"{run_id}-{exp_id}-s{seed}"


@dataclass(frozen=True, slots=True)
class SeedFacts:
    """What one seed's job left: its metric, hosts, money and timings."""

    job_id: str
    phase: str
    detail: str
    val_loss: float | None
    steps: int | None
    trained_s: float | None
    wall_s: float
    usd: float
    hosts: tuple[str, ...]
    gpu_models: tuple[str, ...]
    tflops: tuple[float, ...]
    lost: int


class ResearchService:
    def __init__(
        self,
        *,
        home: Path,
        jobs: JobStore,
        ledger: Ledger,
        budget: Budget,
        rentals: Rentals,
        engine: Engine,
        artifacts: ArtifactStore,
        enqueue: Callable[[str], None],
        cancel: Callable[[str], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.root = research_root(home)
        self.jobs, self.ledger, self.budget, self.rentals = jobs, ledger, budget, rentals
        self.engine, self.artifacts = engine, artifacts
        self.enqueue, self.cancel_job, self.clock = enqueue, cancel, clock

    def store(self, run_id: str) -> ResearchRunStore:
        return ResearchRunStore(self.engine, self.root, run_id)

    # -- commands ----------------------------------------------------------------------------------
    def create(self, rf: ResearchFile) -> str:
        """Record a new run (its file, its budget cap); the first tick starts it."""
        run_id = f"{rf.name}-{uuid.uuid4().hex[:6]}"
        store = self.store(run_id)
        store.create(rf.to_dict())
        self.budget.set_cap(budget_name(run_id), rf.config.budget_usd, reason=f"research file {rf.source}")
        self.ledger.append(
            Event(
                kind="research_started",
                job=run_id,
                reason=f"research file {rf.source}",
                payload={"budget_usd": rf.config.budget_usd, "tier": rf.tier, "time_box_s": rf.time_box_s},
                idempotency_key=f"{run_id}:research_started",
            )
        )
        return run_id

    def runs(self) -> list[str]:
        """Every run's id, oldest first."""
        return research_runs(self.engine)

    def active(self, run_id: str) -> bool:
        state = self.store(run_id).state()
        return state is None or state.get("phase") != Phase.FINISHED.value

    def tick(self, run_id: str, *, wait_s: float = WAIT_S) -> bool:
        """Start the run, or judge every experiment whose jobs all ended; True while the run goes on.
        Raises ResearchBusy when another writer holds the run for longer than `wait_s`."""
        store = self.store(run_id)
        rf = ResearchFile.from_dict(store.spec())
        with store.locked(wait_s=wait_s):
            saved, seq = store.load()
            if saved is None:
                state, seq = self._step(store, rf, new_state(rf.job.train), Start(), {}, seq)
            else:
                state = load_state(saved)
            for plan in state.running:
                facts = self._facts(run_id, plan)
                if facts is None:
                    continue
                obs = ExperimentEnded(
                    plan.exp_id,
                    {f_seed: f.val_loss for f_seed, f in facts.items()},
                    cost_usd=sum(f.usd for f in facts.values()),
                    tflops=min((t for f in facts.values() for t in f.tflops), default=None),
                )
                state, seq = self._step(store, rf, state, obs, {plan.exp_id: facts}, seq)
        store.export()
        return state.phase is not Phase.FINISHED

    def claim_tick(self, run_id: str, seq: int) -> bool:
        """Only the tick holding the run's current sequence number goes on (a redelivered or duplicated
        tick is dropped, so one chain of ticks runs per run); claiming moves the number on."""
        return self.store(run_id).claim_tick(seq)

    def stale(self, run_id: str, *, older_than_s: float) -> int | None:
        """The sequence number to re-arm an active run's ticks with when its last tick is older than
        `older_than_s` (its chain was lost with a control plane), else None."""
        store = self.store(run_id)
        if not self.active(run_id):
            return None
        age = store.tick_age_s()
        return store.tick_seq() if age is None or age > older_than_s else None

    def stop(self, run_id: str, *, reason: str) -> ResearchState:
        """Cancel what is in flight and finish the run with its best config written."""
        store = self.store(run_id)
        rf = ResearchFile.from_dict(store.spec())
        with store.locked():
            saved, seq = store.load()
            state = new_state(rf.job.train) if saved is None else load_state(saved)
            state, _ = self._step(store, rf, state, Stop(reason), {}, seq)
        store.export()
        return state

    # -- one decision, applied -----------------------------------------------------------------------
    def _step(
        self,
        store: ResearchRunStore,
        rf: ResearchFile,
        state: ResearchState,
        obs: Observation,
        facts: Mapping[str, Mapping[int, SeedFacts]],
        seq: int,
    ) -> tuple[ResearchState, int]:
        """Decide, apply the actions, then save the state if no other writer saved one since `seq`."""
        before = state
        state, actions = decide(state, obs, rf.config)
        for action in actions:
            self._apply(store, rf, before, action, facts)
        stopped = True if isinstance(obs, Stop) else None
        return state, store.save_state(dump_state(state), expect_seq=seq, stopped=stopped)

    def _apply(
        self,
        store: ResearchRunStore,
        rf: ResearchFile,
        before: ResearchState,
        action: Action,
        facts: Mapping[str, Mapping[int, SeedFacts]],
    ) -> None:
        run_id = store.run_id
        if isinstance(action, Launch):
            self._launch(run_id, rf, action.plan)
        elif isinstance(action, Record):
            plan = action.plan
            seeds = facts.get(plan.exp_id) or {
                s: f for s in plan.seeds if (f := self._seed_facts(experiment_job_id(run_id, plan.exp_id, s)))
            }
            self._settle(run_id, rf, plan, seeds)
            store.append(experiment_line(run_id, action, seeds))
        elif isinstance(action, NewBest):
            store.write_best(
                {
                    "run": run_id,
                    "exp": action.exp_id,
                    "val_loss": action.mean,
                    "found_for_usd": round(action.found_for_usd, 6),
                    "train": dict(action.config),
                }
            )
        elif isinstance(action, Cancel):
            plan = next(p for p in before.running if p.exp_id == action.exp_id)
            for seed in plan.seeds:
                job_id = experiment_job_id(run_id, plan.exp_id, seed)
                rec = self.jobs.get(job_id)
                if rec is not None and rec.phase not in ENDED_PHASES:
                    self.cancel_job(job_id)
        elif isinstance(action, Finish):
            if store.best() is None:
                store.write_best({"run": run_id, "exp": None, "val_loss": None, "train": dict(before.best)})
            self.ledger.append(
                Event(
                    kind="research_finished",
                    job=run_id,
                    reason=action.reason,
                    idempotency_key=f"{run_id}:research_finished",
                )
            )

    def _launch(self, run_id: str, rf: ResearchFile, plan: ExperimentPlan) -> None:
        """Submit one job per seed of the experiment, each cap reserved out of the run's budget first."""
        for seed in plan.seeds:
            job_id = experiment_job_id(run_id, plan.exp_id, seed)
            if self.jobs.get(job_id) is not None:
                continue  # a repeated tick: submitted already
            self.budget.reserve(
                budget_name(run_id), rf.job_budget_usd, job=job_id, idempotency_key=f"research:{job_id}"
            )
            spec = _experiment_spec(rf, plan, seed, run_id=run_id)
            self.jobs.add(spec, job_id=job_id)
            self.budget.set_cap(job_id, rf.job_budget_usd, reason=f"research run {run_id} ({plan.exp_id})")
            self.ledger.append(
                Event(
                    kind="job_submitted",
                    job=job_id,
                    reason="research experiment",
                    payload={
                        "name": spec.name,
                        "source": rf.source,
                        "budget_usd": rf.job_budget_usd,
                        "gpu": list(spec.needs.gpu),
                        "providers": list(spec.needs.providers),
                        "research": run_id,
                        "axis": plan.axis,
                        "new": plan.new,
                    },
                    idempotency_key=f"{job_id}:submitted",
                )
            )
            self.enqueue(job_id)

    def _settle(self, run_id: str, rf: ResearchFile, plan: ExperimentPlan, facts: Mapping[int, SeedFacts]) -> None:
        """Settle each seed's reservation on the run's cap with what its job cost (its own cap bounds it)."""
        for seed in plan.seeds:
            job_id = experiment_job_id(run_id, plan.exp_id, seed)
            if self.jobs.get(job_id) is None:
                continue  # never submitted: nothing was reserved for it
            # The same idempotency key as the launch's: this returns that reservation, reserving nothing.
            res = self.budget.reserve(
                budget_name(run_id), rf.job_budget_usd, job=job_id, idempotency_key=f"research:{job_id}"
            )
            if res.state == "held":
                f = facts.get(seed)
                spent = min(res.amount_usd, f.usd) if f is not None else 0.0
                self.budget.settle(res.id, spent, reason=f"research experiment {plan.exp_id} ended")

    # -- reading what a job left -----------------------------------------------------------------------
    def _facts(self, run_id: str, plan: ExperimentPlan) -> dict[int, SeedFacts] | None:
        """Every seed's facts once all of the experiment's jobs ended; None while any runs."""
        out: dict[int, SeedFacts] = {}
        for seed in plan.seeds:
            f = self._seed_facts(experiment_job_id(run_id, plan.exp_id, seed))
            if f is None or f.phase not in ENDED_PHASES:
                return None
            out[seed] = f
        return out

    def _seed_facts(self, job_id: str) -> SeedFacts | None:
        rec = self.jobs.get(job_id)
        if rec is None:
            return None
        meta = self._meta(job_id) if rec.phase == "done" else {}
        from app.services.receipts import build_receipt

        usd = build_receipt(self.rentals, self.ledger, now=self.clock(), job=job_id).as_dict()["total_usd"]
        started = self.ledger.rows(job=job_id, kind="training_started")
        hosts = tuple(dict.fromkeys(f"{e.provider}:{e.machine}" for e in started if e.machine))
        models, tflops = self._speeds(hosts)
        val = meta.get("val_loss")
        return SeedFacts(
            job_id=job_id,
            phase=rec.phase,
            detail=rec.detail,
            val_loss=float(val) if isinstance(val, int | float) else None,
            steps=int(meta["steps"]) if isinstance(meta.get("steps"), int) else None,
            trained_s=float(meta["trained_s"]) if isinstance(meta.get("trained_s"), int | float) else None,
            wall_s=round(max(0.0, rec.updated_at - rec.created_at), 3),
            usd=float(usd),
            hosts=hosts,
            gpu_models=models,
            tflops=tflops,
            lost=len(self.ledger.rows(job=job_id, kind="host_lost")),
        )

    def _meta(self, job_id: str) -> dict[str, Any]:
        """The pulled adapter's trainer_meta.json ({} when it cannot be read)."""
        with tempfile.TemporaryDirectory() as tmp:
            local = Path(tmp) / "trainer_meta.json"
            try:
                self.artifacts.get_file(f"jobs/{job_id}/adapter/trainer_meta.json", local)
                return dict(json.loads(local.read_text()))
            except (ArtifactError, OSError, ValueError):
                return {}

    def _speeds(self, hosts: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[float, ...]]:
        """The GPU model and the newest preflight TFLOP/s of each `provider:machine`."""
        from app.gpu_speeds import GpuSpeed

        t = GpuSpeed.__table__  # type: ignore[attr-defined]
        models: list[str] = []
        tflops: list[float] = []
        with read_connection(self.engine) as conn:
            for host in hosts:
                provider, _, machine = host.partition(":")
                row = conn.execute(
                    select(t.c.gpu_model, t.c.tflops_json)
                    .where(t.c.provider == provider, t.c.machine_id == machine)
                    .order_by(t.c.measured_at.desc())
                ).first()
                if row is None:
                    continue
                measured = json.loads(row.tflops_json or "[]")
                models.append(str(row.gpu_model))
                if measured:
                    tflops.append(round(float(measured[-1]), 3))
        return tuple(dict.fromkeys(models)), tuple(tflops)


def experiment_line(run_id: str, rec: Record, facts: Mapping[int, SeedFacts]) -> dict[str, Any]:
    """One experiments.jsonl line (app.research.EXPERIMENT_FIELDS)."""
    plan = rec.plan
    fs = list(facts.values())
    if any(f.phase in ("failed", "blocked") for f in fs):
        status = "crashed: " + "; ".join(f"{f.job_id} {f.phase}: {f.detail}" for f in fs if f.phase != "done")
    elif any(f.phase == "cancelled" for f in fs):
        status = "cancelled"
    elif any(f.lost for f in fs):
        status = f"lost and recovered ({sum(f.lost for f in fs)} host(s))"
    else:
        status = "ok"
    return {
        "run": run_id,
        "exp": plan.exp_id,
        "iteration": plan.iteration,
        "axis": plan.axis,
        "old": plan.old,
        "new": plan.new,
        "parent": dict(plan.parent),
        "config": dict(plan.config),
        "seeds": list(plan.seeds),
        "metric": "val_loss",
        "metric_per_seed": {str(s): facts[s].val_loss if s in facts else None for s in plan.seeds},
        "mean": rec.mean,
        "best_mean": rec.best_mean,
        "noise": rec.noise,
        "verdict": str(rec.verdict),
        "why": rec.why,
        "status": status,
        "jobs": [experiment_job_id(run_id, plan.exp_id, s) for s in plan.seeds],
        "hosts": sorted({h for f in fs for h in f.hosts}),
        "gpu_models": sorted({m for f in fs for m in f.gpu_models}),
        "tflops": [t for f in fs for t in f.tflops],
        "wall_s": round(max((f.wall_s for f in fs), default=0.0), 3),
        "steps": {str(s): facts[s].steps if s in facts else None for s in plan.seeds},
        "usd": round(sum(f.usd for f in fs), 6),
    }


def _experiment_spec(rf: ResearchFile, plan: ExperimentPlan, seed: int, *, run_id: str) -> JobSpec:
    """The experiment's job: the base job with the experiment's config, its seed, the time box, the
    validation split, the tier's GPU and its own cap."""
    train = {
        **plan.config,
        "seed": seed,
        "time_box_s": rf.time_box_s,
        "val_fraction": rf.val_fraction,
    }
    return replace(
        rf.job,
        name=f"{run_id}-{plan.exp_id}-s{seed}",
        train=train,
        needs=replace(rf.job.needs, gpu=(rf.tier,)),
        budget_usd=rf.job_budget_usd,
        gate=None,
        parent=None,
    )
