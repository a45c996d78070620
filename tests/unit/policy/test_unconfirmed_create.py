"""When a create whose answer was lost is looked for and ended (app.policy.fleet.unconfirmed_create_verdict)."""

from __future__ import annotations

from dataclasses import replace

from app.policy.fleet import unconfirmed_create_verdict
from app.policy.provisioning import guarded_config

CFG = replace(guarded_config(), unconfirmed_guard_s=300.0)


def test_it_waits_while_its_reservation_covers_the_guard_ahead() -> None:
    """Billed plus 300 s of burn below the reservation: wait."""
    assert unconfirmed_create_verdict(billed_usd=0.6, burn_usd_per_s=0.001, reserved_usd=1.0, cfg=CFG) == "wait"


def test_it_ends_once_billed_plus_the_guard_reaches_the_reservation() -> None:
    """At exactly the reservation (0.7 + 300 x 0.001) it ends; a cent less waits."""
    assert unconfirmed_create_verdict(billed_usd=0.7, burn_usd_per_s=0.001, reserved_usd=1.0, cfg=CFG) == "end"
    assert unconfirmed_create_verdict(billed_usd=0.69, burn_usd_per_s=0.001, reserved_usd=1.0, cfg=CFG) == "wait"


def test_a_negative_burn_counts_as_none() -> None:
    """A negative burn never delays the end: only what was billed counts."""
    assert unconfirmed_create_verdict(billed_usd=1.0, burn_usd_per_s=-5.0, reserved_usd=1.0, cfg=CFG) == "end"
    assert unconfirmed_create_verdict(billed_usd=0.9, burn_usd_per_s=-5.0, reserved_usd=1.0, cfg=CFG) == "wait"


def test_the_guard_is_longer_than_the_caps() -> None:
    """Ending an unseen host needs a listing that may fail, so it looks further ahead than the cap's guard."""
    cfg = guarded_config()
    assert cfg.unconfirmed_guard_s >= 3 * cfg.budget_guard_s
