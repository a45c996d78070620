"""Retry arithmetic and hold-and-batch of verified hosts."""

from __future__ import annotations

from app.policy.ranking import Requirements
from app.policy.retry import (
    HeldHost,
    backoff_s,
    expired_holds,
    fresh_pull_s,
    hedge_chains,
    may_create,
    pick_held_host,
    standby_pool_size,
)


def test_backoff_grows_and_is_capped() -> None:
    """The first failure retries at once; later ones back off exponentially up to the cap."""
    assert backoff_s(failures=1) == 0.0
    waits = [backoff_s(failures=n, jitter_u=0.5) for n in range(2, 12)]
    assert waits == sorted(waits) and waits[0] == 5.0 and waits[-1] == 300.0
    assert backoff_s(failures=3, jitter_u=0.0) == 5.0 and backoff_s(failures=3, jitter_u=0.999) < 15.0


def test_create_cap() -> None:
    """A job may create until its cap, not beyond."""
    assert may_create(creates_so_far=2, max_creates=3)
    assert not may_create(creates_so_far=3, max_creates=3)


def held(iid: str, *, gpu: str = "RTX 3090", dph: float = 0.2, until: float = 600.0) -> HeldHost:
    return HeldHost(instance_id=iid, machine_id=f"m-{iid}", provider="sim", gpu_name=gpu, gpu_ram_gb=24, num_gpus=1,
                    dph_total=dph, held_since=0.0, hold_until=until)


def test_pick_held_host_takes_the_cheapest_compatible_unexpired() -> None:
    """A queued job takes the cheapest held host that fits and has not expired."""
    hosts = [held("a", dph=0.3), held("b", dph=0.2), held("c", gpu="RTX 4090", dph=0.1), held("d", dph=0.05, until=5.0)]
    pick = pick_held_host(hosts, Requirements(gpu_names=("RTX 3090",)), now=10.0)
    assert pick is not None and pick.instance_id == "b"
    assert pick_held_host(hosts, Requirements(min_gpu_ram_gb=48), now=10.0) is None


def test_expired_holds_are_listed_for_stopping() -> None:
    """Holds past their time are returned so the driver stops them."""
    assert [h.instance_id for h in expired_holds([held("a", until=5.0), held("b")], now=10.0)] == ["a"]


def test_standby_hosts_go_only_to_recovering_jobs() -> None:
    """pick_held_host offers a standby host only to a job whose host was lost or hung."""
    from app.policy.ranking import Requirements
    from app.policy.retry import HeldHost, pick_held_host

    standby = HeldHost("i-1", "m-1", "sim", "RTX 3090", 24, 1, 0.2, 0.0, 100.0, standby=True)
    assert pick_held_host([standby], Requirements(), now=1.0) is None
    assert pick_held_host([standby], Requirements(), now=1.0, recovering=True) == standby


def test_hedge_chains_make_a_first_try_delivery_likely() -> None:
    """The hedge is the fewest chains with P(some first rental delivers) >= the target, within bounds."""
    assert hedge_chains(delivery_rate=0.9, first_try_p=0.9, at_least=3, at_most=6) == 3
    assert hedge_chains(delivery_rate=0.5, first_try_p=0.9, at_least=3, at_most=6) == 4  # 1 - 0.5^4 = 0.94
    assert hedge_chains(delivery_rate=0.3, first_try_p=0.9, at_least=3, at_most=6) == 6  # needs 7: capped
    assert hedge_chains(delivery_rate=0.0, first_try_p=0.9, at_least=3, at_most=6) == 6
    widths = [hedge_chains(delivery_rate=p / 20, first_try_p=0.9, at_least=1, at_most=50) for p in range(1, 20)]
    assert widths == sorted(widths, reverse=True)  # the more duds, the wider
    for p, k in zip(range(1, 20), widths, strict=True):
        assert 1 - (1 - p / 20) ** k >= 0.9 > 1 - (1 - p / 20) ** (k - 1) or k == 1


def test_standby_pool_keeps_what_was_configured_until_a_loss_is_seen() -> None:
    """No loss observed (or no pool asked for): the pool is what the operator configured."""
    kw = {"at_most": 2, "exposure_s": 7200.0, "hosts_at_risk": 5, "refill_s": 600.0, "miss_p": 0.2}
    assert standby_pool_size(configured=1, losses=0, **kw) == 1  # type: ignore[arg-type]
    assert standby_pool_size(configured=0, losses=9, **kw) == 0  # type: ignore[arg-type]


def test_standby_pool_grows_when_another_loss_during_a_refill_is_likely() -> None:
    """With losses frequent enough that a second one would likely come before the refill is
    verified, one more host waits; with rare losses, it does not; never beyond at_most."""
    kw = {"configured": 1, "at_most": 2, "hosts_at_risk": 5, "refill_s": 600.0, "miss_p": 0.2}
    # 1 loss in 10 host-hours: m = 1/(10 h + 1 h prior) x 5 x 600 s = 0.076: P(another) = 7%
    assert standby_pool_size(losses=1, exposure_s=36_000.0, **kw) == 1  # type: ignore[arg-type]
    # 2 losses in 2 host-hours: m = 2/3 h x 5 x 600 s = 0.56: P(another) = 43%
    assert standby_pool_size(losses=2, exposure_s=7200.0, **kw) == 2  # type: ignore[arg-type]
    assert standby_pool_size(losses=50, exposure_s=7200.0, **kw) == 2  # type: ignore[arg-type]


def test_a_fresh_rental_is_expected_to_pull_at_the_median_rate_observed() -> None:
    """A fresh rental's pull is the download at the median observed rate; no rate seen: unknown."""
    assert fresh_pull_s(download_gb=23.0, rates_gb_per_s=[0.01, 0.1, 0.05]) == 23.0 / 0.05
    assert fresh_pull_s(download_gb=23.0, rates_gb_per_s=[]) is None
    assert fresh_pull_s(download_gb=23.0, rates_gb_per_s=[0.0]) is None
