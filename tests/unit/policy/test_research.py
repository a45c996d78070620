"""The research policy: one-axis mutations of the best config, accepted only above the measured noise."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from app.policy.research import (
    Axis,
    AxisKind,
    Cancel,
    ExperimentEnded,
    Finish,
    Launch,
    NewBest,
    Phase,
    Record,
    ResearchConfig,
    ResearchState,
    Start,
    Stop,
    Verdict,
    decide,
    dump_state,
    get_path,
    load_state,
    mutate,
    new_state,
    noise_of,
    propose,
    set_path,
)

BASE: dict[str, Any] = {"learning_rate": 0.01, "warmup_steps": 2, "lora": {"r": 4}, "lr_schedule": "constant"}
LR = Axis("learning_rate", AxisKind.TIMES, (2.0, 0.5))
WARMUP = Axis("warmup_steps", AxisKind.PLUS, (2, -2), integer=True, minimum=0)
RANK = Axis("lora.r", AxisKind.TIMES, (2.0,), integer=True, maximum=16)
SCHED = Axis("lr_schedule", AxisKind.CHOICES, ("cosine", "constant"))


def _cfg(**kw: Any) -> ResearchConfig:
    args: dict[str, Any] = {
        "axes": (LR, WARMUP),
        "iterations": 2,
        "mutations": 2,
        "parallelism": 4,
        "baseline_seeds": (1, 2),
        "seeds": (1,),
        "budget_usd": 10.0,
        "reserve_usd": 1.0,
    }
    args.update(kw)
    return ResearchConfig(**args)


def _launches(actions: list[Any]) -> list[Launch]:
    return [a for a in actions if isinstance(a, Launch)]


def _end(exp_id: str, *values: float | None, cost: float = 0.5, tflops: float | None = None) -> ExperimentEnded:
    return ExperimentEnded(exp_id, dict(enumerate(values, 1)), cost_usd=cost, tflops=tflops)


def _baseline(cfg: ResearchConfig, a: float = 2.0, b: float = 2.02) -> tuple[ResearchState, list[Any]]:
    state, actions = decide(new_state(BASE), Start(), cfg)
    (base,) = _launches(actions)
    assert base.plan.axis is None and base.plan.seeds == (1, 2) and base.plan.reserve_usd == 2.0
    return decide(state, _end(base.plan.exp_id, a, b), cfg)


def test_paths_read_and_write_nested_fields_without_changing_the_original() -> None:
    """get_path/set_path address dotted fields; set_path copies and creates what is missing."""
    assert get_path(BASE, "lora.r") == 4 and get_path(BASE, "lora.alpha") is None and get_path(BASE, "x.y") is None
    out = set_path(BASE, "lora.r", 8)
    assert out["lora"] == {"r": 8} and BASE["lora"] == {"r": 4}
    assert set_path({}, "lora.dropout", 0.1) == {"lora": {"dropout": 0.1}}


def test_mutations_respect_kind_bounds_and_integers() -> None:
    """Multiplicative, additive and listed steps; integer axes round; out-of-bounds and no-op values are dropped."""
    assert mutate(LR, 0.01) == [0.02, 0.005]
    assert mutate(WARMUP, 0) == [2]  # -2 is under the minimum
    assert mutate(RANK, 8) == [16] and mutate(RANK, 16) == []  # 32 is over the maximum
    assert mutate(SCHED, "constant") == ["cosine"]
    assert mutate(LR, "fast") == [] and mutate(LR, True) == []  # not a number: nothing to multiply
    assert mutate(Axis("x", AxisKind.PLUS, (0, 1, 1)), 1) == [2]  # no-op and repeated values dropped


def test_propose_goes_round_robin_over_axes_and_skips_what_was_tried() -> None:
    """One change per axis in turn from `offset`, then second steps; tried values are skipped."""
    picks = propose((LR, WARMUP), BASE, tried=(), count=3, offset=1)
    assert [(a.name, v) for a, _, v in picks] == [("warmup_steps", 4), ("learning_rate", 0.02), ("warmup_steps", 0)]
    picks = propose((LR, WARMUP), BASE, tried=(("learning_rate", repr(0.02)),), count=10, offset=0)
    assert [(a.name, v) for a, _, v in picks] == [
        ("learning_rate", 0.005),
        ("warmup_steps", 4),
        ("warmup_steps", 0),
    ]


def test_noise_is_sigmas_times_the_spread_with_a_floor() -> None:
    """Two standard deviations of the repeated baseline, never below the floor."""
    assert math.isclose(noise_of([1.0, 1.2], sigmas=2.0, minimum=0.0), 2 * 0.1414213562, rel_tol=1e-6)
    assert noise_of([1.0, 1.0], sigmas=2.0, minimum=0.05) == 0.05
    assert noise_of([1.0], sigmas=2.0, minimum=0.01) == 0.01


def test_baseline_then_mutations_and_an_accepted_change_becomes_the_best() -> None:
    """Given a two-seed baseline, when a mutation beats it by more than the noise, then it is the new best."""
    cfg = _cfg()
    state, actions = _baseline(cfg)
    rec = next(a for a in actions if isinstance(a, Record))
    assert rec.verdict is Verdict.BASELINE and state.phase is Phase.SEARCHING
    assert any(isinstance(a, NewBest) for a in actions)
    muts = _launches(actions)
    assert [m.plan.axis for m in muts] == ["learning_rate", "warmup_steps"] and state.iteration == 1
    assert muts[0].plan.parent == BASE and muts[0].plan.config["learning_rate"] == 0.02
    state, actions = decide(state, _end(muts[0].plan.exp_id, 1.5), cfg)
    assert [a.verdict for a in actions if isinstance(a, Record)] == [Verdict.ACCEPTED]
    state, actions = decide(state, _end(muts[1].plan.exp_id, 2.0), cfg)
    verdicts = [a.verdict for a in actions if isinstance(a, Record)]
    best = next(a for a in actions if isinstance(a, NewBest))
    assert verdicts == [Verdict.REJECTED] and best.config["learning_rate"] == 0.02 and best.mean == 1.5
    assert best.found_for_usd == 0.5 + 0.5  # the experiments since the previous best (here: the baseline)
    assert state.best_mean == 1.5 and state.iteration == 2 and len(state.accepted) == 1
    assert all(m.plan.parent["learning_rate"] == 0.02 for m in _launches(actions))


def test_a_lucky_seed_within_the_noise_is_not_a_win() -> None:
    """A mutation whose gain is not larger than the noise is rejected."""
    cfg = _cfg(mutations=1)
    state, actions = _baseline(cfg, 2.0, 2.1)  # noise = 2 * 0.0707 = 0.1414
    (m,) = _launches(actions)
    state, actions = decide(state, _end(m.plan.exp_id, 1.95), cfg)  # gain 0.10 from the mean 2.05
    rec = next(a for a in actions if isinstance(a, Record))
    assert rec.verdict is Verdict.REJECTED and "<= noise" in rec.why
    assert state.best == BASE


def test_slow_host_is_flagged_and_may_be_proposed_again() -> None:
    """A mutation measured on a host below 85% of the tier's TFLOP/s is flagged slow, not counted, not marked tried."""
    cfg = _cfg(mutations=1, expected_tflops=10.0, iterations=3)
    state, actions = _baseline(cfg)
    (m,) = _launches(actions)
    state, actions = decide(state, _end(m.plan.exp_id, 1.0, tflops=5.0), cfg)
    rec = next(a for a in actions if isinstance(a, Record))
    assert rec.verdict is Verdict.SLOW and state.best == BASE and state.tried == ()
    (again,) = _launches(actions)
    assert again.plan.axis == m.plan.axis or again.plan.new != m.plan.new
    state, actions = decide(state, _end(again.plan.exp_id, 1.0, tflops=9.0), cfg)
    assert next(a for a in actions if isinstance(a, Record)).verdict is Verdict.ACCEPTED


