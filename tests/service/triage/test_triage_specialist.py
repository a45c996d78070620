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

needs_adapter = pytest.mark.skipif(
    not (DEFAULT_ADAPTER_DIR / "trainer_meta.json").is_file(),
    reason="no specialist adapter shipped in app/triage/log_doctor/adapter",
)


@needs_adapter
def test_the_shipped_specialist_scores_a_batch_in_one_trainer_call() -> None:
    """Three digests go through one trainer subprocess and come back as scores over the eight states."""
    spec = default_specialist(require_promotion=False)
    assert spec is not None
    logs = [
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n", 5.0),
        ("{'loss': 1.2, 'grad_norm': 0.4, 'learning_rate': 1e-05, 'epoch': 0.3}\n 30%|███ | 300/1000\n", 5.0),
        ("Training completed. Do not forget to share your model on huggingface.co/models =)\n", 4000.0),
    ]
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


@needs_adapter
def test_the_serving_specialist_loads_once_for_many_calls_and_agrees_with_the_batch_form() -> None:
    """Two predict calls on one `trainer predict --serve` process start it once and give the batch form's answers."""
    from app.triage.specialist import ServingSpecialist

    texts = [
        digest("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n", 5.0),
        digest("RuntimeError: CUDA error: an illegal memory access was encountered\n", 5.0),
    ]
    batch = TrainerSpecialist(DEFAULT_ADAPTER_DIR).predict(texts)
    with ServingSpecialist(DEFAULT_ADAPTER_DIR) as served:
        first = served.predict(texts[:1])
        second = served.predict(texts[1:])
        assert served.starts == 1
    for got, want in zip([*first, *second], batch, strict=True):
        assert set(got) == set(STATES)
        assert max(got, key=lambda k: got[k]) == max(want, key=lambda k: want[k])


def test_a_serving_specialist_without_an_adapter_fails_clearly(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A server pointed at an empty directory exits; the caller gets SpecialistFailed naming the cause."""
    from app.triage.specialist import ServingSpecialist

    with ServingSpecialist(tmp_path / "nothing-here", timeout_s=60) as served, pytest.raises(SpecialistFailed):
        served.predict(["idle fresh | Segmentation fault"])
