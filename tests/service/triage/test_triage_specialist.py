"""The shipped specialist, run through `python -m trainer predict` (slow: loads torch and MiniLM)."""

from __future__ import annotations

import pytest

from app.triage.chain import TriageChain
from app.triage.digest import digest
from app.triage.rules import STATES
from app.triage.specialist import (
    DEFAULT_ADAPTER_DIR,
    SpecialistFailed,
    TrainerSpecialist,
    default_specialist,
)

pytestmark = pytest.mark.slow

needs_adapter = pytest.mark.skipif(not (DEFAULT_ADAPTER_DIR / "trainer_meta.json").is_file(),
                                   reason="no specialist adapter shipped in app/triage/log_doctor/adapter")


@needs_adapter
def test_the_shipped_specialist_scores_a_batch_in_one_trainer_call() -> None:
    """Three digests go through one trainer subprocess and come back as scores over the eight states."""
    spec = default_specialist(require_promotion=False)
    assert spec is not None
    logs = [("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n", 5.0),
            ("{'loss': 1.2, 'grad_norm': 0.4, 'learning_rate': 1e-05, 'epoch': 0.3}\n 30%|███ | 300/1000\n", 5.0),
            ("Training completed. Do not forget to share your model on huggingface.co/models =)\n", 4000.0)]
    scores = spec.predict([digest(text, idle) for text, idle in logs])
    assert spec.calls == 1 and len(scores) == 3
    for s in scores:
        assert set(s) == set(STATES)
        assert abs(sum(s.values()) - 1.0) < 1e-3
    assert max(scores[0], key=lambda k: scores[0][k]) == "oom"


@needs_adapter
def test_the_chain_uses_the_specialist_for_the_rules_residue() -> None:
    """An input the rules cannot place is answered by the specialist stage (or flagged for an operator)."""
    spec = TrainerSpecialist(DEFAULT_ADAPTER_DIR)
    res = TriageChain(specialist=spec).triage("Segmentation fault (core dumped)\n", idle_seconds=5)
    assert res.stage in ("specialist", "rules") and res.state in STATES
    assert spec.calls == 1


def test_a_missing_adapter_is_a_clear_failure(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A specialist pointed at an empty directory fails with SpecialistFailed, and the chain still answers."""
    spec = TrainerSpecialist(tmp_path / "nothing-here")
    with pytest.raises(SpecialistFailed):
        spec.predict(["idle fresh | Segmentation fault"])
    res = TriageChain(specialist=spec).triage("Segmentation fault\n", idle_seconds=5)
    assert res.needs_operator and any("specialist unavailable" in n for n in res.notes)
