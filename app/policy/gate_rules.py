"""The deploy gate's rules: promote or refuse a candidate from its predictions. Pure, stdlib only.

A trial holds the gate's configuration, the baseline's predictions, optionally the incumbent's,
and one prediction set per candidate training seed. `judge(trial)` evaluates all eight rules
(none stops the others) and returns a `Verdict`: promote only when no rule adds a reason.

1. fewer than two candidate seeds                                   -> `seeds_missing`
2. a candidate lacks an id another candidate has, or a held-out id
   the baseline has                                                  -> `incomplete_predictions`
3. worst seed's held-out score <= baseline's + min_margin (tie refused) -> `not_above_baseline`
4. with an incumbent: worst seed's held-out score < incumbent's       -> `below_incumbent`
5. a canary row wrong (or absent) in any candidate seed               -> `canary_failed`
6. an OOD slice's worst-seed score below its floor: blocking          -> `ood_below_floor`
                                                     advisory         -> warning `ood_advisory_below_floor`
7. with critical labels: worst seed's missed share above max_missed   -> `missed_above_max`
8. fewer distinct canary ids than min_canaries                       -> `canaries_too_few`
   (a gate file asks for DEFAULT_MIN_CANARIES unless it says a lower number on purpose)

All arithmetic is exact (`fractions.Fraction`): a tie is a tie, never a rounding accident, and
the result does not depend on the order of rows or seeds. Scores are turned into floats only in
the JSON-ready `scores` mapping.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal

__all__ = [
    "CANARY",
    "DEFAULT_MIN_CANARIES",
    "HELDOUT",
    "METRICS",
    "OOD_PREFIX",
    "Decision",
    "Finding",
    "GateConfig",
    "Metric",
    "OodFloor",
    "Row",
    "Trial",
    "Verdict",
    "exact",
    "judge",
    "missed_share",
    "score",
    "seed_order",
    "worst_score",
]

Metric = Literal["accuracy", "macro_f1"]
Decision = Literal["promote", "refuse"]
METRICS: tuple[Metric, ...] = ("accuracy", "macro_f1")
HELDOUT = "heldout"
CANARY = "canary"
OOD_PREFIX = "ood:"
_MAX_IDS_IN_DETAIL = 20
# Canaries a gate file asks for unless it states `min_canaries` lower: one or two canaries prove
# little about a model that must never get them wrong.
DEFAULT_MIN_CANARIES = 10


@dataclass(frozen=True, slots=True)
class Row:
    """One prediction: the example's id, its slice, the expected and the predicted label."""

    id: str
    slice: str
    expected: str
    predicted: str


@dataclass(frozen=True, slots=True)
class OodFloor:
    """The floor an out-of-distribution slice must reach; advisory floors only warn."""

    floor: Fraction
    blocking: bool = True


@dataclass(frozen=True, slots=True)
class GateConfig:
    """The contents of gate.json that the rules use."""

    metric: Metric
    min_margin: Fraction = Fraction(0)
    ood: Mapping[str, OodFloor] = field(default_factory=dict)
    critical_labels: frozenset[str] = frozenset()
    max_missed: Fraction | None = None
    min_canaries: int = 0  # the gate file's parser fills in DEFAULT_MIN_CANARIES


@dataclass(frozen=True, slots=True)
class Trial:
    """Everything the judge sees: configuration and prediction sets (candidates keyed by seed)."""

    config: GateConfig
    baseline: tuple[Row, ...]
    candidates: Mapping[str, tuple[Row, ...]]
    incumbent: tuple[Row, ...] | None = None


@dataclass(frozen=True, slots=True)
class Finding:
    """A reason for refusal or a warning: a stable code and a sentence for people."""

    code: str
    detail: str

    def as_dict(self) -> dict[str, str]:
        return {"code": self.code, "detail": self.detail}


