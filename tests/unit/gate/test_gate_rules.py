"""The deploy gate's seven rules and its metrics (app.policy.gate_rules), on rows in memory."""

from __future__ import annotations

import random
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from app.policy.gate_rules import (
    GateConfig,
    OodFloor,
    Row,
    Trial,
    judge,
    missed_share,
    score,
)

LABELS = ("oom", "nan", "ok")


def rows(spec: str, *, slice_: str = "heldout", prefix: str = "h") -> tuple[Row, ...]:
    """Rows from 'expected>predicted' pairs separated by spaces; 'ok' alone means ok>ok."""
    out = []
    for i, pair in enumerate(spec.split()):
        exp, _, pred = pair.partition(">")
        out.append(Row(f"{prefix}{i}", slice_, exp, pred or exp))
    return tuple(out)


HELD_PERFECT = rows("oom nan ok ok")  # 4 held-out rows, all right
HELD_3_OF_4 = rows("oom>ok nan ok ok")
HELD_2_OF_4 = rows("oom>ok nan>ok ok ok")


def trial(
    candidates: dict[str, tuple[Row, ...]],
    *,
    baseline: tuple[Row, ...] = HELD_2_OF_4,
    incumbent: tuple[Row, ...] | None = None,
    **cfg: object,
) -> Trial:
    config = GateConfig(metric=cfg.pop("metric", "accuracy"), **cfg)  # type: ignore[arg-type]
    return Trial(config=config, baseline=baseline, candidates=candidates, incumbent=incumbent)


def codes(t: Trial) -> list[str]:
    return [f.code for f in judge(t).reasons]


def test_two_good_seeds_promote() -> None:
    """Two seeds, both above the baseline, nothing else configured: promote, no reasons."""
    v = judge(trial({"1": HELD_PERFECT, "2": HELD_3_OF_4}))
    assert v.decision == "promote" and v.reasons == () and v.warnings == ()
    assert v.scores["candidate"]["worst"]["heldout"] == 0.75
    assert v.scores["candidate"]["worst_seed"]["heldout"] == "2"


def test_rule1_one_seed_is_refused_as_seeds_missing() -> None:
    """A single candidate seed is refused with seeds_missing even when it is perfect."""
    assert codes(trial({"1": HELD_PERFECT})) == ["seeds_missing"]


def test_rule1_no_seed_at_all_is_refused() -> None:
    """No candidate file at all: seeds_missing and not_above_baseline (nothing to score)."""
    assert codes(trial({})) == ["seeds_missing", "not_above_baseline"]


def test_rule2_candidate_missing_an_id_another_candidate_has() -> None:
    """A seed that lacks an id present in another seed's file is incomplete."""
    v = judge(trial({"1": HELD_PERFECT, "2": HELD_PERFECT[:3]}))
    assert [f.code for f in v.reasons] == ["incomplete_predictions"]
    assert "seed 2" in v.reasons[0].detail and "h3" in v.reasons[0].detail


def test_rule2_candidate_missing_a_baseline_heldout_id() -> None:
    """Both seeds lack a held-out id that the baseline predicted: incomplete."""
    extra = (*HELD_2_OF_4, Row("h9", "heldout", "ok", "ok"))
    assert "incomplete_predictions" in codes(trial({"1": HELD_PERFECT, "2": HELD_PERFECT}, baseline=extra))


def test_rule2_baseline_only_ood_or_canary_ids_do_not_count() -> None:
    """Ids the baseline has outside held-out are not required of candidates."""
    base = (*HELD_2_OF_4, Row("o1", "ood:forum", "ok", "ok"), Row("c1", "canary", "ok", "nan"))
    assert codes(trial({"1": HELD_PERFECT, "2": HELD_PERFECT}, baseline=base)) == []


def test_rule3_worst_seed_is_what_counts() -> None:
    """A great seed does not rescue a seed that only ties the baseline."""
    v = judge(trial({"1": HELD_PERFECT, "2": HELD_2_OF_4}))
    assert [f.code for f in v.reasons] == ["not_above_baseline"]
    assert "worst seed 2" in v.reasons[0].detail


def test_rule3_tie_with_baseline_is_refused() -> None:
    """Equal to the baseline is not above it."""
    assert codes(trial({"1": HELD_3_OF_4, "2": HELD_3_OF_4}, baseline=HELD_3_OF_4)) == ["not_above_baseline"]