def test_without_an_expected_speed_the_baselines_hosts_set_the_tier() -> None:
    """With no expected_tflops, a mutation on a host below 85% of what the baseline's hosts measured is slow."""
    cfg = _cfg(mutations=2)
    state, actions = decide(new_state(BASE), Start(), cfg)
    (base,) = _launches(actions)
    state, actions = decide(state, _end(base.plan.exp_id, 2.0, 2.01, tflops=70.0), cfg)
    assert state.tier_tflops == 70.0
    first, second = _launches(actions)
    state, actions = decide(state, _end(first.plan.exp_id, 1.0, tflops=50.0), cfg)
    assert next(a for a in actions if isinstance(a, Record)).verdict is Verdict.SLOW
    state, actions = decide(state, _end(second.plan.exp_id, 1.0, tflops=None), cfg)
    assert next(a for a in actions if isinstance(a, Record)).verdict is Verdict.ACCEPTED


def test_a_crashed_seed_fails_the_experiment() -> None:
    """A mutation missing a seed's metric (its job crashed) is failed, not compared."""
    cfg = _cfg(mutations=1, seeds=(1, 2), iterations=1)
    state, actions = _baseline(cfg)
    (m,) = _launches(actions)
    state, actions = decide(state, _end(m.plan.exp_id, 1.0, None), cfg)
    rec = next(a for a in actions if isinstance(a, Record))
    assert rec.verdict is Verdict.FAILED and actions[-1] == Finish("iterations done")
    assert state.phase is Phase.FINISHED
    assert decide(state, Start(), cfg) == (state, [])  # a finished run ignores everything


def test_baseline_without_two_metrics_ends_the_run() -> None:
    """Without two baseline metrics there is no noise floor: the run ends and says why."""
    cfg = _cfg()
    state, actions = decide(new_state(BASE), Start(), cfg)
    (base,) = _launches(actions)
    state, actions = decide(state, _end(base.plan.exp_id, 2.0, float("nan")), cfg)
    assert state.phase is Phase.FINISHED and isinstance(actions[-1], Finish) and "baseline failed" in actions[-1].reason
    assert next(a for a in actions if isinstance(a, Record)).verdict is Verdict.FAILED


