"""Quarantine arithmetic the main tests leave undriven: a shorter quarantine never shortens a longer one."""

from __future__ import annotations

from app.policy.reputation import DEFAULT_QUARANTINE_S, MachineRecord, is_quarantined, record_failure


def test_a_run_loss_does_not_shorten_a_boot_quarantine_under_way() -> None:
    """A machine out for 30 days after a boot failure stays out that long when it is later lost under training."""
    rec = record_failure(MachineRecord("m1"), reason="boot_fatal", now=0.0)
    assert rec.quarantined_until == DEFAULT_QUARANTINE_S
    rec = record_failure(rec, reason="lost", now=10.0)
    assert rec.quarantined_until == DEFAULT_QUARANTINE_S and rec.quarantine_reason == "boot_fatal"
    assert rec.failure_count == 2
    assert is_quarantined(rec, now=2 * 24 * 3600.0)
