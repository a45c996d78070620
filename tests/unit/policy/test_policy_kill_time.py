"""A rental's kill-time from the job's shape, the reliability floor a job asks for, and the order
`submit --dry-run` shows: pure decisions, no clock."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from app.market import Offer
from app.policy.fleet import KILL_MARGIN_FACTOR, KILL_MARGIN_S, MAX_KILL_AFTER_S, kill_after_s
from app.policy.provisioning import MarketView, choose_host, guarded_config, naive_config, new_job, ranked_offers
from app.policy.ranking import JobShape, Requirements, pull_seconds, rank_offers


def offer(oid: str, *, dph: float = 0.2, reliability: float | None = 0.99, mbps: float | None = 800.0) -> Offer:
    return Offer("sim", oid, f"m-{oid}", "RTX 3090", 1, 24.0, dph, 0.1, 0.0, mbps, reliability, "12.4")


SHAPE = JobShape(download_gb=20.0, train_s=3600.0, disk_gb=40.0)


def test_the_kill_time_follows_the_pull_and_the_training_with_a_margin() -> None:
    """Derived: 1.5 x (pull at the offer's speed + training + overhead) + 1 h, not a fixed 6 h."""
    o = offer("a", mbps=800.0)
    life = pull_seconds(download_gb=20.0, inet_down_mbps=800.0) + 3600.0 + SHAPE.overhead_s
    assert kill_after_s(o, SHAPE) == KILL_MARGIN_FACTOR * life + KILL_MARGIN_S
    slow = offer("b", mbps=50.0)
    assert kill_after_s(slow, SHAPE) > kill_after_s(o, SHAPE)  # a slower pull gets more time
    longer = replace(SHAPE, train_s=10 * 3600.0)
    assert kill_after_s(o, longer) > 10 * 3600.0 * KILL_MARGIN_FACTOR


def test_the_job_files_kill_time_wins_and_a_standby_hold_comes_on_top() -> None:
    """A job that names its kill-time gets exactly it; a standby host's wait is added to either."""
    o = offer("a")
    named = replace(SHAPE, kill_after_s=2 * 3600.0)
    assert kill_after_s(o, named) == 2 * 3600.0
    assert kill_after_s(o, named, waits_s=600.0) == 2 * 3600.0 + 600.0
    assert kill_after_s(o, SHAPE, waits_s=600.0) == kill_after_s(o, SHAPE) + 600.0


@given(train_s=st.floats(0, 1e9), download_gb=st.floats(0, 1e6), mbps=st.one_of(st.none(), st.floats(0.1, 1e5)))
def test_a_derived_kill_time_is_finite_positive_and_at_most_a_week(
    train_s: float, download_gb: float, mbps: float | None
) -> None:
    """Whatever the shape, the derived kill-time covers at least the margin and never exceeds a week."""
    k = kill_after_s(offer("a", mbps=mbps), JobShape(download_gb=download_gb, train_s=train_s, disk_gb=10.0))
    assert KILL_MARGIN_S <= k <= MAX_KILL_AFTER_S


def test_a_hard_reliability_floor_filters_under_the_guarded_ranking() -> None:
    """The guarded policy lets a soft 0.98 floor only weigh in; a job's own floor (hard) filters."""
    offers = [offer("cheap", dph=0.10, reliability=0.90), offer("sound", dph=0.30, reliability=0.99)]
    soft = Requirements(min_reliability=0.98)
    hard = Requirements(min_reliability=0.98, reliability_floor_soft=False)
    ids = [r.offer.offer_id for r in rank_offers(offers, soft, SHAPE, records={}, now=0.0, reliability_floor="prior")]
    assert set(ids) == {"cheap", "sound"}
    for floor in ("prior", "fallback"):
        ranked = rank_offers(offers, hard, SHAPE, records={}, now=0.0, reliability_floor=floor)
        assert [r.offer.offer_id for r in ranked] == ["sound"]
    only_low = [offer("cheap", dph=0.10, reliability=0.90)]
    assert rank_offers(only_low, hard, SHAPE, records={}, now=0.0, reliability_floor="prior") == []


def test_the_dry_runs_first_offer_is_the_one_the_policy_rents() -> None:
    """`ranked_offers` is the order `choose_host` takes its pick from, under either configuration,
    and it drops offers whose attempt the budget cannot pay."""
    offers = (offer("a", dph=0.30), offer("b", dph=0.12), offer("c", dph=0.20, mbps=20.0))
    job = new_job("j", req=Requirements(), shape=SHAPE)
    for cfg in (guarded_config(), naive_config()):
        view = MarketView(offers=offers)
        ranked = ranked_offers(job, view, now=0.0, cfg=cfg)
        pick = choose_host(job, view, now=0.0, cfg=cfg)
        assert ranked and pick == ranked[0]
    poor = MarketView(offers=offers, budget_left_usd=0.0)
    assert ranked_offers(job, poor, now=0.0, cfg=guarded_config()) == []
