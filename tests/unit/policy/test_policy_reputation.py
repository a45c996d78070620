"""Renter-side reputation: counts, quarantine windows, permanent quarantine, Beta posterior."""

from __future__ import annotations

import pytest

from app.policy.reputation import (
    DEFAULT_QUARANTINE_S,
    DEFAULT_RUN_QUARANTINE_S,
    MachineRecord,
    delivery_probability,
    is_quarantined,
    lift_quarantine,
    record_boot,
    record_create,
    record_failure,
    record_preflight_passed,
    record_slice_finished,
)


def test_counts_accumulate() -> None:
    """Each stage of a rental is counted on the machine's record."""
    rec = MachineRecord("m-1")
    rec = record_create(rec, now=1.0)
    rec = record_boot(rec, now=2.0)
    rec = record_preflight_passed(rec, now=3.0)
    rec = record_slice_finished(rec, now=4.0)
    assert (rec.creates, rec.booted, rec.preflight_passed, rec.slices_finished) == (1, 1, 1, 1)
    assert rec.last_seen_at == 4.0 and rec.delivered == 1


def test_boot_failure_quarantines_for_the_window() -> None:
    """A failed boot keeps the machine out for 30 days, then lets it back."""
    rec = record_failure(MachineRecord("m-1"), reason="boot_frozen", now=100.0)
    assert is_quarantined(rec, now=100.0 + DEFAULT_QUARANTINE_S - 1)
    assert not is_quarantined(rec, now=100.0 + DEFAULT_QUARANTINE_S)
    assert rec.failures == (("boot_frozen", 100.0),)


def test_misreported_hardware_is_permanent_until_lifted() -> None:
    """VRAM short or a wrong GPU stays quarantined until the operator lifts it."""
    rec = record_failure(MachineRecord("m-1"), reason="vram_short", now=0.0)
    assert is_quarantined(rec, now=10 * DEFAULT_QUARANTINE_S)
    lifted = lift_quarantine(rec)
    assert not is_quarantined(lifted, now=1.0)
    assert lifted.failures == rec.failures


def test_training_loss_quarantines_for_the_short_run_window() -> None:
    """A host lost or hung mid-run is kept out for a day; a failed training only lowers the record."""
    for reason in ("lost", "hang"):
        rec = record_failure(MachineRecord("m-1"), reason=reason, now=0.0)
        assert rec.failure_count == 1 and is_quarantined(rec, now=1.0)
        assert not is_quarantined(rec, now=DEFAULT_RUN_QUARANTINE_S)
    rec = record_failure(MachineRecord("m-1"), reason="train_failed", now=0.0)
    assert rec.failure_count == 1 and not is_quarantined(rec, now=1.0)


def test_unknown_reason_is_refused() -> None:
    """A failure reason outside the vocabulary is a programming error."""
    with pytest.raises(ValueError, match="unknown failure reason"):
        record_failure(MachineRecord("m-1"), reason="cosmic_rays", now=0.0)


def test_beta_posterior_moves_with_our_record() -> None:
    """Our own failures outweigh a perfect platform score; our deliveries raise a mediocre one."""
    prior = delivery_probability(platform_reliability=1.0)
    assert prior == pytest.approx(1.0)
    assert delivery_probability(platform_reliability=1.0, failed=2) == pytest.approx(8 / 10)
    assert delivery_probability(platform_reliability=0.5, delivered=8) > 0.7
    assert delivery_probability(platform_reliability=None) == pytest.approx(0.9)
