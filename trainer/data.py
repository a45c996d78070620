"""Training rows, their encoding, and the data order.

The order is a pure function of (seed, global sample index): sample k of the run is row
`permutation(seed, epoch=k // n)[k % n]`. Step s (0-based) consumes samples
`[s * batch * accum, (s + 1) * batch * accum)`. So the data position is the step, and a resumed
run sees exactly the batches an uninterrupted run would.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "Encoded",
    "RowError",
    "batch_indices",
    "collate",
    "encode_rows",
    "label_set",
    "read_rows",
    "split_rows",
]


class RowError(ValueError):
    """A data file holds a row the task cannot use."""


@dataclass(frozen=True, slots=True)
class Encoded:
    input_ids: list[int]
    labels: list[int] | int  # per-token labels (causal_lm) or a class index (classification)


def read_rows(path: Path, *, task: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise RowError(f"{path}:{lineno}: not JSON ({e})") from None
            if not isinstance(row, dict):
                raise RowError(f"{path}:{lineno}: a row must be a JSON object")
            _check_row(row, task=task, where=f"{path}:{lineno}")
            rows.append(row)
    if not rows:
        raise RowError(f"{path}: no rows")
    return rows


def _check_row(row: dict[str, Any], *, task: str, where: str) -> None:
    if task == "classification":
        if not isinstance(row.get("text"), str) or not isinstance(row.get("label"), str):
            raise RowError(f"{where}: classification rows need string fields 'text' and 'label'")
    elif "messages" in row:
        msgs = row["messages"]
        if (
            not isinstance(msgs, list)
            or not msgs
            or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in msgs
            )
        ):
            raise RowError(f"{where}: 'messages' must be a list of {{role, content}} strings")
        if msgs[-1]["role"] != "assistant":
            raise RowError(f"{where}: the last message must be the assistant's (it is what is learned)")
    elif not isinstance(row.get("prompt"), str) or not isinstance(row.get("completion"), str):
        raise RowError(f"{where}: causal_lm rows need 'prompt' and 'completion' strings, or 'messages'")


def split_rows(n_rows: int, *, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(train, validation) row indices: a fixed share of the rows, chosen by `seed` alone, held out.

    The split depends on (n_rows, fraction, seed) only, never on the training seed, so experiments
    with different training seeds are measured on the same rows; at least one row stays on each side.
    """
    import math
    import random

    if fraction <= 0.0 or n_rows < 2:
        return list(range(n_rows)), []
    n_val = min(n_rows - 1, max(1, math.ceil(n_rows * fraction)))
    order = list(range(n_rows))
    random.Random(seed).shuffle(order)
    held = set(order[:n_val])
    return [i for i in range(n_rows) if i not in held], sorted(held)


def label_set(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The sorted label strings of classification rows (index = class id)."""
    return sorted({str(r["label"]) for r in rows})


def prompt_text(tokenizer: Any, row: dict[str, Any]) -> str:
    """The prompt part of a causal_lm row as the model sees it (also used by predict)."""
    if "messages" in row:
        msgs = row["messages"]
        history = msgs[:-1] if msgs and msgs[-1]["role"] == "assistant" else msgs
        if getattr(tokenizer, "chat_template", None):
            return str(tokenizer.apply_chat_template(history, tokenize=False, add_generation_prompt=True))
        return "".join(f"{m['role']}: {m['content']}\n" for m in history) + "assistant: "
    return str(row["prompt"])


def encode_rows(
    rows: Sequence[dict[str, Any]], tokenizer: Any, *, task: str, max_seq_len: int, labels: list[str] | None = None
) -> list[Encoded]:
    out: list[Encoded] = []
    if task == "classification":
        assert labels is not None
        index = {label: i for i, label in enumerate(labels)}
        for row in rows:
            ids = tokenizer(row["text"], truncation=True, max_length=max_seq_len)["input_ids"]
            out.append(Encoded(list(ids), index[row["label"]]))
        return out
    eos = tokenizer.eos_token_id
    for row in rows:
        completion = row["messages"][-1]["content"] if "messages" in row else row["completion"]
        p_ids = tokenizer(prompt_text(tokenizer, row), add_special_tokens=False)["input_ids"]
        c_ids = tokenizer(completion, add_special_tokens=False)["input_ids"] + ([eos] if eos is not None else [])
        p_ids, c_ids = _fit(list(p_ids), list(c_ids), max_seq_len)
        ids = p_ids + c_ids
        token_labels = [-100] * len(p_ids) + c_ids
        out.append(Encoded(ids, token_labels))
    return out


def _fit(p_ids: list[int], c_ids: list[int], limit: int) -> tuple[list[int], list[int]]:
    """Cut to `limit` tokens, keeping the start of the completion and the end of the prompt."""
    if len(p_ids) + len(c_ids) <= limit:
        return p_ids, c_ids
    keep_c = max(min(len(c_ids), limit - len(p_ids)), min(len(c_ids), limit // 2))
    c_ids = c_ids[:keep_c]
    keep_p = limit - len(c_ids)
    return (p_ids[-keep_p:] if keep_p > 0 else []), c_ids


def batch_indices(*, seed: int, step: int, per_step: int, n_rows: int) -> list[int]:
    """Row indices consumed by step `step` (0-based); see the module docstring."""
    import torch

    first = step * per_step
    result: list[int] = []
    cached_epoch = -1
    perm: list[int] = []
    for k in range(first, first + per_step):
        epoch = k // n_rows
        if epoch != cached_epoch:
            gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
            perm = torch.randperm(n_rows, generator=gen).tolist()
            cached_epoch = epoch
        result.append(perm[k % n_rows])
    return result


def collate(items: Sequence[Encoded], *, pad_id: int, task: str) -> dict[str, Any]:
    """Right-pad a micro-batch into tensors; padded positions carry no loss."""
    import torch

    width = max(len(e.input_ids) for e in items)
    ids = torch.full((len(items), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(items), width), dtype=torch.long)
    for i, e in enumerate(items):
        ids[i, : len(e.input_ids)] = torch.tensor(e.input_ids)
        mask[i, : len(e.input_ids)] = 1
    if task == "classification":
        labels = torch.tensor([e.labels for e in items])
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}
    tok_labels = torch.full((len(items), width), -100, dtype=torch.long)
    for i, e in enumerate(items):
        assert isinstance(e.labels, list)
        tok_labels[i, : len(e.labels)] = torch.tensor(e.labels)
    return {"input_ids": ids, "attention_mask": mask, "labels": tok_labels}
