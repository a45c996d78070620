"""After an out-of-memory death the micro-batch halves and the accumulation doubles (the effective
batch, hence the data order, unchanged), at most twice; then the job stops naming the fix."""

from __future__ import annotations

import pytest

from app.policy.supervision import MAX_OOM_HALVINGS, halve_micro_batch


def test_half_the_micro_batch_twice_the_accumulation_same_effective_batch() -> None:
    assert halve_micro_batch(8, 1, halvings=0) == (4, 2)
    assert halve_micro_batch(4, 2, halvings=1) == (2, 4)
    b, a = halve_micro_batch(6, 3, halvings=0)  # type: ignore[misc]
    assert b * a == 6 * 3


def test_at_most_twice_then_the_job_stops_naming_the_fix() -> None:
    assert MAX_OOM_HALVINGS == 2
    why = halve_micro_batch(2, 4, halvings=2)
    assert isinstance(why, str) and "2 times" in why and "2 x 4" in why and "Fix:" in why


@pytest.mark.parametrize("batch", [1, 3, 5])
def test_a_micro_batch_that_cannot_be_halved_evenly_stops(batch: int) -> None:
    why = halve_micro_batch(batch, 1, halvings=0)
    assert isinstance(why, str) and f"micro-batch of {batch}" in why and "Fix:" in why
