"""Fleet decisions at their exact boundaries and with their exact evidence, so that a changed
comparison, default or reason in app/policy/fleet.py fails a test (make mutation)."""

from __future__ import annotations

from dataclasses import replace

from app.market import Offer
from app.policy.bootwatch import start_watch
from app.policy.fleet import (
    DEFAULT_REFILL_S,
    Drop,
    Exposure,
    HeldLook,
    Release,
    Renew,
    RiskSpan,
    budget_exhausted,
    exposure,
    hold_terms,
    judge_held,
    pool_target,
    pull_rate_seen,
    recoveries_waiting,
    reservation_usd,
)
from app.policy.provisioning import Attempt, JobState, guarded_config, new_job
from app.policy.ranking import JobShape, Requirements, attempt_cost_usd
from app.policy.retry import HeldHost

CFG = guarded_config()
SHAPE = JobShape(download_gb=20.0, train_s=600.0, disk_gb=40.0, overhead_s=120.0)
OFFER = Offer(
    provider="sim",
    offer_id="o1",
    machine_id="m1",
    gpu_name="RTX 3090",
    num_gpus=1,
    gpu_ram_gb=24,
    dph_total=0.2,
    storage_per_gb_month=0.1,
    inet_down_per_gb=0.01,
    inet_down_mbps=800,
    reliability=0.99,
    cuda_max="12.4",
)


def host(*, standby: bool = False, hold_until: float = 600.0) -> HeldHost:
    return HeldHost(
        instance_id="i-1",
        machine_id="m-1",
        provider="sim",
        gpu_name="RTX 3090",
        gpu_ram_gb=24,
        num_gpus=1,
        dph_total=0.2,
        held_since=0.0,
        hold_until=hold_until,
        standby=standby,
    )


def test_a_budget_that_pays_exactly_one_attempt_is_not_exhausted() -> None:
    """What is left equal to the cheapest attempt still pays for it; a cent less does not."""
    assert not budget_exhausted(budget_left_usd=1.0, cheapest_attempt_usd=1.0, anything_live=False)
    assert budget_exhausted(budget_left_usd=0.99, cheapest_attempt_usd=1.0, anything_live=False)


def test_a_host_verified_at_its_create_counts_a_zero_refill() -> None:
    """A span verified the instant it was created gives a refill time of 0 s, not the default."""
    assert exposure([RiskSpan(created_at=50.0, verified_at=50.0)], now=60.0).refill_s == 0.0
    assert exposure([RiskSpan(created_at=50.0, verified_at=40.0)], now=60.0).refill_s == DEFAULT_REFILL_S


def test_a_span_that_ended_at_its_verification_was_exposed_zero_seconds() -> None:
    """No negative and no minimum exposure: a span ending as it was verified adds 0 host-seconds."""
    assert exposure([RiskSpan(created_at=0.0, verified_at=100.0, ended_at=100.0)], now=500.0).exposure_s == 0.0


def test_only_the_owners_open_spans_are_at_risk() -> None:
    """Hosts at risk for pool `a` are a's open spans; b's and closed spans do not count."""
    spans = [
        RiskSpan(created_at=0.0, verified_at=10.0, owner="a"),
        RiskSpan(created_at=0.0, verified_at=10.0, owner="b"),
        RiskSpan(created_at=0.0, verified_at=10.0, owner="b"),
        RiskSpan(created_at=0.0, verified_at=10.0, ended_at=20.0, owner="a"),
    ]
    assert exposure(spans, now=30.0, owner="a").at_risk == 1
    assert exposure(spans, now=30.0, owner="b").at_risk == 2


def test_the_pool_grows_up_to_twice_its_configured_size() -> None:
    """Four configured under heavy losses grow past four (at most eight) when no maximum is set."""
    busy = Exposure(losses=6, exposure_s=3600.0, at_risk=8, refill_s=600.0)
    grown = pool_target(replace(CFG, standby_hosts_max=None), configured=4, seen=busy)
    assert 4 < grown <= 8


def test_a_standby_host_the_pool_no_longer_wants_becomes_an_ordinary_hold() -> None:
    """It loses its standby mark (False, not unknown) and is held for hold_s from now."""
    held = hold_terms(host(standby=True, hold_until=9e9), now=100.0, cfg=CFG, missing=0)
    assert held == replace(host(), standby=False, hold_until=100.0 + CFG.hold_s)


def test_a_held_host_whose_rental_ended_is_dropped_not_lost() -> None:
    """A rental ended under the hold: dropped with that evidence, not counted as a loss."""
    look = HeldLook(host=host(), held_work=True, rental_active=False)
    assert judge_held(look, now=0.0, cfg=CFG, missing_besides=0) == Drop(
        host(), lost=False, evidence="its rental ended"
    )


