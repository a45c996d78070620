"""Autoresearch: mutate one axis of the best config, run it time-boxed, keep it only above the noise.

`decide(state, obs) -> (state, actions)`. The driver (Celery tasks in `workers/research.py`) turns
`Launch` into capped training jobs through the ordinary submit path, feeds each experiment's result
back as `ExperimentEnded`, and applies `Record`, `NewBest` and `Finish`. This module does no I/O,
reads no clock and draws no random numbers.

    baseline --all seeds ended--> searching --iterations done | budget | nothing left--> finished
       |  (the spread of its seeds      |  each iteration: up to `mutations` one-axis changes of
       |   is the noise floor)          |  the best config, at most `parallelism` in flight
       +----------- Stop: Cancel what is in flight, Finish ----------------------------------+

The noise rule: the baseline config runs on at least two seeds; the noise is
`max(min_noise, noise_sigmas * sample standard deviation of those seeds)`. A mutation is accepted
only if the mean of its seeds is below the best's mean by more than the noise. A mutation whose
host measured below `slow_fraction` of the tier's TFLOP/s (`expected_tflops`, else the slowest of the
baseline's hosts) is flagged `slow` and neither accepted nor rejected: it ran on a slower computer,
not a worse config, and it may be proposed again.

Money: every experiment reserves `reserve_usd` (its seeds' job caps together) out of the run's budget
before it is launched; nothing is launched that the budget left cannot cover, and when nothing can
be launched and nothing is in flight the run finishes with its best config written.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any

__all__ = [
    "Axis",
    "AxisKind",
    "Cancel",
    "ExperimentEnded",
    "ExperimentPlan",
    "Finish",
    "Launch",
    "NewBest",
    "Phase",
    "Record",
    "ResearchConfig",
    "ResearchState",
    "Start",
    "Stop",
    "Verdict",
    "decide",
    "dump_state",
    "get_path",
    "load_state",
    "mutate",
    "new_state",
    "noise_of",
    "propose",
    "set_path",
]


class AxisKind(StrEnum):
    TIMES = "times"  # multiplicative steps (rates)
    PLUS = "plus"  # additive steps
    CHOICES = "choices"  # a list of values


class Phase(StrEnum):
    BASELINE = "baseline"
    SEARCHING = "searching"
    FINISHED = "finished"


class Verdict(StrEnum):
    BASELINE = "baseline"
    ACCEPTED = "accepted"
    REJECTED = "rejected"
    SLOW = "slow"  # a slow host: flagged, not counted
    FAILED = "failed"  # no metric
    CANCELLED = "cancelled"  # the run was stopped while it ran


@dataclass(frozen=True, slots=True)
class Axis:
    """One axis: a (dotted) field of the train section and its steps."""

    name: str
    kind: AxisKind
    steps: tuple[Any, ...]
    integer: bool = False
    minimum: float | None = None
    maximum: float | None = None


@dataclass(frozen=True, slots=True)
class ResearchConfig:
    axes: tuple[Axis, ...]
    iterations: int
    mutations: int  # per iteration
    parallelism: int  # experiments in flight at once
    baseline_seeds: tuple[int, ...]
    seeds: tuple[int, ...]  # of each mutation
    budget_usd: float
    reserve_usd: float  # per job (one seed of one experiment)
    noise_sigmas: float = 2.0
    min_noise: float = 0.0
    slow_fraction: float = 0.85
    expected_tflops: float | None = None  # the tier's healthy TFLOP/s (None: what the baseline's hosts measured)


@dataclass(frozen=True, slots=True)
class ExperimentPlan:
    exp_id: str
    iteration: int
    axis: str | None  # None: the baseline
    old: Any
    new: Any
    config: Mapping[str, Any]
    parent: Mapping[str, Any]
    seeds: tuple[int, ...]
    reserve_usd: float


@dataclass(frozen=True, slots=True)
class Decided:
    """What is remembered of an ended experiment."""

    exp_id: str
    axis: str | None
    new: Any
    mean: float | None
    verdict: Verdict
    cost_usd: float


@dataclass(frozen=True, slots=True)
class ResearchState:
    phase: Phase
    best: Mapping[str, Any]
    best_mean: float | None = None
    noise: float | None = None
    iteration: int = 0
    next_exp: int = 0
    queue: tuple[ExperimentPlan, ...] = ()  # proposed, not yet launched
    running: tuple[ExperimentPlan, ...] = ()
    ended: tuple[Decided, ...] = ()  # of the current iteration
    tried: tuple[tuple[str, str], ...] = ()  # (axis, repr(value)) tried from the current best
    committed_usd: float = 0.0  # reserved by experiments in flight
    spent_usd: float = 0.0
    finished_reason: str | None = None
    accepted: tuple[Decided, ...] = field(default=())
    cost_since_best_usd: float = 0.0
    tier_tflops: float | None = None  # what a host of the tier should measure: slower is flagged


# -- observations ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Start:
    pass


@dataclass(frozen=True, slots=True)
class ExperimentEnded:
    exp_id: str
    metrics: Mapping[int, float | None]  # per seed; None: that seed gave no metric
    cost_usd: float
    tflops: float | None  # the slowest of its hosts' measured TFLOP/s (None: unknown)


@dataclass(frozen=True, slots=True)
class Stop:
    reason: str


Observation = Start | ExperimentEnded | Stop


# -- actions -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Launch:
    plan: ExperimentPlan


@dataclass(frozen=True, slots=True)
class Record:
    """One line of experiments.jsonl (the driver adds the hosts, the money and the timings)."""

    plan: ExperimentPlan
    verdict: Verdict
    why: str
    mean: float | None
    best_mean: float | None
    noise: float | None


@dataclass(frozen=True, slots=True)
class NewBest:
    config: Mapping[str, Any]
    mean: float
    exp_id: str
    found_for_usd: float  # what the experiments since the previous best cost


@dataclass(frozen=True, slots=True)
class Cancel:
    exp_id: str


@dataclass(frozen=True, slots=True)
class Finish:
    reason: str


Action = Launch | Record | NewBest | Cancel | Finish


# -- config paths and mutations ----------------------------------------------------------------
def get_path(config: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted path (`lora.r`), or None where it is absent."""
    node: Any = config
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def set_path(config: Mapping[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of `config` with `value` at a dotted path (nested mappings copied on the way)."""
    head, _, rest = path.partition(".")
    out = dict(config)
    if rest:
        inner = out.get(head)
        out[head] = set_path(inner if isinstance(inner, Mapping) else {}, rest, value)
    else:
        out[head] = value
    return out


def mutate(axis: Axis, old: Any) -> list[Any]:
    """The values one step away from `old` on `axis`, in the order of its steps, within its bounds."""
    out: list[Any] = []
    for step in axis.steps:
        if axis.kind is AxisKind.CHOICES:
            new = step
        elif not isinstance(old, int | float) or isinstance(old, bool):
            continue
        elif axis.kind is AxisKind.TIMES:
            new = old * step
        else:
            new = old + step
        if axis.kind is not AxisKind.CHOICES:
            new = round(new) if axis.integer else round(float(new), 12)
            if (axis.minimum is not None and new < axis.minimum) or (axis.maximum is not None and new > axis.maximum):
                continue
        if new != old and new not in out:
            out.append(new)
    return out


def propose(
    axes: Sequence[Axis], best: Mapping[str, Any], *, tried: Sequence[tuple[str, str]], count: int, offset: int
) -> list[tuple[Axis, Any, Any]]:
    """Up to `count` one-axis changes of `best` not yet tried from it: one per axis in turn, starting
    at axis `offset`, then a second step per axis, and so on."""
    per_axis = [
        [(a, get_path(best, a.name), v) for v in mutate(a, get_path(best, a.name)) if (a.name, repr(v)) not in tried]
        for a in axes
    ]
    out: list[tuple[Axis, Any, Any]] = []
    depth = 0
    while len(out) < count and any(len(c) > depth for c in per_axis):
        for i in range(len(per_axis)):
            cands = per_axis[(offset + i) % len(per_axis)]
            if depth < len(cands) and len(out) < count:
                out.append(cands[depth])
        depth += 1
    return out


def noise_of(values: Sequence[float], *, sigmas: float, minimum: float) -> float:
    """The noise floor from repeated runs of one config: `sigmas` sample standard deviations."""
    spread = statistics.stdev(values) if len(values) >= 2 else 0.0
    return max(minimum, sigmas * spread)


def new_state(base: Mapping[str, Any]) -> ResearchState:
    return ResearchState(phase=Phase.BASELINE, best=dict(base))


# -- the decision --------------------------------------------------------------------------------
def decide(state: ResearchState, obs: Observation, cfg: ResearchConfig) -> tuple[ResearchState, list[Action]]:
    """One step of the research run."""
    if state.phase is Phase.FINISHED:
        return state, []
    if isinstance(obs, Stop):
        actions: list[Action] = []
        for p in state.running:
            actions += [Cancel(p.exp_id), Record(p, Verdict.CANCELLED, f"stopped: {obs.reason}", None, None, None)]
        done = replace(state, phase=Phase.FINISHED, queue=(), running=(), committed_usd=0.0, finished_reason=obs.reason)
        return done, [*actions, Finish(obs.reason)]
    if isinstance(obs, Start):
        if state.running or state.queue or state.best_mean is not None:
            return state, []  # a repeated start (a redelivered message) changes nothing
        plan = _plan(state, cfg, axis=None, old=None, new=None, config=state.best, seeds=cfg.baseline_seeds)
        return _launch(replace(state, queue=(plan,), next_exp=state.next_exp + 1), cfg, [])
    return _ended(state, obs, cfg)


def _plan(
    state: ResearchState,
    cfg: ResearchConfig,
    *,
    axis: str | None,
    old: Any,
    new: Any,
    config: Mapping[str, Any],
    seeds: tuple[int, ...],
) -> ExperimentPlan:
    return ExperimentPlan(
        exp_id=f"e{state.next_exp:03d}",
        iteration=state.iteration,
        axis=axis,
        old=old,
        new=new,
        config=dict(config),
        parent=dict(state.best),
        seeds=seeds,
        reserve_usd=cfg.reserve_usd * len(seeds),
    )


def _launch(state: ResearchState, cfg: ResearchConfig, actions: list[Action]) -> tuple[ResearchState, list[Action]]:
    """Launch queued experiments while there is room in flight and money left; finish when idle."""
    queue, running, committed = list(state.queue), list(state.running), state.committed_usd
    while queue and len(running) < cfg.parallelism:
        plan = queue[0]
        if cfg.budget_usd - committed - state.spent_usd < plan.reserve_usd - 1e-12:
            break
        queue.pop(0)
        running.append(plan)
        committed += plan.reserve_usd
        actions.append(Launch(plan))
    state = replace(state, queue=tuple(queue), running=tuple(running), committed_usd=committed)
    if not state.running:
        reason = "budget: the next experiment's reservation does not fit" if state.queue else "no mutation left"
        state = replace(state, phase=Phase.FINISHED, queue=(), finished_reason=reason)
        actions.append(Finish(reason))
    return state, actions


def _ended(state: ResearchState, obs: ExperimentEnded, cfg: ResearchConfig) -> tuple[ResearchState, list[Action]]:
    plan = next((p for p in state.running if p.exp_id == obs.exp_id), None)
    if plan is None:
        return state, []  # not in flight (a repeated report): already decided
    cost = obs.cost_usd if math.isfinite(obs.cost_usd) and obs.cost_usd > 0 else 0.0
    state = replace(
        state,
        running=tuple(p for p in state.running if p.exp_id != obs.exp_id),
        committed_usd=max(0.0, state.committed_usd - plan.reserve_usd),
        spent_usd=state.spent_usd + cost,
        cost_since_best_usd=state.cost_since_best_usd + cost,
    )
    values = [float(v) for v in obs.metrics.values() if v is not None and math.isfinite(v)]
    mean = statistics.fmean(values) if values else None
    if plan.axis is None:
        tier = cfg.expected_tflops if cfg.expected_tflops is not None else obs.tflops
        return _baseline_ended(replace(state, tier_tflops=tier), plan, values, mean, cfg)
    verdict, why = _judge(state, obs, cfg, values, mean)
    decided = Decided(plan.exp_id, plan.axis, plan.new, mean, verdict, cost)
    tried = state.tried if verdict is Verdict.SLOW else (*state.tried, (plan.axis, repr(plan.new)))
    state = replace(state, ended=(*state.ended, decided), tried=tried)
    actions: list[Action] = [Record(plan, verdict, why, mean, state.best_mean, state.noise)]
    if state.queue or state.running:
        return _launch(state, cfg, actions)
    return _next_iteration(state, cfg, actions)


def _judge(
    state: ResearchState, obs: ExperimentEnded, cfg: ResearchConfig, values: list[float], mean: float | None
) -> tuple[Verdict, str]:
    assert state.best_mean is not None and state.noise is not None  # set when the baseline ended
    if mean is None or len(values) < len(obs.metrics):
        return Verdict.FAILED, f"no metric from {len(obs.metrics) - len(values)} of {len(obs.metrics)} seeds"
    tier = state.tier_tflops
    if tier is not None and obs.tflops is not None and obs.tflops < cfg.slow_fraction * tier:
        return Verdict.SLOW, (
            f"slow host: {obs.tflops:.3g} TFLOP/s < {cfg.slow_fraction:.0%} of the tier's {tier:.3g}; not counted"
        )
    gain = state.best_mean - mean
    if gain > state.noise:
        return (
            Verdict.ACCEPTED,
            f"{mean:.4f} beats the best {state.best_mean:.4f} by {gain:.4f} > noise {state.noise:.4f}",
        )
    return Verdict.REJECTED, f"{mean:.4f} vs the best {state.best_mean:.4f}: gain {gain:.4f} <= noise {state.noise:.4f}"


def _baseline_ended(
    state: ResearchState, plan: ExperimentPlan, values: list[float], mean: float | None, cfg: ResearchConfig
) -> tuple[ResearchState, list[Action]]:
    if mean is None or len(values) < 2:
        why = f"the baseline gave {len(values)} metrics of {len(plan.seeds)} seeds: no noise floor without two"
        record = Record(plan, Verdict.FAILED, why, mean, None, None)
        state = replace(state, phase=Phase.FINISHED, queue=(), finished_reason="baseline failed")
        return state, [record, Finish("baseline failed: " + why)]
    noise = noise_of(values, sigmas=cfg.noise_sigmas, minimum=cfg.min_noise)
    why = f"baseline over {len(values)} seeds: mean {mean:.4f}, noise floor {noise:.4f}"
    state = replace(state, best_mean=mean, noise=noise, phase=Phase.SEARCHING, cost_since_best_usd=0.0)
    actions: list[Action] = [
        Record(plan, Verdict.BASELINE, why, mean, mean, noise),
        NewBest(dict(state.best), mean, plan.exp_id, state.spent_usd),
    ]
    return _propose_iteration(state, cfg, actions)


def _next_iteration(
    state: ResearchState, cfg: ResearchConfig, actions: list[Action]
) -> tuple[ResearchState, list[Action]]:
    """Every experiment of the iteration ended: take the best accepted one, then propose the next."""
    wins = [d for d in state.ended if d.verdict is Verdict.ACCEPTED and d.mean is not None]
    if wins:
        win = min(wins, key=lambda d: (d.mean, d.exp_id))
        assert win.mean is not None and win.axis is not None
        best = set_path(state.best, win.axis, win.new)
        actions.append(NewBest(best, win.mean, win.exp_id, state.cost_since_best_usd))
        state = replace(
            state,
            best=best,
            best_mean=win.mean,
            tried=(),
            accepted=(*state.accepted, replace(win, cost_usd=state.cost_since_best_usd)),
            cost_since_best_usd=0.0,
        )
    state = replace(state, iteration=state.iteration + 1, ended=())
    if state.iteration > cfg.iterations:
        state = replace(state, phase=Phase.FINISHED, finished_reason="iterations done")
        return state, [*actions, Finish("iterations done")]
    return _propose_iteration(state, cfg, actions)


def _propose_iteration(
    state: ResearchState, cfg: ResearchConfig, actions: list[Action]
) -> tuple[ResearchState, list[Action]]:
    if state.iteration == 0:
        state = replace(state, iteration=1)
    picks = propose(
        cfg.axes, state.best, tried=state.tried, count=cfg.mutations, offset=(state.iteration - 1) * cfg.mutations
    )
    queue: list[ExperimentPlan] = []
    for axis, old, new in picks:
        plan = _plan(
            state, cfg, axis=axis.name, old=old, new=new, config=set_path(state.best, axis.name, new), seeds=cfg.seeds
        )
        queue.append(plan)
        state = replace(state, next_exp=state.next_exp + 1)
    return _launch(replace(state, queue=tuple(queue)), cfg, actions)


# -- plain JSON, so the driver can keep the state between tasks -------------------------------------
def dump_state(state: ResearchState) -> dict[str, Any]:
    """The state as JSON-ready data; `load_state(dump_state(s)) == s`."""
    return asdict(state)


def _plan_of(d: Mapping[str, Any]) -> ExperimentPlan:
    return ExperimentPlan(
        exp_id=str(d["exp_id"]),
        iteration=int(d["iteration"]),
        axis=d["axis"],
        old=d["old"],
        new=d["new"],
        config=dict(d["config"]),
        parent=dict(d["parent"]),
        seeds=tuple(int(s) for s in d["seeds"]),
        reserve_usd=float(d["reserve_usd"]),
    )


def _decided_of(d: Mapping[str, Any]) -> Decided:
    return Decided(
        exp_id=str(d["exp_id"]),
        axis=d["axis"],
        new=d["new"],
        mean=d["mean"],
        verdict=Verdict(d["verdict"]),
        cost_usd=float(d["cost_usd"]),
    )


def load_state(d: Mapping[str, Any]) -> ResearchState:
    return ResearchState(
        phase=Phase(d["phase"]),
        best=dict(d["best"]),
        best_mean=d["best_mean"],
        noise=d["noise"],
        iteration=int(d["iteration"]),
        next_exp=int(d["next_exp"]),
        queue=tuple(_plan_of(p) for p in d["queue"]),
        running=tuple(_plan_of(p) for p in d["running"]),
        ended=tuple(_decided_of(x) for x in d["ended"]),
        tried=tuple((str(a), str(v)) for a, v in d["tried"]),
        committed_usd=float(d["committed_usd"]),
        spent_usd=float(d["spent_usd"]),
        finished_reason=d["finished_reason"],
        accepted=tuple(_decided_of(x) for x in d["accepted"]),
        cost_since_best_usd=float(d["cost_since_best_usd"]),
        tier_tflops=d.get("tier_tflops"),
    )
