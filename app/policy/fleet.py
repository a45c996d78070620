"""Everything above one job, as pure decisions: the standby pool, hedged refills, holds and their
expiry, budget stops, the reservation, giving up for lack of money.

`app.policy.provisioning.decide` moves one job; this module decides what concerns several: how
many verified hosts a pool keeps waiting, how many provisioning chains refill it, what happens to
a held host whose hold ends or whose instance went away, when a budget ends every job under it.
Both drivers (Celery in real time, the campaign simulator in virtual time) gather what these
functions take and apply what they return, so the simulator's receipts describe the fleet that
production runs. Standard library only; no clock reads; no I/O.

A *pool* belongs to an owner: in production each job with `needs.standby_hosts` keeps its own; the
campaign simulator keeps one for the whole campaign. Nothing below depends on which.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from app.market import Offer
from app.policy.bootwatch import pull_rate_gb_per_s
from app.policy.guardrails import budget_level
from app.policy.provisioning import JobState, ProvisioningConfig, hedge_width
from app.policy.ranking import JobShape, attempt_cost_usd, pull_seconds
from app.policy.reputation import MachineRecord
from app.policy.retry import HeldHost, standby_pool_size

__all__ = [
    "DEFAULT_REFILL_S",
    "KILL_MARGIN_FACTOR",
    "KILL_MARGIN_S",
    "MAX_KILL_AFTER_S",
    "Drop",
    "Exposure",
    "HeldLook",
    "HoldAction",
    "Release",
    "Renew",
    "RiskSpan",
    "budget_exhausted",
    "budget_verdict",
    "exposure",
    "hold_terms",
    "judge_held",
    "kill_after_s",
    "pool_missing",
    "pool_target",
    "pull_rate_seen",
    "recoveries_waiting",
    "refill_chains",
    "reservation_usd",
    "standby_wanted",
]

DEFAULT_REFILL_S = 600.0  # how long a refill is assumed to take before any host was verified
GONE = ("gone", "exited")
NOT_THERE = (*GONE, "stopped")  # a held host in one of these states is no longer there to hold


# -- the loss record of verified hosts ----------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RiskSpan:
    """A verified host exposed to being lost: from its verification (training or waiting as
    standby) to its end; `lost` if it ended lost or hung."""

    created_at: float  # the instance's create (its verification minus this is the refill time)
    verified_at: float
    ended_at: float | None = None
    lost: bool = False
    owner: str = ""  # the pool whose recoveries it trains for or waits for


@dataclass(frozen=True, slots=True)
class Exposure:
    """What the driver observed of verified hosts' losses."""

    losses: int = 0
    exposure_s: float = 0.0  # host-seconds at risk
    at_risk: int = 0  # hosts exposed right now
    refill_s: float = DEFAULT_REFILL_S  # median create-to-verified time


def exposure(spans: Sequence[RiskSpan], *, now: float, owner: str | None = None) -> Exposure:
    """The loss record of `spans` as of `now`: the loss rate and the refill time from every verified
    host seen on the marketplace, the hosts at risk those of `owner`'s pool (None: all)."""
    verify = [s.verified_at - s.created_at for s in spans if s.verified_at >= s.created_at]
    return Exposure(
        losses=sum(1 for s in spans if s.lost and s.ended_at is not None),
        exposure_s=sum(max(0.0, (now if s.ended_at is None else s.ended_at) - s.verified_at) for s in spans),
        at_risk=sum(1 for s in spans if s.ended_at is None and (owner is None or s.owner == owner)),
        refill_s=statistics.median(verify) if verify else DEFAULT_REFILL_S,
    )


# -- the standby pool -----------------------------------------------------------------------------
def pool_target(cfg: ProvisioningConfig, *, configured: int, seen: Exposure) -> int:
    """How many verified hosts the pool keeps waiting: `configured`, grown (up to
    `standby_hosts_max`, default twice `configured`) while the observed loss rate says a second
    loss would likely come before an adopted standby's refill is verified (retry.standby_pool_size)."""
    if configured <= 0:
        return 0
    at_most = cfg.standby_hosts_max if cfg.standby_hosts_max is not None else 2 * configured
    return standby_pool_size(
        configured=configured,
        at_most=at_most,
        losses=seen.losses,
        exposure_s=seen.exposure_s,
        hosts_at_risk=seen.at_risk,
        refill_s=seen.refill_s,
        miss_p=cfg.standby_miss_p,
    )


