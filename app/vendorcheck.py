"""Which marketplaces can be used from here: a key present (at submit), a key accepted (doctor).

`unusable(names, build)` is the submit-time check: a provider whose adapter cannot be built (its
key is not set) is skipped with a warning while another remains, and the job is refused when none
does. `check(name, build)` is doctor's read-only call to the vendor (its instance list, like
`sky check`): a refused key, an unreachable API, or fine. Neither rents, stops or spends.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from app.blocking import clean
from app.errors import SettingsError, UserError
from app.market import AuthFailed, Market, MarketError, QuotaExhausted
from app.policy.guardrails import LABEL_PREFIX

__all__ = ["Unusable", "VendorCheck", "check", "unusable"]

BuildMarket = Callable[[str], Market]


@dataclass(frozen=True, slots=True)
class VendorCheck:
    name: str
    ok: bool
    configured: bool  # a key (or, for sim, nothing) is set: the vendor was asked
    detail: str
    fix: str = ""


@dataclass(frozen=True, slots=True)
class Unusable:
    problem: str
    fix: str


def unusable(names: Iterable[str], build: BuildMarket) -> dict[str, Unusable]:
    """The providers among `names` whose adapter cannot be built here (a key not set), with why."""
    out: dict[str, Unusable] = {}
    for name in names:
        try:
            build(name)
        except SettingsError as exc:
            out[name] = Unusable(f"{exc.variable} {exc.problem}", exc.fix)
        except UserError as exc:
            out[name] = Unusable(clean(str(exc)), "see the message")
    return out


def check(name: str, build: BuildMarket) -> VendorCheck:
    """Ask the vendor one read-only question with the configured key; never raises."""
    try:
        market = build(name)
    except SettingsError as exc:
        return VendorCheck(name, True, False, f"not configured: {exc.variable} {exc.problem}", exc.fix)
    except UserError as exc:
        return VendorCheck(name, False, False, clean(str(exc)), "see the message")
    try:
        found = market.list_instances(LABEL_PREFIX)
    except AuthFailed as exc:
        refused = f"key refused: {clean(str(exc))}"
        return VendorCheck(name, False, True, refused, "replace the key, then run doctor again")
    except QuotaExhausted as exc:
        return VendorCheck(name, False, True, clean(str(exc)), "wait for the quota to reset")
    except MarketError as exc:
        return VendorCheck(
            name, False, True, f"unreachable: {clean(str(exc))}", "check the network and the vendor's status page"
        )
    return VendorCheck(name, True, True, f"answered a read-only call: {len(found)} tuneharness instance(s) listed")
