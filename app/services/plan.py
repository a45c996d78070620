"""What `tuneharness plan` answers: what a workload would cost on a hyperscaler, on the marketplace
as a naive renter, and on the marketplace guarded, each as a median with a p10-p90 band and one
sentence that says where the figure comes from.

- Hyperscaler: GPU-hours times the on-demand prices of a dated table with a source per row
  (`app/data/hyperscaler_prices.json`); the band runs from the cheapest sourced provider to the
  dearest. A GPU model without a sourced price gets no figure, never an estimate.
- Naive and guarded: the campaign simulator replayed over many seeds (`CampaignReplay`, whose
  adapter is `providers.sim.plan.SimPlanReplay`), each seed a generated marketplace of the
  workload's GPU model at the dud rate our own reputation data observed (duds among rentals that
  reached a verdict), or the field reports' 62 of 100 when we have observed none.

Everything here is deterministic for fixed seeds: the replay draws only from its seed.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, Protocol

from app.errors import UserError
from app.policy.gpus import canonical_gpu
from app.policy.reputation import BOOT_FAILURES, PREFLIGHT_FAILURES, MachineRecord

__all__ = [
    "DEFAULT_SEEDS",
    "FIELD_REPORT_DUD_RATE",
    "Band",
    "CampaignReplay",
    "DudRate",
    "Plan",
    "PlanWorkload",
    "PriceRow",
    "ReplayOutcome",
    "band",
    "choose_dud_rate",
    "hyperscaler_band",
    "load_price_table",
    "make_plan",
    "observed_dud_rate",
    "plan_gpu",
    "validate_workload",
]

DEFAULT_SEEDS = 30  # enough for a p10-p90 band that moves by cents between seed sets, in a few seconds
FIELD_REPORT_DUD_RATE = 0.62
FIELD_REPORT = "the field reports' 62 of 100 creates that never delivered a working GPU (18 days, one marketplace)"
MAX_DUD_RATE = 0.95  # above this a replay would need hundreds of duds per healthy host
# A rental that failed at boot or at the preflight never delivered a GPU: a dud. Failures during
# training (lost, hang, train_failed) happened on a host that had delivered one.
DUD_REASONS = BOOT_FAILURES | PREFLIGHT_FAILURES


@dataclass(frozen=True, slots=True)
class PlanWorkload:
    gpu: str  # the plan's model key (`plan_gpu`): H100, A100, L4, A10G, RTX 3090, ...
    train_hours: float  # per job, on a healthy card of that model
    model_gb: float
    data_gb: float
    jobs: int


@dataclass(frozen=True, slots=True)
class ReplayOutcome:
    """One policy's campaign on one seed: what the marketplace billed, and jobs left unfinished."""

    cost_usd: float
    jobs_failed: int


class CampaignReplay(Protocol):
    """The campaign simulator as the plan drives it (adapter: `providers.sim.plan.SimPlanReplay`)."""

    def gpu_price_ranges(self) -> Mapping[str, tuple[float, float]]:
        """Plan model -> the simulated marketplace's hourly price range for it (models it lists)."""
        ...

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
    ) -> Mapping[str, ReplayOutcome]:
        """One seed's generated marketplace through the naive and the guarded policy."""
        ...


@dataclass(frozen=True, slots=True)
class PriceRow:
    gpu: str
    provider: str
    instance: str
    usd_per_gpu_hour: float
    as_of: str
    source: str
    note: str


@dataclass(frozen=True, slots=True)
class DudRate:
    rate: float
    origin: str  # "override" | "reputation" | "field_reports"
    duds: int = 0
    delivered: int = 0
    machines: int = 0

    def describe(self) -> str:
        if self.origin == "override":
            return f"dud rate {self.rate:.2f} as given by --dud-rate"
        if self.origin == "reputation":
            return (
                f"dud rate {self.rate:.2f} as our reputation data observed it "
                f"({self.duds} duds of {self.duds + self.delivered} rentals on {self.machines} machines)"
            )
        return f"dud rate {self.rate:.2f} from {FIELD_REPORT}, our reputation data having observed none"


@dataclass(frozen=True, slots=True)
class Band:
    """One option's figure for the whole workload; all None when there is no figure."""

    median_usd: float | None
    p10_usd: float | None
    p90_usd: float | None
    provenance: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "median_usd": self.median_usd,
            "p10_usd": self.p10_usd,
            "p90_usd": self.p90_usd,
            "provenance": self.provenance,
        }