def pool_missing(*, target: int, waiting: int, active: bool) -> int:
    """Verified hosts the pool still wants: none once its owner is over (or stopped at a budget)."""
    return max(0, target - waiting) if active else 0


def refill_chains(cfg: ProvisioningConfig, *, missing: int, pending: int, records: Mapping[str, MachineRecord]) -> int:
    """New provisioning chains to start: each missing host gets as many parallel chains as the
    marketplace's observed dud rate asks (`hedge_width`), less the chains already under way."""
    if missing <= 0:
        return 0
    return max(0, missing * hedge_width(cfg, records) - pending)


def standby_wanted(*, missing: int, recovering: bool, active: bool) -> bool:
    """A standby chain between attempts keeps rolling the dice only while its pool is short or a
    recovery it could serve is waiting."""
    return active and (missing > 0 or recovering)


def recoveries_waiting(jobs: Sequence[JobState]) -> list[JobState]:
    """The recovering jobs a newly verified host is offered to, the longest waiting first."""
    waiting = [
        j for j in jobs if not j.standby and j.lost_at is not None and j.phase in ("queued", "booting", "preflight")
    ]
    return sorted(waiting, key=lambda j: (j.lost_at or 0.0, j.job_id))


def pull_rate_seen(before: JobState, after: JobState, *, now: float) -> float | None:
    """The pull rate (GB/s) an attempt showed as it left its boot: a finished boot's, from create to
    running; a killed pull's, from its status line. None while it still boots, or when nothing was
    shown. Progress-aware hedging compares chains with the median of these."""
    att = before.attempt
    if before.phase != "booting" or att is None:
        return None
    if after.attempt is not None and after.attempt.instance_id == att.instance_id:
        if after.phase != "booting" and now > att.created_at:
            return before.shape.download_gb / (now - att.created_at)
        return None
    return pull_rate_gb_per_s(att.watch)


# -- holds ----------------------------------------------------------------------------------------
def hold_terms(
    host: HeldHost, *, now: float, cfg: ProvisioningConfig, missing: int, kill_at: float | None = None
) -> HeldHost:
    """How a verified host is held: a standby job's host waits as standby while the pool is short,
    otherwise it gets the ordinary hold (any compatible job may take it); never past its kill-time."""
    if host.standby and missing <= 0:
        host = replace(host, standby=False, hold_until=now + cfg.hold_s)
    if kill_at is not None and host.hold_until > kill_at:
        host = replace(host, hold_until=kill_at)
    return host


@dataclass(frozen=True, slots=True)
class HeldLook:
    """What the driver knows of one held host right now."""

    host: HeldHost
    held_work: bool  # it trained a job: automation may only stop it
    state: str | None = None  # the vendor's state; None: not looked at (or the look failed); any
    # state but gone, exited or stopped (a vendor's passing "unknown") leaves the hold as it is
    kill_at: float | None = None
    rental_active: bool = True


@dataclass(frozen=True, slots=True)
class Release:
    """End the hold: stop a host that held work, destroy one that never did (money invariant 3:
    stopping it would bill a disk nobody will use)."""

    host: HeldHost
    destroy: bool
    reason: str


@dataclass(frozen=True, slots=True)
class Renew:
    """Keep the host held until `until` (as standby, or as an ordinary hold)."""

    host: HeldHost
    until: float
    standby: bool
    reason: str


@dataclass(frozen=True, slots=True)
class Drop:
    """The host is no longer there to hold: its instance is gone (`lost`) or its rental ended."""

    host: HeldHost
    lost: bool
    evidence: str


HoldAction = Release | Renew | Drop


def judge_held(
    look: HeldLook,
    *,
    now: float,
    cfg: ProvisioningConfig,
    missing_besides: int,
    beyond_pool: bool = False,
    recovering: bool = False,
) -> HoldAction | None:
    """One held host at a sweep (or at its hold's end).

    `missing_besides`: how many hosts its pool would still want if this one were not counted;
    `beyond_pool`: it is a standby host held long beyond what the pool asked for (a recovery took
    another host verified at the same moment); `recovering`: its pool's owner recovers right now.
    """
    h = look.host
    if not look.rental_active:
        return Drop(h, lost=False, evidence="its rental ended")
    if look.state in NOT_THERE:
        return Drop(h, lost=look.state in GONE, evidence=f"held host reported {look.state}")
    if h.standby and beyond_pool and not recovering and h.hold_until > now + cfg.hold_s:
        return Renew(
            h,
            until=now + cfg.hold_s,
            standby=h.standby,
            reason="standby host beyond the pool once the recovery took another",
        )
    if now < h.hold_until:
        return None
    if missing_besides > 0 and (look.kill_at is None or look.kill_at - now > cfg.hold_s):
        until = now + cfg.standby_hold_s if look.kill_at is None else min(now + cfg.standby_hold_s, look.kill_at)
        return Renew(h, until=until, standby=True, reason="the standby pool still wants it")
    return Release(h, destroy=not look.held_work, reason="hold expired")


