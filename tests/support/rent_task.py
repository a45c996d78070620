"""A test-only Celery task: one create through the rental protocol (`app.rentals`), with a fault
hook that SIGKILLs the worker at a named step. The crash tests start their workers on this module
(`-A support.rent_task`): it is the product's Celery app plus the `rent` task, which the product
itself never sends (provisioning creates inside its own steps)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app import bootstrap
from app.market import OfferGone, ProviderBusy
from app.rentals import Rentals
from workers.celery_app import app
from workers.tasks import task

__all__ = ["app", "chaos_hook", "rent"]

MAX_CREATE_RETRIES = 5


def chaos_hook(rental_id: str) -> Callable[[str], None]:
    """Fault injection for the crash tests: SIGKILL this process once at a named step.

    Armed only when TUNEHARNESS_CHAOS_KILL_AT names a step and TUNEHARNESS_CHAOS_DIR holds the
    markers that make each kill happen once per rental; inert otherwise.
    """
    step_to_kill = os.environ.get("TUNEHARNESS_CHAOS_KILL_AT")
    marker_dir = os.environ.get("TUNEHARNESS_CHAOS_DIR")

    def hook(step: str) -> None:
        if not step_to_kill or not marker_dir or step != step_to_kill:
            return
        marker = Path(marker_dir) / f"{rental_id.replace(':', '_')}.{step}"
        if marker.exists():
            return
        marker.write_text(str(os.getpid()))
        if os.environ.get("TUNEHARNESS_CHAOS_WHOLE_WORKER"):
            os.killpg(os.getpgid(0), signal.SIGKILL)  # the worker's main process too
        os.kill(os.getpid(), signal.SIGKILL)

    return hook


@task("provision", "rent")  # type: ignore[untyped-decorator]
def rent(self: Any, rental_id: str) -> dict[str, Any]:
    """Create the planned rental at its provider, exactly once, however often this runs."""
    rentals = Rentals(bootstrap.engine())
    rental = rentals.get(rental_id)
    if rental is None:
        return {"rental": rental_id, "state": "unknown"}
    market = bootstrap.market(rental.provider)
    try:
        done = rentals.execute(rental_id, market=market, now=time.time(), fault=chaos_hook(rental_id))
    except ProviderBusy as exc:
        if self.request.retries >= MAX_CREATE_RETRIES:
            rentals.abandon(rental_id, reason=f"provider busy: {exc}", now=time.time())
            return {"rental": rental_id, "state": "abandoned"}
        raise self.retry(exc=exc, countdown=min(60, 5 * 2**self.request.retries)) from None
    except OfferGone as exc:
        rentals.abandon(rental_id, reason=f"offer gone: {exc}", now=time.time())
        return {"rental": rental_id, "state": "abandoned"}
    return {"rental": rental_id, "state": done.state, "instance": done.instance_id}
