"""Reconciler and sweep decisions the main guardrail tests leave undriven."""

from __future__ import annotations

from app.policy.guardrails import (
    Adopt,
    Known,
    Listed,
    StopOrphan,
    label_for,
    reconcile,
)

LABEL = label_for("job-1", 1, 9_999_999_999)


def test_a_create_still_in_flight_is_neither_adopted_nor_stopped() -> None:
    """A labelled instance matching an intent younger than the grace is left to its own create task."""
    intent = Known("r-1", LABEL, None, "intent", created_at=100.0)
    listed = [Listed("i-1", LABEL, "running", started_at=100.0, first_seen_at=100.0)]
    assert reconcile(known=[intent], listed=listed, listing_complete=True, now=150.0, orphan_grace_s=120.0) == []
    later = reconcile(known=[intent], listed=listed, listing_complete=True, now=250.0, orphan_grace_s=120.0)
    assert [type(a) for a in later] == [Adopt] and later[0].instance_id == "i-1"


def test_an_unknown_instance_already_stopped_is_left_to_the_operator() -> None:
    """A labelled instance the ledger does not know is stopped only while it runs; a stopped one bills storage only."""
    stopped = [Listed("i-2", LABEL, "stopped", started_at=0.0, first_seen_at=0.0)]
    assert reconcile(known=[], listed=stopped, listing_complete=True, now=10_000.0, orphan_grace_s=120.0) == []
    running = [Listed("i-2", LABEL, "running", started_at=0.0, first_seen_at=0.0)]
    acts = reconcile(known=[], listed=running, listing_complete=True, now=10_000.0, orphan_grace_s=120.0)
    assert [type(a) for a in acts] == [StopOrphan]