# -- money ----------------------------------------------------------------------------------------
def reservation_usd(
    offer: Offer,
    shape: JobShape,
    cfg: ProvisioningConfig,
    *,
    pull: bool = True,
    dph_total: float | None = None,
    storage_per_gb_month: float | None = None,
    disk_gb: float | None = None,
) -> float:
    """What a create (or an adoption, `pull=False`) reserves before a cent is spent: the
    `reserve_factor` times the attempt's expected all-in cost."""
    return cfg.reserve_factor * attempt_cost_usd(
        dph_total=offer.dph_total if dph_total is None else dph_total,
        storage_per_gb_month=offer.storage_per_gb_month if storage_per_gb_month is None else storage_per_gb_month,
        inet_down_per_gb=offer.inet_down_per_gb,
        inet_down_mbps=offer.inet_down_mbps,
        download_gb=shape.download_gb if pull else 0.0,
        train_s=shape.train_s,
        disk_gb=shape.disk_gb if disk_gb is None else disk_gb,
        overhead_s=shape.overhead_s,
    )


# A rental's kill-time: its expected life (the pull at the offer's speed, the training, the
# overhead) times a margin for a slower host, plus a fixed margin; never more than a week.
KILL_MARGIN_FACTOR = 1.5
KILL_MARGIN_S = 3600.0
MAX_KILL_AFTER_S = 7 * 24 * 3600.0


def kill_after_s(offer: Offer, shape: JobShape, *, waits_s: float = 0.0) -> float:
    """How long after its create a rental for this job on `offer` is stopped by the reaper.

    The job's own `shape.kill_after_s` when it names one; else KILL_MARGIN_FACTOR x (pull at the
    offer's download speed + training + overhead) + KILL_MARGIN_S, at most MAX_KILL_AFTER_S.
    `waits_s`: how long the host may wait before it trains (a standby host's hold) comes on top.
    A job that needs longer extends the kill-time deliberately (`Rentals.extend_kill_time`).
    """
    if shape.kill_after_s is not None:
        return shape.kill_after_s + waits_s
    life_s = (
        pull_seconds(download_gb=shape.download_gb, inet_down_mbps=offer.inet_down_mbps)
        + shape.train_s
        + shape.overhead_s
    )
    return min(MAX_KILL_AFTER_S, KILL_MARGIN_FACTOR * life_s + KILL_MARGIN_S) + waits_s


def budget_verdict(
    *, spent_usd: float, burn_usd_per_s: float, cap_usd: float, cfg: ProvisioningConfig
) -> Literal["ok", "warning", "stop"]:
    """A cap's level, looking `budget_guard_s` ahead: what was billed plus what still bills for that
    long. The monitor runs periodically; stopping only once spend crossed the cap would overspend
    by up to one period's burn."""
    return budget_level(committed_usd=spent_usd + max(0.0, burn_usd_per_s) * cfg.budget_guard_s, cap_usd=cap_usd)


def unconfirmed_create_verdict(
    *, billed_usd: float, burn_usd_per_s: float, reserved_usd: float, cfg: ProvisioningConfig
) -> Literal["wait", "end"]:
    """A create whose answer was lost may be running unseen at the vendor. It is looked for by its
    label and ended once what it billed plus `unconfirmed_guard_s` of its burn would reach what was
    reserved for it: the look-up may fail several passes in a row, and it must still end in time."""
    committed = billed_usd + max(0.0, burn_usd_per_s) * cfg.unconfirmed_guard_s
    return "end" if committed >= reserved_usd else "wait"


def budget_exhausted(*, budget_left_usd: float | None, cheapest_attempt_usd: float, anything_live: bool) -> bool:
    """Nothing is rented any more and what is left of the budget cannot pay for one attempt: the
    jobs still waiting end at the cap instead of waiting for money that will not come. No offer
    (`cheapest_attempt_usd` infinite: a failed search, every host taken) prices no attempt: the job
    waits for offers, it is not out of money."""
    return (
        budget_left_usd is not None
        and not anything_live
        and math.isfinite(cheapest_attempt_usd)
        and budget_left_usd < cheapest_attempt_usd
    )
