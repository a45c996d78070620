"""A host's price increase on a running contract, answered from the job's own limit: pure.

Vast lets a host ask a higher price for an instance already rented; the increase applies from the
end of the current term unless the renter rejects it. The rule: reject when the new all-in $/h is
above the job's max price (`needs.max_usd_per_hour` in the job file), or when the new price cannot
be read (never agree to an unknown price); accept otherwise. A job without a max price accepts.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = ["PriceAnswer", "PriceIncreaseDecision", "decide_price_increase"]


class PriceAnswer(StrEnum):
    ACCEPT = "accept"
    REJECT = "reject"


@dataclass(frozen=True, slots=True)
class PriceIncreaseDecision:
    answer: PriceAnswer
    reason: str


def decide_price_increase(
    *, new_usd_per_hour: float | None, max_usd_per_hour: float | None, old_usd_per_hour: float | None = None
) -> PriceIncreaseDecision:
    """Accept or reject one increase against the job's max price (both all-in $/h)."""
    was = "" if old_usd_per_hour is None else f" from ${old_usd_per_hour:.4f}/h"
    if new_usd_per_hour is None:
        return PriceIncreaseDecision(PriceAnswer.REJECT, f"the new price{was} cannot be read")
    to = f"${new_usd_per_hour:.4f}/h{was}"
    if max_usd_per_hour is None:
        return PriceIncreaseDecision(PriceAnswer.ACCEPT, f"{to}: the job sets no max price")
    if new_usd_per_hour > max_usd_per_hour:
        return PriceIncreaseDecision(PriceAnswer.REJECT, f"{to} is above the job's max price ${max_usd_per_hour:.4f}/h")
    return PriceIncreaseDecision(PriceAnswer.ACCEPT, f"{to} is within the job's max price ${max_usd_per_hour:.4f}/h")
