"""Celery shells of research runs (docs/research.md): `research_tick`, one chain per run, and the
`research_sweep` beat runs to re-arm a chain lost with a control plane.

Thin: the tick claims its sequence number (a duplicate is dropped), calls
`app.services.research.ResearchService.tick`, and re-enqueues itself with a countdown while the run
goes on (never sleeping in a task). Everything it decides is in `app.policy.research`.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from typing import Any

from app import bootstrap
from app.liveness import record_success
from app.researchstore import ResearchBusy
from workers.tasks import task

__all__ = ["TICK_S", "research_sweep", "research_tick", "tick_s"]

# Wall seconds between looks at a run's experiments (TUNEHARNESS_RESEARCH_TICK_S overrides it).
TICK_S = 10.0
# A run whose last tick is older than this has lost its chain: the sweep re-arms it.
STALE_S = 300.0
# How long a tick waits for another writer of its run before it leaves the look to the next tick.
TICK_WAIT_S = 10.0


def tick_s(env: Mapping[str, str] | None = None) -> float:
    """TUNEHARNESS_RESEARCH_TICK_S, else TICK_S; a value that is not a positive number is refused, naming it."""
    from app.errors import SettingsError

    raw = (os.environ if env is None else env).get("TUNEHARNESS_RESEARCH_TICK_S")
    if raw is None:
        return TICK_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= 900):
        raise SettingsError("TUNEHARNESS_RESEARCH_TICK_S", f"{raw!r} is not a number of seconds", "write 0.5 to 900")
    return value


@task("maintenance", "research_tick")
def research_tick(self: Any, run_id: str, seq: int = 0) -> dict[str, Any]:
    """One look at a research run: start it, judge the experiments that ended, launch the next."""
    svc = bootstrap.research()
    if not svc.claim_tick(run_id, seq):
        return {"run": run_id, "seq": seq, "dropped": True}
    try:
        going_on = svc.tick(run_id, wait_s=TICK_WAIT_S)
    except ResearchBusy:  # a stop, or a tick whose worker died holding the run: look again next time
        going_on = True
    if going_on:
        research_tick.apply_async(args=[run_id, seq + 1], countdown=tick_s())
    return {"run": run_id, "seq": seq, "going_on": going_on}


@task("maintenance", "research_sweep", guard_deliveries=False)
def research_sweep(self: Any) -> list[str]:
    """Re-arm the tick chain of every active run whose last tick is older than STALE_S."""
    svc = bootstrap.research()
    rearmed = []
    for run_id in svc.runs():
        seq = svc.stale(run_id, older_than_s=STALE_S)
        if seq is not None:
            research_tick.apply_async(args=[run_id, seq])
            rearmed.append(run_id)
    record_success(bootstrap.engine(), "research-runs", time.time())
    return rearmed
