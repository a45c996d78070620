"""Data order and encoding: a pure function of (seed, step), prompts carry no loss."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.data import RowError, _fit, batch_indices, collate, encode_rows, label_set, read_rows
from trainer.testing import write_jsonl


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 1000), per_step=st.integers(1, 9), n=st.integers(1, 20))
def test_each_epoch_visits_every_row_once(seed: int, per_step: int, n: int) -> None:
    """Concatenated steps cover each epoch as a permutation of all rows."""
    steps = (2 * n + per_step - 1) // per_step
    order = [i for s in range(steps) for i in batch_indices(seed=seed, step=s, per_step=per_step, n_rows=n)]
    assert sorted(order[:n]) == list(range(n))
    assert sorted(order[n : 2 * n]) == list(range(n))


def test_order_depends_on_seed_and_step_only() -> None:
    """The same (seed, step) always yields the same batch; another seed another order."""
    a = batch_indices(seed=3, step=7, per_step=4, n_rows=50)
    assert a == batch_indices(seed=3, step=7, per_step=4, n_rows=50)
    assert [batch_indices(seed=4, step=s, per_step=4, n_rows=50) for s in range(5)] != [
        batch_indices(seed=3, step=s, per_step=4, n_rows=50) for s in range(5)
    ]


def test_truncation_keeps_completion_start_and_prompt_end() -> None:
    """A too-long example keeps the end of the prompt and the start of the completion."""
    p, c = _fit(list(range(10)), [100, 101, 102, 103], 8)
    assert p + c == [6, 7, 8, 9, 100, 101, 102, 103]
    p, c = _fit(list(range(10)), list(range(100, 120)), 8)
    assert len(p) + len(c) == 8 and c[0] == 100 and p[-1] == 9


class _CharTok:
    eos_token_id = 0
    chat_template = None

    def __call__(
        self, text: str, add_special_tokens: bool = True, truncation: bool = False, max_length: int | None = None
    ) -> dict[str, list[int]]:
        ids = [ord(ch) for ch in text]
        return {"input_ids": ids[:max_length] if truncation and max_length else ids}


def test_causal_rows_mask_the_prompt(tmp_path: Path) -> None:
    """Prompt tokens get label -100; completion tokens and the end-of-text token are learned."""
    (enc,) = encode_rows([{"prompt": "ab", "completion": "c"}], _CharTok(), task="causal_lm", max_seq_len=16)
    assert enc.input_ids == [97, 98, 99, 0]
    assert enc.labels == [-100, -100, 99, 0]
    batch = collate(
        [enc, encode_rows([{"prompt": "a", "completion": "b"}], _CharTok(), task="causal_lm", max_seq_len=16)[0]],
        pad_id=5,
        task="causal_lm",
    )
    assert batch["labels"][1].tolist() == [-100, 98, 0, -100]
    assert batch["attention_mask"][1].tolist() == [1, 1, 1, 0]


def test_bad_rows_are_refused_with_line_number(tmp_path: Path) -> None:
    """A classification row without a string label is refused, naming file and line."""
    path = write_jsonl(tmp_path / "t.jsonl", [{"text": "a", "label": "x"}, {"text": "b", "label": 3}])
    with pytest.raises(RowError, match=r"t\.jsonl:2"):
        read_rows(path, task="classification")
    ok = write_jsonl(tmp_path / "ok.jsonl", [{"text": "a", "label": "y"}, {"text": "b", "label": "x"}])
    assert label_set(read_rows(ok, task="classification")) == ["x", "y"]