@dataclass(frozen=True, slots=True)
class Plan:
    workload: PlanWorkload
    dud_rate: DudRate
    seeds: int
    hyperscaler: Band
    naive: Band
    guarded: Band
    unfinished_runs: Mapping[str, int]  # policy -> seeds on which some job did not finish

    def to_dict(self) -> dict[str, Any]:
        w = self.workload
        return {
            "workload": {
                "gpu": w.gpu,
                "train_hours": w.train_hours,
                "model_gb": w.model_gb,
                "data_gb": w.data_gb,
                "jobs": w.jobs,
            },
            "dud_rate": {
                "rate": self.dud_rate.rate,
                "origin": self.dud_rate.origin,
                "duds": self.dud_rate.duds,
                "delivered": self.dud_rate.delivered,
                "machines": self.dud_rate.machines,
            },
            "seeds": self.seeds,
            "hyperscaler": self.hyperscaler.to_dict(),
            "naive": self.naive.to_dict(),
            "guarded": self.guarded.to_dict(),
            "unfinished_runs": dict(self.unfinished_runs),
        }


# -- inputs -------------------------------------------------------------------------------------


def plan_gpu(name: str) -> str:
    """The plan's key for a GPU model: the canonical name, with H100 and A100 variants folded into
    one (a price table row for `A100` covers the PCIe and SXM parts alike)."""
    key = canonical_gpu(name)
    for family in ("H100", "A100"):
        if key.startswith(family):
            return family
    return key


def load_price_table() -> tuple[PriceRow, ...]:
    """The shipped, dated hyperscaler price table."""
    text = resources.files("app.data").joinpath("hyperscaler_prices.json").read_text(encoding="utf-8")
    return tuple(
        PriceRow(
            gpu=plan_gpu(str(r["gpu"])),
            provider=str(r["provider"]),
            instance=str(r["instance"]),
            usd_per_gpu_hour=float(r["usd_per_gpu_hour"]),
            as_of=str(r["as_of"]),
            source=str(r["source"]),
            note=str(r.get("note", "")),
        )
        for r in json.loads(text)["rows"]
    )


def _finite(value: float, option: str, *, positive: bool, example: str) -> None:
    bad = not math.isfinite(value) or value < 0 or (positive and value == 0)
    if bad:
        need = "a positive number" if positive else "0 or a positive number"
        raise UserError(f"{option} must be {need}, got {value}. Fix: pass e.g. {option} {example}")


def validate_workload(
    *,
    gpu: str,
    train_hours: float,
    model_gb: float,
    data_gb: float,
    jobs: int,
    seeds: int,
    dud_rate: float | None,
    known_gpus: Iterable[str],
) -> PlanWorkload:
    """The workload, or a `UserError` naming the option and the fix (NaN, negative, unknown GPU)."""
    _finite(train_hours, "--train-hours", positive=True, example="2")
    _finite(model_gb, "--model-gb", positive=False, example="15")
    _finite(data_gb, "--data-gb", positive=False, example="1")
    if jobs < 1:
        raise UserError(f"--jobs must be at least 1, got {jobs}. Fix: pass e.g. --jobs 5")
    if seeds < 1:
        raise UserError(f"--seeds must be at least 1, got {seeds}. Fix: pass e.g. --seeds {DEFAULT_SEEDS}")
    if dud_rate is not None and not (math.isfinite(dud_rate) and 0 <= dud_rate <= MAX_DUD_RATE):
        raise UserError(f"--dud-rate must be a fraction from 0 to {MAX_DUD_RATE}, got {dud_rate}. Fix: e.g. 0.62")
    key = plan_gpu(gpu)
    known = sorted(set(known_gpus))
    if key not in known:
        raise UserError(f"--gpu {gpu!r} is not a GPU model the plan knows. Fix: pass one of {', '.join(known)}")
    return PlanWorkload(gpu=key, train_hours=train_hours, model_gb=model_gb, data_gb=data_gb, jobs=jobs)


# -- the dud rate -------------------------------------------------------------------------------


def observed_dud_rate(records: Iterable[MachineRecord]) -> DudRate | None:
    """Duds among the rentals our reputation data saw reach a verdict, or None when it saw none.

    A dud is a rental that failed at boot or at the preflight; a delivery one that passed the
    preflight. Rentals still booting, and failures during training, are neither.
    """
    duds = delivered = machines = 0
    for r in records:
        d = sum(1 for reason, _ in r.failures if reason in DUD_REASONS)
        if d or r.delivered:
            machines += 1
        duds += d
        delivered += r.delivered
    if duds + delivered == 0:
        return None
    return DudRate(duds / (duds + delivered), "reputation", duds=duds, delivered=delivered, machines=machines)