def test_a_standby_host_is_not_beyond_the_pool_unless_told() -> None:
    """Without `beyond_pool`, a standby host held long keeps its hold (no Renew before it ends)."""
    look = HeldLook(host=host(standby=True, hold_until=1e6), held_work=False)
    assert judge_held(look, now=0.0, cfg=CFG, missing_besides=0) is None


def test_a_standby_host_beyond_the_pool_is_cut_to_the_ordinary_hold() -> None:
    """Held longer than hold_s from now: renewed to now + hold_s, standby kept, with the reason."""
    h = host(standby=True, hold_until=1e6)
    look = HeldLook(host=h, held_work=False)
    assert judge_held(look, now=100.0, cfg=CFG, missing_besides=0, beyond_pool=True) == Renew(
        h, until=100.0 + CFG.hold_s, standby=True, reason="standby host beyond the pool once the recovery took another"
    )


def test_a_standby_host_beyond_the_pool_by_exactly_the_hold_or_less_is_left_alone() -> None:
    """A hold ending exactly hold_s from now, or sooner, is no longer than the ordinary one."""
    exact = HeldLook(host=host(standby=True, hold_until=100.0 + CFG.hold_s), held_work=False)
    assert judge_held(exact, now=100.0, cfg=CFG, missing_besides=0, beyond_pool=True) is None
    sooner = HeldLook(host=host(standby=True, hold_until=100.0 + CFG.hold_s / 2), held_work=False)
    assert judge_held(sooner, now=100.0, cfg=CFG, missing_besides=0, beyond_pool=True) is None


def test_an_expired_hold_is_renewed_as_standby_with_its_reason() -> None:
    """The pool still short and no kill-time: renewed as standby for standby_hold_s."""
    h = host(hold_until=50.0)
    look = HeldLook(host=h, held_work=True)
    assert judge_held(look, now=100.0, cfg=CFG, missing_besides=1) == Renew(
        h, until=100.0 + CFG.standby_hold_s, standby=True, reason="the standby pool still wants it"
    )


def test_a_kill_time_exactly_one_hold_away_releases_the_host() -> None:
    """A kill-time exactly hold_s away leaves no room for another hold: released, not renewed."""
    h = host(hold_until=50.0)
    look = HeldLook(host=h, held_work=True, kill_at=100.0 + CFG.hold_s)
    assert judge_held(look, now=100.0, cfg=CFG, missing_besides=1) == Release(h, destroy=False, reason="hold expired")


def job(job_id: str, *, lost_at: float | None, phase: str = "queued") -> JobState:
    shape = JobShape(download_gb=1.0, train_s=1.0, disk_gb=1.0)
    return replace(new_job(job_id, req=Requirements(), shape=shape), lost_at=lost_at, phase=phase)  # type: ignore[arg-type]


def test_a_recovery_in_preflight_still_waits_and_a_loss_at_time_zero_waits_longest() -> None:
    """Jobs lost at 0.0 and 0.5 s, one in preflight: both wait, the one lost at 0.0 first."""
    waiting = recoveries_waiting([job("b", lost_at=0.5, phase="preflight"), job("a", lost_at=0.0)])
    assert [j.job_id for j in waiting] == ["a", "b"]


def booting_at(created_at: float) -> JobState:
    att = Attempt(
        instance_id="i-1",
        machine_id="m1",
        provider="sim",
        offer=OFFER,
        created_at=created_at,
        watch=start_watch(created_at=created_at),
    )
    return replace(new_job("j", req=Requirements(), shape=SHAPE), phase="booting", attempt=att)


def test_a_boot_that_left_at_its_create_instant_shows_no_rate() -> None:
    """Zero seconds from create to running gives no rate (no division by zero)."""
    before = booting_at(100.0)
    assert pull_rate_seen(before, replace(before, phase="preflight"), now=100.0) is None


def test_a_finished_boot_rate_is_its_download_over_the_time_since_create() -> None:
    """Created at 100 s, running at 140 s: 20 GB in 40 s is 0.5 GB/s."""
    before = booting_at(100.0)
    assert pull_rate_seen(before, replace(before, phase="preflight"), now=140.0) == 0.5


def test_a_reservation_uses_the_prices_and_disk_it_is_given_over_the_offers() -> None:
    """An adoption's terms (rate, storage price, disk) replace the offer's; without a pull, no download."""
    got = reservation_usd(OFFER, SHAPE, CFG, pull=False, dph_total=0.5, storage_per_gb_month=0.3, disk_gb=80.0)
    want = CFG.reserve_factor * attempt_cost_usd(
        dph_total=0.5,
        storage_per_gb_month=0.3,
        inet_down_per_gb=0.01,
        inet_down_mbps=800,
        download_gb=0.0,
        train_s=600.0,
        disk_gb=80.0,
        overhead_s=120.0,
    )
    assert got == want