@dataclass(frozen=True, slots=True)
class Verdict:
    """The gate's decision, every reason and warning in rule order, and JSON-ready scores."""

    decision: Decision
    reasons: tuple[Finding, ...]
    warnings: tuple[Finding, ...]
    scores: Mapping[str, Any]

    @property
    def promoted(self) -> bool:
        return self.decision == "promote"

    def as_dict(self) -> dict[str, Any]:
        return {
            "decision": self.decision,
            "reasons": [f.as_dict() for f in self.reasons],
            "warnings": [f.as_dict() for f in self.warnings],
            "scores": dict(self.scores),
        }


def exact(value: float | int | str) -> Fraction:
    """The decimal a person wrote (0.1 -> 1/10), not the binary float nearest to it."""
    if isinstance(value, bool):
        raise TypeError("a bool is not a number")
    if isinstance(value, float):
        return Fraction(repr(value))
    return Fraction(value)


def seed_order(seed: str) -> tuple[int, int, str]:
    """Sort key for seeds: numbers numerically first, then other names alphabetically."""
    return (0, int(seed), "") if seed.isdigit() else (1, 0, seed)


def score(rows: Iterable[Row], metric: Metric) -> Fraction | None:
    """The metric over `rows`; None when there are no rows to score.

    accuracy: the share of rows predicted exactly. macro_f1: the unweighted mean of per-label F1
    (2TP / (2TP + FP + FN)) over the labels occurring in the rows' expected values.
    """
    rows = list(rows)
    if not rows:
        return None
    if metric == "accuracy":
        return Fraction(sum(1 for r in rows if r.predicted == r.expected), len(rows))
    labels = {r.expected for r in rows}
    tp: Counter[str] = Counter()
    fp: Counter[str] = Counter()
    fn: Counter[str] = Counter()
    for r in rows:
        if r.predicted == r.expected:
            tp[r.expected] += 1
        else:
            fn[r.expected] += 1
            fp[r.predicted] += 1
    total = sum((Fraction(2 * tp[lab], 2 * tp[lab] + fp[lab] + fn[lab]) for lab in labels), Fraction(0))
    return total / len(labels)


def missed_share(rows: Iterable[Row], critical_labels: frozenset[str]) -> Fraction:
    """Among held-out rows whose expected label is critical, the share predicted otherwise (0 if none)."""
    critical = [r for r in rows if r.slice == HELDOUT and r.expected in critical_labels]
    if not critical:
        return Fraction(0)
    return Fraction(sum(1 for r in critical if r.predicted != r.expected), len(critical))


def worst_score(per_seed: Mapping[str, Fraction | None]) -> tuple[str | None, Fraction | None]:
    """The lowest score and its seed (first in seed order on a tie); None when a seed has none."""
    if not per_seed:
        return None, None
    worst_seed: str | None = None
    worst: Fraction | None = None
    for seed in sorted(per_seed, key=seed_order):
        value = per_seed[seed]
        if value is None:
            return seed, None
        if worst is None or value < worst:
            worst_seed, worst = seed, value
    return worst_seed, worst


def _slice_rows(rows: Iterable[Row], slice_name: str) -> list[Row]:
    return [r for r in rows if r.slice == slice_name]


def _slices(rows: Iterable[Row]) -> list[str]:
    return sorted({r.slice for r in rows}, key=_slice_order)


def _slice_order(name: str) -> tuple[int, str]:
    return ({HELDOUT: 0, CANARY: 1}.get(name, 2), name)


def _f(value: Fraction | None) -> float | None:
    return None if value is None else float(value)


def _fmt(value: Fraction | None) -> str:
    return "none" if value is None else f"{float(value):.4f}"


def _ids(ids: Iterable[str]) -> str:
    ordered = sorted(ids)
    shown = ", ".join(ordered[:_MAX_IDS_IN_DETAIL])
    more = len(ordered) - _MAX_IDS_IN_DETAIL
    return shown + (f" and {more} more" if more > 0 else "")


def _scores_by_slice(rows: Sequence[Row], metric: Metric) -> dict[str, Fraction | None]:
    return {s: score(_slice_rows(rows, s), metric) for s in _slices(rows)}


