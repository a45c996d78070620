"""Moved: the campaign simulator is `providers.sim.campaign` (a driver, not a Celery worker)."""

from providers.sim.campaign import (
    POLICIES,
    CampaignResult,
    is_dead_host,
    run_campaign,
    run_campaign_file,
)

__all__ = ["POLICIES", "CampaignResult", "is_dead_host", "run_campaign", "run_campaign_file"]
