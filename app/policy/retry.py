"""Retry loop arithmetic and hold-and-batch: how often to roll the dice, and when not to.

Provisioning is the bottleneck, not training: once a host has proven it computes, keep it for
the next compatible job (`hold_s`, default 10 minutes) instead of rolling the marketplace's
dice again. Every create counts against a per-job cap, and failed attempts back off.

A held host marked `standby` is insurance: it waits for a job whose host was lost or hung (a
recovery adopts it and skips the image pull), and a fresh job does not take it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.policy.gpus import same_gpu
from app.policy.ranking import Requirements

__all__ = [
    "DEFAULT_HOLD_S",
    "HeldHost",
    "backoff_s",
    "expired_holds",
    "may_create",
    "pick_held_host",
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