def test_rule3_margin_is_exact_decimal_arithmetic() -> None:
    """0.75 > 0.5 + 0.25 is false (a tie, refused) and 0.75 > 0.5 + 0.2499 is true, with no float slop."""
    tie = trial({"1": HELD_3_OF_4, "2": HELD_3_OF_4}, min_margin=Fraction("0.25"))
    above = trial({"1": HELD_3_OF_4, "2": HELD_3_OF_4}, min_margin=Fraction("0.2499"))
    assert codes(tie) == ["not_above_baseline"]
    assert codes(above) == []


def test_rule3_tenths_do_not_suffer_float_rounding() -> None:
    """8/10 vs 7/10 + 1/10 is a tie (refused) although in floats 0.7 + 0.1 < 0.8 would promote it."""
    cand = rows("ok ok ok ok ok ok ok ok nan>ok nan>ok")
    base = rows("ok ok ok ok ok ok ok nan>ok nan>ok nan>ok")
    assert 0.7 + 0.1 < 0.8
    assert codes(trial({"1": cand, "2": cand}, baseline=base, min_margin=Fraction("0.1"))) == ["not_above_baseline"]


def test_rule4_below_incumbent_is_refused_and_tie_passes() -> None:
    """Worst seed under the incumbent is refused; equal to it passes."""
    cands = {"1": HELD_3_OF_4, "2": HELD_PERFECT}
    assert codes(trial(cands, incumbent=HELD_PERFECT)) == ["below_incumbent"]
    assert codes(trial(cands, incumbent=HELD_3_OF_4)) == []


def test_rule4_without_incumbent_nothing_to_compare() -> None:
    """No incumbent file: the rule adds nothing and scores say incumbent is null."""
    v = judge(trial({"1": HELD_3_OF_4, "2": HELD_PERFECT}))
    assert v.scores["incumbent"] is None and v.reasons == ()


def test_rule5_one_canary_wrong_in_one_seed_fails_with_its_id() -> None:
    """A canary wrong in one seed refuses, and the detail names the canary id."""
    good = (*HELD_PERFECT, *rows("oom nan", slice_="canary", prefix="c"))
    bad = (*HELD_PERFECT, *rows("oom nan>ok", slice_="canary", prefix="c"))
    v = judge(trial({"1": good, "2": bad}))
    assert [f.code for f in v.reasons] == ["canary_failed"]
    assert "c1" in v.reasons[0].detail and "c0" not in v.reasons[0].detail


def test_rule5_canaries_are_exact_even_under_macro_f1() -> None:
    """A high macro F1 on canaries does not excuse a single wrong canary."""
    canaries = rows(" ".join(["ok"] * 50 + ["oom>ok"]), slice_="canary", prefix="c")
    both = (*HELD_PERFECT, *canaries)
    assert codes(trial({"1": both, "2": both}, metric="macro_f1")) == ["canary_failed"]


def test_rule5_baseline_may_miss_canaries() -> None:
    """Canaries are checked on the candidate only."""
    cand = (*HELD_PERFECT, *rows("oom", slice_="canary", prefix="c"))
    base = (*HELD_2_OF_4, *rows("oom>ok", slice_="canary", prefix="c"))
    assert codes(trial({"1": cand, "2": cand}, baseline=base)) == []


def test_rule5_absent_canary_counts_as_failed() -> None:
    """A canary missing from one seed's file fails that canary (and is incomplete)."""
    with_c = (*HELD_PERFECT, *rows("oom", slice_="canary", prefix="c"))
    assert codes(trial({"1": with_c, "2": HELD_PERFECT})) == ["incomplete_predictions", "canary_failed"]


def test_rule6_blocking_ood_floor_refuses_on_worst_seed() -> None:
    """An OOD slice whose worst seed is below a blocking floor refuses."""
    ood_ok = rows("ok ok", slice_="ood:forum", prefix="o")
    ood_half = rows("ok ok>nan", slice_="ood:forum", prefix="o")
    cfg = {"ood": {"forum": OodFloor(Fraction("0.6"))}}
    v = judge(trial({"1": (*HELD_PERFECT, *ood_ok), "2": (*HELD_PERFECT, *ood_half)}, **cfg))
    assert [f.code for f in v.reasons] == ["ood_below_floor"]
    assert v.scores["ood"]["forum"] == {"floor": 0.6, "blocking": True, "worst": 0.5, "worst_seed": "2"}


