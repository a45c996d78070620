"""The price-increase sweep: answer every pending increase on our instances, one by one.

For each market, the pending increases are read once; each one on an instance we rent is decided
by `app.policy.prices` against its job's max price, answered at the vendor, written down as a
ledger event (`price_increase_accepted` / `price_increase_rejected`, with the new rate) and
alerted. An increase on an instance we do not know is left to the operator. A failing answer for
one increase does not stop the others; one that is no longer pending is counted, not an error.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from app.alerts import Alert, Notifier
from app.jobs import JobStore, spec_from_dict
from app.ledger import Event
from app.market import Market, MarketError, PriceIncrease
from app.policy.prices import PriceAnswer, PriceIncreaseDecision, decide_price_increase
from app.rentals import Rental, Rentals

__all__ = ["MaxPriceOf", "PriceSweepReport", "max_price_from", "sweep_price_increases"]

MaxPriceOf = Callable[[str], "float | None"]  # a job's max all-in $/h (None: no limit)


@dataclass
class PriceSweepReport:
    examined: int = 0
    accepted: list[str] = field(default_factory=list)  # instance ids
    rejected: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)  # no longer pending when answered
    not_ours: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def max_price_from(jobs: JobStore) -> MaxPriceOf:
    """A job's `needs.max_usd_per_hour`, read from its stored job file."""

    def max_price(job_id: str) -> float | None:
        record = jobs.get(job_id)
        return None if record is None else spec_from_dict(record.spec).needs.max_usd_per_hour

    return max_price


def _record(rentals: Rentals, rental: Rental, inc: PriceIncrease, decision: PriceIncreaseDecision) -> None:
    """The answer in the ledger; an accepted increase also becomes the rental's rate (the budget
    monitor's spend follows it), in the same transaction."""
    event = Event(
        kind=f"price_increase_{'accepted' if decision.answer is PriceAnswer.ACCEPT else 'rejected'}",
        job=rental.job,
        instance=inc.instance_id,
        provider=inc.provider,
        machine=rental.machine_id,
        rate_usd_per_hour=inc.new_dph_total,
        reason=decision.reason,
        payload={
            "increase_id": inc.increase_id,
            "old_usd_per_hour": inc.old_dph_total,
            "new_usd_per_hour": inc.new_dph_total,
            "starts_at": inc.starts_at,
            "rental": rental.id,
        },
        idempotency_key=f"price_increase:{inc.provider}:{inc.increase_id}",
    )
    accepted = decision.answer is PriceAnswer.ACCEPT and inc.new_dph_total is not None
    if accepted and rentals.raise_rate(rental.id, rate_usd_per_hour=float(inc.new_dph_total or 0.0), event=event):
        return
    rentals.ledger.append(event)


def _alert(notifier: Notifier | None, rental: Rental, inc: PriceIncrease, decision: PriceIncreaseDecision) -> None:
    if notifier is None:
        return
    verb = "accepted" if decision.answer is PriceAnswer.ACCEPT else "rejected"
    try:
        notifier.notify(
            Alert(
                "price_increase",
                f"{verb} a price increase on {inc.provider} instance {inc.instance_id}: {decision.reason}",
                job=rental.job,
                details={"increase_id": inc.increase_id, "new_usd_per_hour": inc.new_dph_total},
                key=f"price_increase:{inc.provider}:{inc.increase_id}",
            )
        )
    except Exception:  # an alert must never break a sweep
        pass


def sweep_price_increases(
    rentals: Rentals,
    markets: Mapping[str, Market],
    *,
    max_price_of: MaxPriceOf,
    notifier: Notifier | None = None,
) -> PriceSweepReport:
    """Answer every pending price increase on our instances; each answer a ledger event and an alert."""
    report = PriceSweepReport()
    for provider, market in sorted(markets.items()):
        try:
            increases = market.pending_price_increases()
        except MarketError as exc:
            report.errors.append(f"{provider}: reading pending price increases failed: {exc}")
            continue
        for inc in increases:
            report.examined += 1
            rental = rentals.by_instance(provider, inc.instance_id)
            if rental is None:
                report.not_ours.append(inc.instance_id)
                continue
            try:
                limit = max_price_of(rental.job)
                decision = decide_price_increase(
                    new_usd_per_hour=inc.new_dph_total, max_usd_per_hour=limit, old_usd_per_hour=inc.old_dph_total
                )
                answered = market.answer_price_increase(inc, accept=decision.answer is PriceAnswer.ACCEPT)
            except Exception as exc:  # one bad answer (vendor, job file) must not stop the others
                report.errors.append(f"{provider} {inc.instance_id}: {type(exc).__name__}: {exc}")
                continue
            if not answered:
                report.stale.append(inc.instance_id)
                continue
            _record(rentals, rental, inc, decision)
            (report.accepted if decision.answer is PriceAnswer.ACCEPT else report.rejected).append(inc.instance_id)
            _alert(notifier, rental, inc, decision)
    return report
