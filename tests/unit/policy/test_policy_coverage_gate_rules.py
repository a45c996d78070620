"""Gate rules the main tests leave undriven: missing held-out scores on either side, and exact numbers."""

from __future__ import annotations

from fractions import Fraction

import pytest

from app.policy.gate_rules import GateConfig, Row, Trial, Verdict, exact, judge

CFG = GateConfig(metric="accuracy")
HELD = (Row("h0", "heldout", "ok", "ok"), Row("h1", "heldout", "nan", "nan"))
HELD_HALF = (Row("h0", "heldout", "ok", "ok"), Row("h1", "heldout", "nan", "ok"))
CANARY_ONLY = (Row("c0", "canary", "ok", "ok"),)


def details(v: Verdict, code: str) -> list[str]:
    return [f.detail for f in v.reasons if f.code == code]


def test_a_promoting_verdict_says_promoted_and_a_refusing_one_does_not() -> None:
    """`promoted` is true exactly when the decision is promote."""
    good = judge(Trial(CFG, baseline=HELD_HALF, candidates={"1": HELD, "2": HELD}))
    assert good.decision == "promote" and good.promoted
    bad = judge(Trial(CFG, baseline=HELD_HALF, candidates={"1": HELD}))
    assert bad.decision == "refuse" and not bad.promoted


def test_a_baseline_without_held_out_rows_cannot_be_beaten() -> None:
    """A baseline that scored no held-out row refuses the candidate: there is nothing to be above."""
    v = judge(Trial(CFG, baseline=CANARY_ONLY, candidates={"1": (*HELD, *CANARY_ONLY), "2": (*HELD, *CANARY_ONLY)}))
    assert details(v, "not_above_baseline") == ["the baseline has no held-out rows to beat"]


def test_a_candidate_without_held_out_rows_is_below_any_incumbent() -> None:
    """Against an incumbent, a candidate with no held-out score is refused as below it."""
    v = judge(Trial(CFG, baseline=(), candidates={"1": CANARY_ONLY, "2": CANARY_ONLY}, incumbent=HELD))
    assert details(v, "below_incumbent") == ["the candidate has no worst-seed held-out score to compare"]


def test_an_incumbent_without_held_out_rows_refuses_the_comparison() -> None:
    """An incumbent that scored no held-out row cannot be compared with: refused, named as the incumbent's gap."""
    v = judge(Trial(CFG, baseline=HELD_HALF, candidates={"1": HELD, "2": HELD}, incumbent=CANARY_ONLY))
    assert [f.code for f in v.reasons] == ["below_incumbent"]
    assert details(v, "below_incumbent") == ["the incumbent has no held-out rows to compare against"]


def test_exact_reads_decimals_as_written_and_refuses_bools() -> None:
    """0.1 is one tenth exactly; True is not a number a gate file may give."""
    assert exact(0.1) == Fraction(1, 10)
    assert exact("0.25") == Fraction(1, 4)
    with pytest.raises(TypeError, match="bool"):
        exact(True)