def test_rule6_floor_reached_exactly_passes() -> None:
    """A worst OOD score equal to the floor is not below it."""
    ood_half = rows("ok ok>nan", slice_="ood:forum", prefix="o")
    cands = {"1": (*HELD_PERFECT, *ood_half), "2": (*HELD_PERFECT, *ood_half)}
    assert codes(trial(cands, ood={"forum": OodFloor(Fraction("0.5"))})) == []


def test_rule6_advisory_floor_only_warns() -> None:
    """An advisory OOD floor adds a warning, not a reason: the candidate is promoted."""
    ood_bad = rows("ok>nan ok>nan", slice_="ood:forum", prefix="o")
    cands = {"1": (*HELD_PERFECT, *ood_bad), "2": (*HELD_PERFECT, *ood_bad)}
    v = judge(trial(cands, ood={"forum": OodFloor(Fraction("0.9"), blocking=False)}))
    assert v.decision == "promote"
    assert [w.code for w in v.warnings] == ["ood_advisory_below_floor"]


def test_rule6_configured_slice_with_no_rows_is_below_floor() -> None:
    """A floor on a slice nobody predicted cannot be met."""
    v = judge(trial({"1": HELD_PERFECT, "2": HELD_PERFECT}, ood={"chat": OodFloor(Fraction("0.1"))}))
    assert [f.code for f in v.reasons] == ["ood_below_floor"]


def test_rule7_missed_critical_share_above_max_refuses() -> None:
    """One of two critical 'oom' rows missed (0.5) against max 0.25 refuses."""
    cand = rows("oom oom>ok ok ok ok ok ok ok")
    base = rows("oom>ok oom>ok ok ok ok ok ok>nan ok>nan")
    v = judge(
        trial({"1": cand, "2": cand}, baseline=base, critical_labels=frozenset({"oom"}), max_missed=Fraction("0.25"))
    )
    assert [f.code for f in v.reasons] == ["missed_above_max"]
    assert v.scores["critical_missed"]["worst"] == 0.5


def test_rule7_missed_share_at_max_passes() -> None:
    """Missed share exactly at max_missed passes."""
    cand = rows("oom oom>ok ok ok ok ok ok ok")
    base = rows("oom>ok oom>ok ok ok ok ok ok>nan ok>nan")
    t = trial({"1": cand, "2": cand}, baseline=base, critical_labels=frozenset({"oom"}), max_missed=Fraction("0.5"))
    assert codes(t) == []


def test_every_rule_is_evaluated_none_stops_the_others() -> None:
    """One bad trial collects every reason in rule order."""
    canary_bad = rows("oom>ok", slice_="canary", prefix="c")
    ood_bad = rows("ok>nan", slice_="ood:forum", prefix="o")
    seed = (*HELD_2_OF_4, *canary_bad, *ood_bad)
    t = trial(
        {"1": seed},
        baseline=(*HELD_3_OF_4, Row("h9", "heldout", "ok", "ok")),
        incumbent=HELD_PERFECT,
        ood={"forum": OodFloor(Fraction("0.5"))},
        critical_labels=frozenset({"oom"}),
        max_missed=Fraction(0),
    )
    assert codes(t) == [
        "seeds_missing",
        "incomplete_predictions",
        "not_above_baseline",
        "below_incumbent",
        "canary_failed",
        "ood_below_floor",
        "missed_above_max",
    ]


def test_accuracy_is_the_exact_share() -> None:
    """Accuracy is correct rows over rows, exactly."""
    assert score(HELD_3_OF_4, "accuracy") == Fraction(3, 4)
    assert score((), "accuracy") is None


def test_macro_f1_averages_over_expected_labels_only() -> None:
    """Macro F1 averages F1 over labels present in expected values; a predicted-only label adds nothing."""
    # expected: a a b ; predicted: a b c -> F1(a) = 2/(2+0+1) = 2/3, F1(b) = 0/(0+1+1) = 0
    r = (Row("1", "heldout", "a", "a"), Row("2", "heldout", "a", "b"), Row("3", "heldout", "b", "c"))
    assert score(r, "macro_f1") == Fraction(1, 3)


def test_macro_f1_perfect_is_one() -> None:
    """All correct is macro F1 1."""
    assert score(HELD_PERFECT, "macro_f1") == 1