def choose_dud_rate(*, override: float | None, observed: DudRate | None) -> DudRate:
    """--dud-rate, else what our reputation data observed, else the field reports' 62%."""
    if override is not None:
        return DudRate(override, "override")
    if observed is not None:
        return observed
    return DudRate(FIELD_REPORT_DUD_RATE, "field_reports")


# -- the figures --------------------------------------------------------------------------------


def band(values: Sequence[float], provenance: str) -> Band:
    """Median and p10-p90 (inclusive deciles) of the values, rounded to cents."""
    xs = sorted(values)
    if len(xs) == 1:
        lo = mid = hi = xs[0]
    else:
        deciles = statistics.quantiles(xs, n=10, method="inclusive")
        lo, mid, hi = deciles[0], statistics.median(xs), deciles[8]
    return Band(round(mid, 2), round(lo, 2), round(hi, 2), provenance)


def hyperscaler_band(rows: Iterable[PriceRow], w: PlanWorkload) -> Band:
    """GPU-hours times each sourced provider's on-demand price; p10 and p90 are the cheapest and
    the dearest provider, the median their median."""
    mine = sorted((r for r in rows if r.gpu == w.gpu), key=lambda r: r.usd_per_gpu_hour)
    gpu_hours = w.train_hours * w.jobs
    if not mine:
        return Band(None, None, None, f"No sourced price: the dated table has no on-demand {w.gpu} row.")
    costs = [r.usd_per_gpu_hour * gpu_hours for r in mine]
    cited = "; ".join(
        f"{r.provider} {r.instance} ${r.usd_per_gpu_hour:g}/GPU-h as of {r.as_of} ({r.source})" for r in mine
    )
    provenance = (
        f"{gpu_hours:g} GPU-hours at on-demand prices, no duds, storage or traffic counted, the band "
        f"spanning the cheapest to the dearest sourced provider: {cited}."
    )
    mid = statistics.median(costs)
    return Band(round(mid, 2), round(costs[0], 2), round(costs[-1], 2), provenance)


def _market_provenance(policy: str, w: PlanWorkload, rate: DudRate, seeds: int, dph: tuple[float, float]) -> str:
    how = (
        "renting the cheapest offer and trusting its status line"
        if policy == "naive"
        else "with boot watch, preflight, reputation and recoveries"
    )
    return (
        f"The marketplace's own bills in {seeds} seeded replays of the campaign simulator ({policy} policy, {how}) "
        f"of {w.jobs} job(s) of {w.train_hours:g} h on generated {w.gpu} marketplaces at "
        f"${dph[0]:g}-{dph[1]:g}/h, with the {rate.describe()}."
    )


def make_plan(
    w: PlanWorkload,
    *,
    dud_rate: DudRate,
    seeds: int,
    replay: CampaignReplay,
    prices: Sequence[PriceRow],
) -> Plan:
    """The three figures for the workload: seeds 0..seeds-1 of the replay, the price table."""
    ranges = replay.gpu_price_ranges()
    hyper = hyperscaler_band(prices, w)
    unfinished = {"naive": 0, "guarded": 0}
    if w.gpu not in ranges:
        listed = ", ".join(sorted(ranges))
        none = (
            f"No marketplace figure: the simulated marketplace lists no {w.gpu} offers "
            f"(it lists {listed}), and a price for it would be invented."
        )
        naive = guarded = Band(None, None, None, none)
    else:
        costs: dict[str, list[float]] = {"naive": [], "guarded": []}
        for seed in range(seeds):
            out = replay.replay(
                gpu=w.gpu,
                dud_rate=dud_rate.rate,
                train_seconds=w.train_hours * 3600.0,
                model_gb=w.model_gb,
                data_gb=w.data_gb,
                jobs=w.jobs,
                seed=seed,
            )
            for policy in costs:
                costs[policy].append(out[policy].cost_usd)
                unfinished[policy] += 1 if out[policy].jobs_failed else 0
        naive = band(costs["naive"], _market_provenance("naive", w, dud_rate, seeds, ranges[w.gpu]))
        guarded = band(costs["guarded"], _market_provenance("guarded", w, dud_rate, seeds, ranges[w.gpu]))
    return Plan(w, dud_rate, seeds, hyper, naive, guarded, unfinished)
