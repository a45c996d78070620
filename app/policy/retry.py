"""Retry loop arithmetic and hold-and-batch: how often to roll the dice, and when not to.

Provisioning is the bottleneck, not training: once a host has proven it computes, keep it for
the next compatible job (`hold_s`, default 10 minutes) instead of rolling the marketplace's
dice again. Every create counts against a per-job cap, and failed attempts back off.

A held host marked `standby` is insurance: it waits for a job whose host was lost or hung (a
recovery adopts it and skips the image pull), and a fresh job does not take it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from app.market import Offer
from app.policy.gpus import same_gpu
from app.policy.ranking import Requirements

__all__ = [
    "DEFAULT_HOLD_S",
    "HeldHost",
    "backoff_s",
    "expired_holds",
    "fresh_pull_s",
    "hedge_chains",
    "may_create",
    "pick_held_host",
    "standby_pool_size",
]

DEFAULT_HOLD_S = 600.0


def backoff_s(
    *, failures: int, base_s: float = 5.0, factor: float = 2.0, cap_s: float = 300.0, jitter_u: float = 0.5
) -> float:
    """Wait before the next create after `failures` failed attempts in a row.

    The first failure retries at once (the next offer is a different machine); from the second
    on: base * factor^(failures-2), capped, scaled by (0.5 + jitter_u) for a caller-supplied
    uniform `jitter_u` in [0, 1) (the policy draws no random numbers itself).
    """
    if failures <= 1:
        return 0.0
    raw = min(cap_s, base_s * factor ** (failures - 2))
    return raw * (0.5 + min(max(jitter_u, 0.0), 1.0))


def hedge_chains(*, delivery_rate: float, first_try_p: float, at_least: int, at_most: int) -> int:
    """How many parallel provisioning chains a job that waits should run: the fewest that make
    P(at least one chain's first rental delivers) >= `first_try_p` when each rental delivers with
    probability `delivery_rate` (the rate observed on this marketplace), between `at_least` and
    `at_most`. On a market where 7 rentals in 10 are duds, three chains leave a one-in-three chance
    that every first attempt fails and the job waits a second pull; six bring it under one in eight.
    """
    lo = max(1, at_least)
    hi = max(lo, at_most)
    p = min(max(delivery_rate, 0.0), 1.0)
    if p >= 1.0 or first_try_p <= 0.0:
        return lo
    if p <= 0.0 or first_try_p >= 1.0:
        return hi
    need = math.ceil(math.log(1.0 - first_try_p) / math.log(1.0 - p) - 1e-9)
    return min(hi, max(lo, need))


def fresh_pull_s(*, download_gb: float, rates_gb_per_s: Sequence[float]) -> float | None:
    """How long a fresh rental's pull would take at the median pull rate observed on this
    marketplace (pulls watched so far: finished boots and pulls in progress); None with no rate.
    The advertised download speed is not used: on the measured marketplace it does not predict
    the real one."""
    rates = [r for r in rates_gb_per_s if r > 0]
    if not rates or download_gb <= 0:
        return None
    return download_gb / statistics.median(rates)


def standby_pool_size(
    *,
    configured: int,
    at_most: int,
    losses: int,
    exposure_s: float,
    hosts_at_risk: int,
    refill_s: float,
    miss_p: float,
    prior_exposure_s: float = 3600.0,
) -> int:
    """How many warm standby hosts to keep: `configured` at least, more (up to `at_most`) while the
    loss rate observed on verified hosts says a recovery would likely find the pool empty.

    Losses arrive at rate `losses / (exposure_s + prior_exposure_s)` per verified host (a loss is
    a host lost or hung while it trained or waited; no loss seen: no growth). When a recovery
    adopts a standby, its refill takes about `refill_s`; the further losses among `hosts_at_risk`
    in that window are Poisson(m), m = rate x hosts x refill. The pool is the smallest n with
    P(at least n further losses before the refill is verified) <= `miss_p`: each of them would wait
    a whole image pull.
    """
    lo = max(0, configured)
    hi = max(lo, at_most)
    if lo == 0 or losses <= 0 or hosts_at_risk <= 0 or refill_s <= 0:
        return lo
    m = losses / (max(exposure_s, 0.0) + max(prior_exposure_s, 1e-9)) * hosts_at_risk * refill_s
    n = lo
    while n < hi and _poisson_at_least(n, m) > miss_p:
        n += 1
    return n


def _poisson_at_least(k: int, m: float) -> float:
    """P(N >= k) for N ~ Poisson(m)."""
    term = math.exp(-m)
    below = 0.0
    for i in range(k):
        below += term
        term *= m / (i + 1)
    return max(0.0, 1.0 - below)


def may_create(*, creates_so_far: int, max_creates: int) -> bool:
    return creates_so_far < max_creates


@dataclass(frozen=True, slots=True)
class HeldHost:
    """A verified host kept running after its job, waiting for a compatible one."""

    instance_id: str
    machine_id: str
    provider: str
    gpu_name: str
    gpu_ram_gb: float
    num_gpus: int
    dph_total: float
    held_since: float
    hold_until: float
    standby: bool = False  # kept for recoveries only

    def as_offer(self) -> Offer:
        """The held host as the offer a job rents it by: its GPU and rate; the rest is unknown."""
        return Offer(
            provider=self.provider,
            offer_id=f"held:{self.instance_id}",
            machine_id=self.machine_id,
            gpu_name=self.gpu_name,
            num_gpus=self.num_gpus,
            gpu_ram_gb=self.gpu_ram_gb,
            dph_total=self.dph_total,
            storage_per_gb_month=None,
            inet_down_per_gb=None,
            inet_down_mbps=None,
            reliability=None,
            cuda_max=None,
        )


def pick_held_host(
    held: Sequence[HeldHost], req: Requirements, *, now: float, recovering: bool = False
) -> HeldHost | None:
    """The cheapest held host that suits `req` and is still within its hold, or None.

    Standby hosts are offered only to a job that is `recovering` (its host was lost or hung).
    """
    fits = [
        h
        for h in held
        if now < h.hold_until
        and (recovering or not h.standby)
        and (not req.providers or h.provider in req.providers)
        and (not req.gpu_names or any(same_gpu(w, h.gpu_name) for w in req.gpu_names))
        and h.gpu_ram_gb >= req.min_gpu_ram_gb
        and h.num_gpus >= req.num_gpus
        and (req.max_dph is None or h.dph_total <= req.max_dph)
    ]
    return min(fits, key=lambda h: (h.dph_total, h.instance_id)) if fits else None


def expired_holds(held: Sequence[HeldHost], *, now: float) -> list[HeldHost]:
    """Held hosts whose hold has run out: the driver stops them (never destroys: they held work)."""
    return [h for h in held if now >= h.hold_until]