def test_budget_caps_what_is_launched_and_ends_the_run_cleanly() -> None:
    """Only experiments whose reservation fits the budget left are launched; the run finishes when none fits."""
    cfg = _cfg(budget_usd=3.2, mutations=3)
    state, actions = _baseline(cfg)  # the baseline cost 0.5 -> 2.7 left: two launch, the third waits
    assert len(_launches(actions)) == 2 and len(state.queue) == 1 and state.committed_usd == 2.0
    first, second = _launches(actions)
    state, actions = decide(state, _end(first.plan.exp_id, 2.0, cost=1.0), cfg)
    assert _launches(actions) == []  # 3.2 - 1.0 (second, reserved) - 1.5 spent = 0.7 < 1.0
    state, actions = decide(state, _end(second.plan.exp_id, 2.0, cost=1.0), cfg)
    assert isinstance(actions[-1], Finish) and actions[-1].reason.startswith("budget")
    assert state.spent_usd == 2.5 <= cfg.budget_usd and state.committed_usd == 0.0


def test_parallelism_limits_experiments_in_flight() -> None:
    """At most `parallelism` experiments run at once; the rest start as others end."""
    cfg = _cfg(parallelism=1, mutations=2)
    state, actions = _baseline(cfg)
    (first,) = _launches(actions)
    state, actions = decide(state, _end(first.plan.exp_id, 2.0), cfg)
    (second,) = _launches(actions)
    assert second.plan.exp_id != first.plan.exp_id and len(state.running) == 1


def test_stop_cancels_what_is_in_flight() -> None:
    """A stop cancels every running experiment and finishes with the reason."""
    cfg = _cfg()
    state, actions = _baseline(cfg)
    state, actions = decide(state, Stop("operator"), cfg)
    assert [type(a) for a in actions] == [Cancel, Record, Cancel, Record, Finish] and state.phase is Phase.FINISHED
    assert {a.verdict for a in actions if isinstance(a, Record)} == {Verdict.CANCELLED}


def test_state_survives_a_round_trip_through_json() -> None:
    """dump_state/load_state keep every field, mid-iteration with plans, decisions and an accepted change."""
    import json

    cfg = _cfg(mutations=3, parallelism=1, iterations=3)
    state, actions = _baseline(cfg)
    (m,) = _launches(actions)
    state, actions = decide(state, _end(m.plan.exp_id, 1.0), cfg)
    for _ in range(2):
        (m,) = _launches(actions)
        state, actions = decide(state, _end(m.plan.exp_id, 2.0), cfg)
    assert state.accepted and state.running and state.tried == ()
    (m,) = _launches(actions)
    state, _ = decide(state, _end(m.plan.exp_id, 2.0), cfg)
    assert state.ended and state.tried and state.queue
    assert load_state(json.loads(json.dumps(dump_state(state)))) == state


def test_repeated_messages_change_nothing() -> None:
    """A second Start, or a result of an experiment not in flight, is ignored."""
    cfg = _cfg()
    state, _ = decide(new_state(BASE), Start(), cfg)
    assert decide(state, Start(), cfg) == (state, [])
    assert decide(state, _end("e999", 1.0), cfg) == (state, [])


def test_no_mutation_left_finishes_the_run() -> None:
    """When every axis is exhausted the run finishes instead of waiting."""
    cfg = _cfg(axes=(Axis("lr_schedule", AxisKind.CHOICES, ("constant",)),))
    state, actions = _baseline(cfg)
    assert actions[-1] == Finish("no mutation left") and state.phase is Phase.FINISHED


def test_negative_or_nan_cost_counts_as_nothing() -> None:
    """A cost that is not a finite positive number adds nothing to the spend."""
    cfg = _cfg()
    state, actions = decide(new_state(BASE), Start(), cfg)
    (base,) = _launches(actions)
    state, _ = decide(state, _end(base.plan.exp_id, 2.0, 2.01, cost=float("nan")), cfg)
    assert state.spent_usd == 0.0


@given(
    metrics=st.lists(st.floats(min_value=0.5, max_value=3.0, allow_nan=False), min_size=12, max_size=12),
    budget=st.floats(min_value=0.0, max_value=12.0),
    costs=st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=12, max_size=12),
)
def test_property_spend_and_reservations_never_exceed_the_budget(
    metrics: list[float], budget: float, costs: list[float]
) -> None:
    """Whatever the results, what is reserved plus spent stays within the budget, and only improvements
    larger than the noise ever become the best."""
    cfg = _cfg(budget_usd=budget, iterations=3, parallelism=2)
    state, actions = decide(new_state(BASE), Start(), cfg)
    pending = _launches(actions)
    i = 0
    while pending and state.phase is not Phase.FINISHED and i < 12:
        plan = pending.pop(0).plan
        before = state.best_mean
        values = [metrics[(i + k) % 12] for k in range(len(plan.seeds))]
        state, actions = decide(state, _end(plan.exp_id, *values, cost=min(costs[i], plan.reserve_usd)), cfg)
        assert state.committed_usd + state.spent_usd <= budget + 1e-9
        for a in actions:
            if isinstance(a, NewBest) and before is not None:
                assert state.noise is not None and before - a.mean > state.noise
        pending += _launches(actions)
        i += 1
