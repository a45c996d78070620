"""The campaign simulator as `tuneharness plan` replays it: one generated trace per seed, shaped like
the workload (its GPU model, training time, model and data size, jobs) and like the marketplace
(`make_traces.marketplace`'s offers, dud kinds and healthy-host mix) at a given dud rate, run
through the naive and the guarded policy.

Only GPU models the simulated marketplace lists (`make_traces.GPUS`, with their hourly price
ranges) can be replayed: a price for any other model would be invented.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from typing import Any

from app.policy.gpus import canonical_gpu
from app.services.plan import ReplayOutcome, plan_gpu
from providers.sim.campaign import run_campaign
from providers.sim.make_traces import GPUS, _dud, _healthy, _offer, _pull_s
from providers.sim.trace import TRACE_FORMAT, Trace, parse_trace

__all__ = ["SimPlanReplay", "workload_trace"]

IMAGE_GB = 8.0  # the trainer image every generated trace pulls (`make_traces.marketplace`)
CHECKPOINT_EVERY_S = 300.0
MAX_HOSTS = 600  # keeps one replay within a second or so at a dud-heavy rate
# `make_traces.marketplace`'s measured mix: dud kinds among the 62, healthy kinds among the 38.
DUD_MIX = {
    "freeze": 18,
    "fatal": 14,
    "stale_driver": 12,
    "vram_short": 6,
    "wrong_gpu": 4,
    "throttled": 3,
    "vanished_boot": 5,
}
GOOD_MIX = {"ok": 24, "slow": 6, "dies_mid_run": 6, "hangs_mid_run": 2}
POLICIES = ("naive", "guarded")


def _offer_names() -> dict[str, tuple[str, float, tuple[float, float]]]:
    """Plan model -> (the offer's GPU name, its VRAM, its hourly price range) for each listed model."""
    return {plan_gpu(canonical_gpu(name)): (name, float(vram), dph) for name, vram, dph, _ in GPUS}


def workload_trace(
    *,
    gpu: str,
    dud_rate: float,
    train_seconds: float,
    model_gb: float,
    data_gb: float,
    jobs: int,
    seed: int,
) -> Trace:
    """A marketplace of `gpu` hosts, a `dud_rate` share of which never deliver a working GPU.

    Enough healthy hosts for every job to finish and recover a few times (four per job, ten at
    least); duds added in proportion. Each host pulls the image plus the model and the data.
    """
    name, vram, (lo, hi) = _offer_names()[gpu]
    rng = random.Random(seed)
    goods = max(10, 4 * jobs)
    duds = min(round(goods * dud_rate / (1.0 - dud_rate)), MAX_HOSTS - goods) if dud_rate > 0 else 0
    pulled_gb = model_gb + data_gb
    workload: dict[str, Any] = {
        "jobs": jobs,
        "image_gb": IMAGE_GB,
        "model_gb": pulled_gb,
        "train_seconds": train_seconds,
        "checkpoint_every_s": CHECKPOINT_EVERY_S,
        "disk_gb": math.ceil(2 * (IMAGE_GB + pulled_gb) + 20),
    }
    download_gb = IMAGE_GB + pulled_gb
    kinds = rng.choices(list(DUD_MIX), weights=list(DUD_MIX.values()), k=duds)
    kinds += rng.choices(list(GOOD_MIX), weights=list(GOOD_MIX.values()), k=goods)
    rng.shuffle(kinds)
    hosts: list[dict[str, Any]] = []
    for i, kind in enumerate(kinds):
        offer = _offer(rng)
        offer.update(gpu_name=name, gpu_ram_gb=vram, dph=round(rng.uniform(lo, hi), 3))
        if kind in GOOD_MIX:
            truth = _healthy(rng, download_gb, slow=kind == "slow")
            pull = _pull_s(download_gb, truth["pull_mbps"])
            if kind == "dies_mid_run":
                truth["dies_at_s"] = round(pull + rng.uniform(120, max(240.0, 0.8 * train_seconds)))
            elif kind == "hangs_mid_run":
                truth["hangs_at_s"] = round(pull + rng.uniform(120, max(240.0, 0.8 * train_seconds)))
        else:
            truth = _dud(rng, kind, offer, download_gb)
        hosts.append(
            {"machine_id": f"p-{10000 + i * 7 + rng.randrange(7)}", "note": kind, "offer": offer, "truth": truth}
        )
    return parse_trace(
        {
            "format": TRACE_FORMAT,
            "name": f"plan-{seed}",
            "description": f"{gpu} hosts, dud rate {dud_rate:.2f}",
            "workload": workload,
            "hosts": hosts,
        },
        source=f"plan seed {seed}",
    )


class SimPlanReplay:
    """The `CampaignReplay` port on the campaign simulator."""

    def gpu_price_ranges(self) -> Mapping[str, tuple[float, float]]:
        return {model: dph for model, (_, _, dph) in _offer_names().items()}

    def replay(
        self,
        *,
        gpu: str,
        dud_rate: float,
        train_seconds: float,
        model_gb: float,
        data_gb: float,
        jobs: int,
        seed: int,
    ) -> dict[str, ReplayOutcome]:
        trace = workload_trace(
            gpu=gpu,
            dud_rate=dud_rate,
            train_seconds=train_seconds,
            model_gb=model_gb,
            data_gb=data_gb,
            jobs=jobs,
            seed=seed,
        )
        out: dict[str, ReplayOutcome] = {}
        for policy in POLICIES:
            r = run_campaign(trace, policy=policy, seed=seed).receipt
            out[policy] = ReplayOutcome(cost_usd=float(r["total_cost_usd"]), jobs_failed=int(r["jobs_failed"]))
        return out