def test_missed_share_counts_only_heldout_critical_rows() -> None:
    """Critical rows outside held-out do not count; no critical rows means nothing missed."""
    r = (*rows("oom>ok ok"), *rows("oom>ok", slice_="canary", prefix="c"))
    assert missed_share(r, frozenset({"oom"})) == 1
    assert missed_share(rows("ok ok"), frozenset({"oom"})) == 0


# --- properties ---------------------------------------------------------------------------

row_sets = st.lists(st.tuples(st.sampled_from(LABELS), st.sampled_from(LABELS)), min_size=1, max_size=12)


def seed_rows(pairs: list[tuple[str, str]], *, n_ood: int = 2) -> tuple[Row, ...]:
    held = [Row(f"h{i}", "heldout", e, p) for i, (e, p) in enumerate(pairs)]
    ood = [Row(f"o{i}", "ood:x", e, p) for i, (e, p) in enumerate(pairs[:n_ood])]
    return (*held, *ood)


def same_ids(expected: list[str], preds: list[str]) -> list[tuple[str, str]]:
    return list(zip(expected, preds, strict=True))


@st.composite
def seeds_sharing_ids(draw: st.DrawFn, n_min: int = 1, n_max: int = 3) -> list[tuple[Row, ...]]:
    expected = draw(st.lists(st.sampled_from(LABELS), min_size=1, max_size=10))
    n = draw(st.integers(n_min, n_max))
    out = []
    for _ in range(n):
        preds = draw(st.lists(st.sampled_from(LABELS), min_size=len(expected), max_size=len(expected)))
        out.append(seed_rows(same_ids(expected, preds)))
    return out


@settings(max_examples=150, deadline=None)
@given(seeds=seeds_sharing_ids(), extra_preds=st.data(), metric=st.sampled_from(["accuracy", "macro_f1"]))
def test_adding_a_seed_never_raises_the_candidate_score(
    seeds: list[tuple[Row, ...]], extra_preds: st.DataObject, metric: str
) -> None:
    """The worst-seed score (held-out and OOD) with one more seed is never higher; missed never lower."""
    expected = [r.expected for r in seeds[0] if r.slice == "heldout"]
    preds = extra_preds.draw(st.lists(st.sampled_from(LABELS), min_size=len(expected), max_size=len(expected)))
    extra = seed_rows(same_ids(expected, preds))
    base = tuple(Row(r.id, r.slice, r.expected, "ok") for r in seeds[0])
    cfg = {"metric": metric, "critical_labels": frozenset({"oom"}), "max_missed": Fraction(0)}
    before = judge(trial({str(i): s for i, s in enumerate(seeds)}, baseline=base, **cfg)).scores
    after = judge(trial({**{str(i): s for i, s in enumerate(seeds)}, "new": extra}, baseline=base, **cfg)).scores
    for sl in ("heldout", "ood:x"):
        assert after["candidate"]["worst"][sl] <= before["candidate"]["worst"][sl]
    assert after["critical_missed"]["worst"] >= before["critical_missed"]["worst"]


@settings(max_examples=100, deadline=None)
@given(
    seeds=seeds_sharing_ids(n_min=1, n_max=3),
    shuffle_seed=st.integers(0, 2**32 - 1),
    metric=st.sampled_from(["accuracy", "macro_f1"]),
)
def test_decision_does_not_depend_on_row_order(seeds: list[tuple[Row, ...]], shuffle_seed: int, metric: str) -> None:
    """Shuffling the rows of every file (and the seeds' order) changes nothing in the verdict."""
    rng = random.Random(shuffle_seed)
    base = tuple(Row(r.id, r.slice, r.expected, "nan") for r in seeds[0])
    cfg = {
        "metric": metric,
        "ood": {"x": OodFloor(Fraction("0.5"))},
        "critical_labels": frozenset({"oom"}),
        "max_missed": Fraction("0.3"),
    }
    ordered = judge(trial({str(i): s for i, s in enumerate(seeds)}, baseline=base, **cfg))

    def shuffled(rs: tuple[Row, ...]) -> tuple[Row, ...]:
        out = list(rs)
        rng.shuffle(out)
        return tuple(out)

    keys = [str(i) for i in range(len(seeds))]
    rng.shuffle(keys)
    again = judge(trial({k: shuffled(seeds[int(k)]) for k in keys}, baseline=shuffled(base), **cfg))
    assert again.as_dict() == ordered.as_dict()