def judge(trial: Trial) -> Verdict:
    """Evaluate every rule on `trial`; promote only when none adds a reason."""
    cfg = trial.config
    metric = cfg.metric
    seeds = sorted(trial.candidates, key=seed_order)
    cands = {s: trial.candidates[s] for s in seeds}
    reasons: list[Finding] = []
    warnings: list[Finding] = []

    all_candidate_rows = [r for s in seeds for r in cands[s]]
    cand_slices = _slices(all_candidate_rows)
    per_seed = {s: {sl: score(_slice_rows(cands[s], sl), metric) for sl in cand_slices} for s in seeds}

    def worst_of(slice_name: str) -> tuple[str | None, Fraction | None]:
        return worst_score({s: score(_slice_rows(cands[s], slice_name), metric) for s in seeds})

    baseline_scores = _scores_by_slice(trial.baseline, metric)
    incumbent_scores = None if trial.incumbent is None else _scores_by_slice(trial.incumbent, metric)

    # 1. Two seeds at least.
    if len(seeds) < 2:
        found = ", ".join(seeds) if seeds else "none"
        reasons.append(Finding("seeds_missing", f"{len(seeds)} candidate seed(s) ({found}); the gate needs at least 2"))

    # 2. Every candidate predicts every id any candidate has, and every held-out id of the baseline.
    wanted = {r.id for r in all_candidate_rows} | {r.id for r in trial.baseline if r.slice == HELDOUT}
    gaps = []
    for s in seeds:
        missing = wanted - {r.id for r in cands[s]}
        if missing:
            gaps.append(f"seed {s} lacks {len(missing)} id(s): {_ids(missing)}")
    if gaps:
        reasons.append(Finding("incomplete_predictions", "; ".join(gaps)))

    # 3. Worst seed strictly above the baseline plus the margin on held-out.
    worst_seed, worst_heldout = worst_of(HELDOUT)
    base_heldout = baseline_scores.get(HELDOUT)
    if worst_heldout is None or base_heldout is None or not worst_heldout > base_heldout + cfg.min_margin:
        if worst_heldout is None:
            who = f"seed {worst_seed} has" if worst_seed is not None else "no candidate has"
            detail = f"{who} no held-out rows to score"
        elif base_heldout is None:
            detail = "the baseline has no held-out rows to beat"
        else:
            detail = (
                f"worst seed {worst_seed} scores {_fmt(worst_heldout)} {metric} on held-out; it must "
                f"exceed baseline {_fmt(base_heldout)} + margin {_fmt(cfg.min_margin)} "
                f"= {_fmt(base_heldout + cfg.min_margin)} (a tie is refused)"
            )
        reasons.append(Finding("not_above_baseline", detail))

    # 4. Not below the incumbent (a tie passes).
    if incumbent_scores is not None:
        inc_heldout = incumbent_scores.get(HELDOUT)
        if worst_heldout is None or inc_heldout is None or worst_heldout < inc_heldout:
            if worst_heldout is None:
                detail = "the candidate has no worst-seed held-out score to compare"
            elif inc_heldout is None:
                detail = "the incumbent has no held-out rows to compare against"
            else:
                detail = (
                    f"worst seed {worst_seed} scores {_fmt(worst_heldout)} {metric} on held-out, "
                    f"below the incumbent's {_fmt(inc_heldout)}"
                )
            reasons.append(Finding("below_incumbent", detail))

    # 5. Canaries exact in every seed (an absent canary row counts as failed).
    canary_ids = {r.id for r in all_candidate_rows if r.slice == CANARY}
    failing_by_seed: dict[str, set[str]] = {}
    for s in seeds:
        by_id = {r.id: r for r in cands[s]}
        bad = {i for i in canary_ids if i not in by_id or by_id[i].predicted != by_id[i].expected}
        if bad:
            failing_by_seed[s] = bad
    if failing_by_seed:
        every = set().union(*failing_by_seed.values())
        per = "; ".join(f"seed {s}: {_ids(b)}" for s, b in failing_by_seed.items())
        reasons.append(Finding("canary_failed", f"failing canary ids: {_ids(every)} ({per})"))

    # 6. OOD floors, worst seed per slice.
    ood_report: dict[str, Any] = {}
    for name in sorted(cfg.ood):
        spec = cfg.ood[name]
        slice_name = OOD_PREFIX + name
        o_seed, o_worst = worst_of(slice_name)
        ood_report[name] = {
            "floor": float(spec.floor),
            "blocking": spec.blocking,
            "worst": _f(o_worst),
            "worst_seed": o_seed,
        }
        if o_worst is None or o_worst < spec.floor:
            if o_worst is None:
                detail = (
                    f"{slice_name}: seed {o_seed} has no rows in this slice"
                    if o_seed is not None
                    else f"{slice_name}: no candidate rows in this slice"
                )
            else:
                detail = (
                    f"{slice_name}: worst seed {o_seed} scores {_fmt(o_worst)} {metric}, "
                    f"below the floor {_fmt(spec.floor)}"
                )
            if spec.blocking:
                reasons.append(Finding("ood_below_floor", detail))
            else:
                warnings.append(Finding("ood_advisory_below_floor", detail))

    # 7. Critical labels: the worst seed's missed share at most max_missed.
    missed_report: dict[str, Any] | None = None
    if cfg.critical_labels:
        limit = cfg.max_missed if cfg.max_missed is not None else Fraction(0)
        missed = {s: missed_share(cands[s], cfg.critical_labels) for s in seeds}
        # The worst seed misses the most; on a tie, the first in seed order.
        m_seed = next((s for s in seeds if missed[s] == max(missed.values())), None)
        m_worst = missed[m_seed] if m_seed is not None else None
        missed_report = {
            "labels": sorted(cfg.critical_labels),
            "max": float(limit),
            "seeds": {s: float(missed[s]) for s in seeds},
            "worst": _f(m_worst),
            "worst_seed": m_seed,
        }
        if m_worst is not None and m_worst > limit:
            reasons.append(
                Finding(
                    "missed_above_max",
                    f"worst seed {m_seed} misses {_fmt(m_worst)} of held-out rows labelled "
                    f"{', '.join(sorted(cfg.critical_labels))}; at most {_fmt(limit)} allowed",
                )
            )

    # 8. Enough canaries to mean something (ids in any prediction file).
    every_canary = canary_ids | {r.id for r in trial.baseline if r.slice == CANARY}
    if len(every_canary) < cfg.min_canaries:
        reasons.append(
            Finding(
                "canaries_too_few",
                f"{len(every_canary)} canary row(s); the gate needs at least {cfg.min_canaries}. Fix: add "
                "canaries, or set min_canaries lower in the gate file on purpose",
            )
        )

    worst_by_slice = {sl: worst_of(sl) for sl in cand_slices}
    scores: dict[str, Any] = {
        "metric": metric,
        "min_margin": float(cfg.min_margin),
        "candidate": {
            "seeds": {s: {sl: _f(v) for sl, v in per_seed[s].items()} for s in seeds},
            "worst": {sl: _f(w) for sl, (_, w) in worst_by_slice.items()},
            "worst_seed": {sl: ws for sl, (ws, _) in worst_by_slice.items()},
            "rows": {sl: len({r.id for r in all_candidate_rows if r.slice == sl}) for sl in cand_slices},
        },
        "baseline": {sl: _f(v) for sl, v in baseline_scores.items()},
        "incumbent": None if incumbent_scores is None else {sl: _f(v) for sl, v in incumbent_scores.items()},
        "ood": ood_report,
        "critical_missed": missed_report,
    }
    return Verdict(
        decision="refuse" if reasons else "promote",
        reasons=tuple(reasons),
        warnings=tuple(warnings),
        scores=scores,
    )
