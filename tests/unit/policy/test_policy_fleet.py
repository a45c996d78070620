"""Fleet decisions above one job: the pool, its refills, holds and their end, budget stops, reservations."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.market import Offer
from app.policy.fleet import (
    DEFAULT_REFILL_S,
    Drop,
    Exposure,
    HeldLook,
    Release,
    Renew,
    RiskSpan,
    budget_exhausted,
    budget_verdict,
    exposure,
    hold_terms,
    judge_held,
    pool_missing,
    pool_target,
    recoveries_waiting,
    refill_chains,
    reservation_usd,
    standby_wanted,
)
from app.policy.provisioning import guarded_config, new_job
from app.policy.ranking import JobShape, Requirements, attempt_cost_usd
from app.policy.reputation import MachineRecord
from app.policy.retry import HeldHost

CFG = guarded_config()
SHAPE = JobShape(download_gb=23.0, train_s=1140.0, disk_gb=60.0)


def host(*, standby: bool = False, hold_until: float = 600.0, iid: str = "i-1") -> HeldHost:
    return HeldHost(
        instance_id=iid,
        machine_id=f"m-{iid}",
        provider="sim",
        gpu_name="RTX 3090",
        gpu_ram_gb=24,
        num_gpus=1,
        dph_total=0.2,
        held_since=0.0,
        hold_until=hold_until,
        standby=standby,
    )


def test_exposure_counts_losses_host_seconds_hosts_at_risk_and_the_median_refill() -> None:
    """Closed spans give their length; open ones run to now; the refill is create-to-verified."""
    spans = [
        RiskSpan(created_at=0, verified_at=300, ended_at=900, lost=True),
        RiskSpan(created_at=100, verified_at=500, ended_at=700, lost=False),
        RiskSpan(created_at=1000, verified_at=1200),
    ]
    seen = exposure(spans, now=1500)
    assert seen == Exposure(losses=1, exposure_s=600 + 200 + 300, at_risk=1, refill_s=300)
    assert exposure([], now=5).refill_s == DEFAULT_REFILL_S


def test_the_pool_grows_only_when_losses_make_a_second_one_likely() -> None:
    """No loss seen: the configured size; a high loss rate among many hosts at risk: more, capped."""
    cfg = replace(CFG, standby_hosts=1)
    assert pool_target(cfg, configured=0, seen=Exposure(losses=9, exposure_s=1, at_risk=9)) == 0
    assert pool_target(cfg, configured=1, seen=Exposure()) == 1
    busy = Exposure(losses=6, exposure_s=3600.0, at_risk=8, refill_s=600.0)
    assert pool_target(cfg, configured=1, seen=busy) == 2  # at most twice the configured size
    assert pool_target(replace(cfg, standby_hosts_max=5), configured=1, seen=busy) > 2


def test_pool_missing_and_standby_wanted_end_with_the_pool() -> None:
    """An inactive pool (its owner over, or stopped at a budget) wants nothing and cancels its chains."""
    assert pool_missing(target=2, waiting=0, active=True) == 2
    assert pool_missing(target=2, waiting=3, active=True) == 0
    assert pool_missing(target=2, waiting=0, active=False) == 0
    assert standby_wanted(missing=1, recovering=False, active=True)
    assert standby_wanted(missing=0, recovering=True, active=True)
    assert not standby_wanted(missing=0, recovering=False, active=True)
    assert not standby_wanted(missing=3, recovering=True, active=False)


def test_refills_are_hedged_as_widely_as_the_dud_rate_asks_less_the_chains_under_way() -> None:
    """On a market where most rentals fail, each missing host gets several parallel chains."""
    duds = {
        f"m-{i}": replace(
            MachineRecord(machine_id=f"m-{i}", provider="sim"), creates=1, failures=(("no_compute", 0.0),)
        )
        for i in range(8)
    }
    wide = refill_chains(CFG, missing=1, pending=0, records=duds)
    assert CFG.recovery_hedge <= wide <= CFG.recovery_hedge_max
    assert refill_chains(CFG, missing=2, pending=1, records=duds) == 2 * wide - 1
    assert refill_chains(CFG, missing=0, pending=0, records=duds) == 0
    assert refill_chains(CFG, missing=1, pending=99, records=duds) == 0


def test_recoveries_are_offered_a_verified_host_longest_waiting_first() -> None:
    """Only recovering real jobs still provisioning, in order of their loss."""
    base = new_job("a", req=Requirements(), shape=SHAPE)
    a = replace(base, job_id="a", lost_at=50.0)
    b = replace(base, job_id="b", lost_at=10.0, phase="booting")
    fresh = replace(base, job_id="c")
    training = replace(base, job_id="d", lost_at=5.0, phase="training")
    standby = replace(base, job_id="e", lost_at=1.0, standby=True)
    assert [j.job_id for j in recoveries_waiting([a, b, fresh, training, standby])] == ["b", "a"]


def test_hold_terms_a_standby_host_the_pool_no_longer_wants_is_an_ordinary_hold() -> None:
    """A hedge verified after the pool filled is held 10 minutes for any job, and never past its kill-time."""
    h = host(standby=True, hold_until=CFG.standby_hold_s)
    assert hold_terms(h, now=0.0, cfg=CFG, missing=1) == h
    ordinary = hold_terms(h, now=100.0, cfg=CFG, missing=0)
    assert not ordinary.standby and ordinary.hold_until == 100.0 + CFG.hold_s
    assert hold_terms(h, now=0.0, cfg=CFG, missing=1, kill_at=3000.0).hold_until == 3000.0


def test_a_held_host_whose_instance_went_away_is_dropped_lost_only_when_gone() -> None:
    """Gone or exited: lost (its machine's record says so); stopped by someone: dropped, not lost."""
    assert judge_held(HeldLook(host(), held_work=True, state="gone"), now=0, cfg=CFG, missing_besides=0) == Drop(
        host(), lost=True, evidence="held host reported gone"
    )
    dropped = judge_held(HeldLook(host(), held_work=True, state="stopped"), now=0, cfg=CFG, missing_besides=0)
    assert isinstance(dropped, Drop) and not dropped.lost
    ended = judge_held(HeldLook(host(), held_work=True, rental_active=False), now=0, cfg=CFG, missing_besides=0)
    assert isinstance(ended, Drop) and not ended.lost


def test_an_expired_hold_is_renewed_while_the_pool_is_short_else_released_by_what_it_held() -> None:
    """Money invariant 3: a released host that held work is stopped; one that never did is destroyed."""
    h = host(hold_until=600.0)
    assert judge_held(HeldLook(h, held_work=True, state="running"), now=599.0, cfg=CFG, missing_besides=0) is None
    renewed = judge_held(HeldLook(h, held_work=False, state="running"), now=600.0, cfg=CFG, missing_besides=1)
    assert isinstance(renewed, Renew) and renewed.standby and renewed.until == 600.0 + CFG.standby_hold_s
    capped = judge_held(HeldLook(h, held_work=False, kill_at=2000.0), now=600.0, cfg=CFG, missing_besides=1)
    assert isinstance(capped, Renew) and capped.until == 2000.0
    near_kill = judge_held(HeldLook(h, held_work=False, kill_at=700.0), now=600.0, cfg=CFG, missing_besides=1)
    assert isinstance(near_kill, Release)
    assert judge_held(HeldLook(h, held_work=True), now=600.0, cfg=CFG, missing_besides=0) == Release(
        h, destroy=False, reason="hold expired"
    )
    assert judge_held(HeldLook(h, held_work=False), now=600.0, cfg=CFG, missing_besides=0) == Release(
        h, destroy=True, reason="hold expired"
    )


def test_a_standby_host_held_long_beyond_the_pool_gets_the_ordinary_hold_once_no_recovery_waits() -> None:
    """The recovery took another host verified at the same moment: this one stops waiting hours."""
    h = host(standby=True, hold_until=CFG.standby_hold_s)
    look = HeldLook(h, held_work=False, state="running")
    short = judge_held(look, now=10.0, cfg=CFG, missing_besides=0, beyond_pool=True)
    assert isinstance(short, Renew) and short.until == 10.0 + CFG.hold_s
    assert judge_held(look, now=10.0, cfg=CFG, missing_besides=0, beyond_pool=True, recovering=True) is None


def offer(dph: float = 0.2) -> Offer:
    return Offer(
        provider="sim",
        offer_id="o",
        machine_id="m",
        gpu_name="RTX 3090",
        num_gpus=1,
        gpu_ram_gb=24,
        dph_total=dph,
        storage_per_gb_month=0.15,
        inet_down_per_gb=0.01,
        inet_down_mbps=800,
        reliability=0.99,
        cuda_max="12.4",
    )


def test_a_reservation_is_the_reserve_factor_times_the_attempts_all_in_cost() -> None:
    """A create reserves pull, training, storage and traffic; an adoption pulls nothing."""
    o = offer()
    full = attempt_cost_usd(
        dph_total=0.2,
        storage_per_gb_month=0.15,
        inet_down_per_gb=0.01,
        inet_down_mbps=800,
        download_gb=23.0,
        train_s=1140.0,
        disk_gb=60.0,
        overhead_s=SHAPE.overhead_s,
    )
    assert reservation_usd(o, SHAPE, CFG) == pytest.approx(CFG.reserve_factor * full)
    assert reservation_usd(o, SHAPE, CFG, pull=False) < reservation_usd(o, SHAPE, CFG)


def test_the_budget_stops_before_what_still_bills_would_cross_the_cap() -> None:
    """Spend plus budget_guard_s of the current burn is what is compared with the cap."""
    burn = 0.36 / 3600.0  # $0.36/h
    assert budget_verdict(spent_usd=5.0, burn_usd_per_s=burn, cap_usd=10.0, cfg=CFG) == "ok"
    assert budget_verdict(spent_usd=8.5, burn_usd_per_s=burn, cap_usd=10.0, cfg=CFG) == "warning"
    edge = 10.0 - burn * CFG.budget_guard_s
    assert budget_verdict(spent_usd=edge, burn_usd_per_s=burn, cap_usd=10.0, cfg=CFG) == "stop"
    assert budget_verdict(spent_usd=edge - 0.01, burn_usd_per_s=burn, cap_usd=10.0, cfg=CFG) != "stop"


def test_waiting_jobs_end_when_nothing_runs_and_the_budget_left_cannot_pay_one_attempt() -> None:
    """While anything still runs, money may come back; with no cap there is nothing to exhaust."""
    assert budget_exhausted(budget_left_usd=0.1, cheapest_attempt_usd=0.2, anything_live=False)
    assert not budget_exhausted(budget_left_usd=0.1, cheapest_attempt_usd=0.2, anything_live=True)
    assert not budget_exhausted(budget_left_usd=0.3, cheapest_attempt_usd=0.2, anything_live=False)
    assert not budget_exhausted(budget_left_usd=None, cheapest_attempt_usd=0.2, anything_live=False)


@settings(max_examples=200, deadline=None)
@given(
    now=st.floats(0, 1e6),
    until=st.floats(0, 1e6),
    held_work=st.booleans(),
    missing=st.integers(0, 3),
    state=st.sampled_from([None, "running", "stopped", "gone", "exited", "unknown"]),
    kill=st.one_of(st.none(), st.floats(0, 2e6)),
)
def test_automation_never_destroys_a_held_host_that_held_work(
    now: float, until: float, held_work: bool, missing: int, state: str | None, kill: float | None
) -> None:
    """Whatever the hold's state, a release destroys only what never held work, and a renewal ends in the future."""
    act = judge_held(
        HeldLook(host(hold_until=until), held_work=held_work, state=state, kill_at=kill),
        now=now,
        cfg=CFG,
        missing_besides=missing,
    )
    if isinstance(act, Release):
        assert act.destroy == (not held_work)
    if isinstance(act, Renew):
        assert act.until > now or (kill is not None and math.isclose(act.until, kill))
