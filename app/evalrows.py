"""When an evaluation row is the same example as a training row: one content hash, used by the job
file's check at submit (`app.jobs`) and by the gate before any predictor runs (`gate.evaluate`).

A model scored on examples it was trained on proves nothing, so either place refuses such rows and
names them. Two inputs are the same example when their words are the same, whatever the spacing.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path

__all__ = ["content_hash", "leak_message", "leaked_rows", "training_hashes", "training_inputs"]

SHOWN = 20  # rows named in a refusal; the rest are counted


def content_hash(text: str) -> str:
    """What makes two inputs the same example: their words, whatever the spacing."""
    return hashlib.sha256(" ".join(text.split()).encode("utf-8")).hexdigest()


def training_inputs(row: object) -> list[str]:
    """The inputs a training row teaches: its text or prompt, or each non-assistant message."""
    if not isinstance(row, dict):
        return []
    found = [row[k] for k in ("text", "prompt") if isinstance(row.get(k), str)]
    messages = row.get("messages")
    if isinstance(messages, list):
        found += [
            m["content"]
            for m in messages
            if isinstance(m, dict) and m.get("role") != "assistant" and isinstance(m.get("content"), str)
        ]
    return found


def training_hashes(paths: Sequence[Path]) -> dict[str, str]:
    """{content hash: "path:line"} over the training files' inputs (the first place each appears).

    A line that is not JSON is skipped: the trainer refuses such a file itself. Raises OSError or
    UnicodeDecodeError when a file cannot be read; the caller words that for its user.
    """
    seen: dict[str, str] = {}
    for path in paths:
        with open(path, encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, start=1):
                try:
                    row = json.loads(line) if line.strip() else None
                except json.JSONDecodeError:
                    continue
                for text in training_inputs(row):
                    seen.setdefault(content_hash(text), f"{path}:{lineno}")
    return seen


def leaked_rows(rows: Iterable[tuple[str, str]], seen: dict[str, str]) -> list[tuple[str, str]]:
    """[(eval row id, where the training data holds it)] for each (id, input) found in `seen`."""
    return [(row_id, seen[h]) for row_id, text in rows if (h := content_hash(text)) in seen]


def leak_message(leaked: Sequence[tuple[str, str]]) -> str:
    """One sentence naming the leaked rows (at most SHOWN of them, the rest counted)."""
    shown = ", ".join(f"{i} (= {where})" for i, where in leaked[:SHOWN])
    more = f" and {len(leaked) - SHOWN} more" if len(leaked) > SHOWN else ""
    return f"{len(leaked)} eval row(s) also appear in the training data: {shown}{more}"
