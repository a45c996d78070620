"""The campaign simulator: a whole campaign of jobs replayed in virtual time against the simulated
marketplace, through the same policy and the same interpreter as the Celery fleet; the receipt
comes from the marketplace's own billing and truth (docs/simulation.md).

    run_campaign(trace, policy="guarded")   -> CampaignResult (receipt, decisions, unfinished jobs)
    run_campaign_file(path_or_name, ...)    -> the same, from a trace file or a shipped trace's name
"""

from __future__ import annotations

from providers.sim.campaign.driver import POLICIES, Campaign, CampaignResult, SpeedMemory
from providers.sim.campaign.referee import RECEIPT_FIELDS, is_dead_host
from providers.sim.trace import Trace, load_trace

__all__ = [
    "POLICIES",
    "RECEIPT_FIELDS",
    "Campaign",
    "CampaignResult",
    "SpeedMemory",
    "is_dead_host",
    "run_campaign",
    "run_campaign_file",
]


def run_campaign(
    trace: Trace,
    *,
    policy: str = "guarded",
    jobs: int | None = None,
    seed: int = 0,
    trace_label: str | None = None,
    standby_hosts: int | None = None,
    progress_hedge_max: int | None = None,
    monitor_s: float | None = None,
    known_speeds: SpeedMemory | None = None,
) -> CampaignResult:
    """Replay one campaign in virtual time; the receipt comes from the simulator's referee.

    `standby_hosts` overrides the policy's warm standby pool (default: the policy's, 0);
    `progress_hedge_max` its extra rentals per waiting recovery whose chains pull slowly (default:
    the policy's, 0; naive never hedges); `monitor_s` the supervisor's poll period (default 30 s);
    `known_speeds` the GPU speeds an earlier campaign measured (`CampaignResult.speeds`; default:
    none, a deployment starting cold).
    """
    c = Campaign(
        trace,
        policy,
        jobs=jobs,
        seed=seed,
        trace_label=trace_label or trace.name,
        standby_hosts=standby_hosts,
        progress_hedge_max=progress_hedge_max,
        monitor_s=monitor_s,
        known_speeds=known_speeds,
    )
    receipt = c.run()
    return CampaignResult(
        receipt=receipt,
        ledger=c.ledger,
        unfinished=dict(c.failed),
        recovery_facts=c.recovery_facts,
        speeds={model: {m: list(v) for m, v in machines.items()} for model, machines in c.speeds.items()},
    )


def run_campaign_file(
    path: str,
    *,
    policy: str = "guarded",
    jobs: int | None = None,
    seed: int = 0,
    standby_hosts: int | None = None,
    monitor_s: float | None = None,
) -> CampaignResult:
    """`run_campaign` on a trace file (or a shipped trace's name)."""
    trace = load_trace(path)
    return run_campaign(
        trace,
        policy=policy,
        jobs=jobs,
        seed=seed,
        trace_label=str(path),
        standby_hosts=standby_hosts,
        monitor_s=monitor_s,
    )
