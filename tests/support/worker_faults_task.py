"""The worker side of the worker-kill fault tests: `-A support.worker_faults_task` starts a worker on
the product's Celery app with the test-only `rent` task (support.rent_task) and `rent_watched`.

`rent_watched` is `rent` with each delivery written down (support.worker_faults.Journal) and, when
TUNEHARNESS_FAULTS_HOLD_AT names a step of the create, the first delivery of each rental held at
that step until the test (or, with TUNEHARNESS_FAULTS_PAIR=1, a second delivery of the same
message) lets it go. The hold is what makes a task outlive its visibility timeout or be in flight
when its worker is killed or told to stop, without changing any of the product's timings.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from celery.exceptions import Retry

from app import bootstrap
from app.market import OfferGone, ProviderBusy
from app.rentals import Rentals
from support.rent_task import MAX_CREATE_RETRIES, app, rent
from support.worker_faults import HOLD_AT_VAR, PAIR_VAR, Journal
from workers.tasks import task

__all__ = ["app", "rent", "rent_watched"]


def _hold_hook(journal: Journal, rental_id: str, ordinal: int) -> Callable[[str], None]:
    step_to_hold = os.environ.get(HOLD_AT_VAR)
    pair = os.environ.get(PAIR_VAR) == "1"

    def hook(step: str) -> None:
        if step == step_to_hold:
            journal.hold(rental_id, ordinal, pair=pair)

    return hook


def _create_once(self: Any, rental_id: str, fault: Callable[[str], None]) -> dict[str, Any]:
    """support.rent_task.rent's body, with `fault` as the create's hook."""
    rentals = Rentals(bootstrap.engine())
    rental = rentals.get(rental_id)
    if rental is None:
        return {"rental": rental_id, "state": "unknown"}
    market = bootstrap.market(rental.provider)
    try:
        done = rentals.execute(rental_id, market=market, now=time.time(), fault=fault)
    except ProviderBusy as exc:
        if self.request.retries >= MAX_CREATE_RETRIES:
            rentals.abandon(rental_id, reason=f"provider busy: {exc}", now=time.time())
            return {"rental": rental_id, "state": "abandoned"}
        raise self.retry(exc=exc, countdown=min(60, 5 * 2**self.request.retries)) from None
    except OfferGone as exc:
        rentals.abandon(rental_id, reason=f"offer gone: {exc}", now=time.time())
        return {"rental": rental_id, "state": "abandoned"}
    return {"rental": rental_id, "state": done.state, "instance": done.instance_id}


@task("provision", "rent_watched")  # type: ignore[untyped-decorator]
def rent_watched(self: Any, rental_id: str) -> dict[str, Any]:
    """Create the planned rental at its provider, exactly once, writing each delivery down."""
    journal = Journal.from_env()
    if journal is None:
        return _create_once(self, rental_id, lambda _step: None)
    recorded = Rentals(bootstrap.engine()).get(rental_id)
    ordinal = journal.enter(rental_id, noop=recorded is not None and recorded.instance_id is not None)
    outcome = "unknown"
    try:
        result = _create_once(self, rental_id, _hold_hook(journal, rental_id, ordinal))
        outcome = str(result["state"])
        return result
    except Retry:
        outcome = "retry"
        raise
    except BaseException as exc:  # SystemExit too: how a SIGTERM'd pool child ends its task
        outcome = type(exc).__name__
        raise
    finally:
        journal.leave(rental_id, ordinal, outcome)
