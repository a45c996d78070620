"""`python -m trainer predict`: base model + adapter, loaded as training loads them; one JSON
line per input row.

classification rows `{"id", "text"}` -> `{"id", "predicted": label, "scores": {label: prob}}`
causal_lm rows `{"id", "prompt"}` (or `{"id", "messages"}`) -> `{"id", "predicted": greedy completion}`
Exit 0 on success, 2 on bad arguments or input (one line on stderr), 1 on any other failure.

`--serve` loads once and answers rows on stdin with one JSON line each on stdout, flushed per line,
until EOF (exit 0). A bad row is answered `{"id": ..., "error": "..."}` and the server goes on.
Everything else that would reach stdout (library prints, C-level writes) goes to stderr, so stdout
carries only answers.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import IO, Any

from trainer.data import prompt_text
from trainer.models import LoadedModel, load_for_inference, read_meta

__all__ = ["main_predict", "main_serve", "predict_rows", "serve"]


class PredictInputError(ValueError):
    pass


def _parse_row(line: str, task: str) -> dict[str, Any]:
    """One input row, checked for its task; PredictInputError says what is wrong."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise PredictInputError(f"not JSON ({e})") from None
    if not isinstance(row, dict) or "id" not in row:
        raise PredictInputError("each row needs an 'id'")
    if task == "classification" and not isinstance(row.get("text"), str):
        raise PredictInputError("classification rows need a 'text' string")
    if task == "causal_lm" and not (isinstance(row.get("prompt"), str) or "messages" in row):
        raise PredictInputError("causal_lm rows need a 'prompt' string or 'messages'")
    return row


def _read_input(path: Path, task: str) -> list[dict[str, Any]]:
    rows = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rows.append(_parse_row(line, task))
            except PredictInputError as e:
                raise PredictInputError(f"{path}:{lineno}: {e}") from None
    return rows


def predict_rows(
    loaded: LoadedModel, rows: list[dict[str, Any]], *, max_seq_len: int, max_new_tokens: int = 32, batch_size: int = 32
) -> list[dict[str, Any]]:
    import torch

    model, tok = loaded.model, loaded.tokenizer
    out: list[dict[str, Any]] = []
    with torch.no_grad():
        if loaded.task == "classification":
            labels = loaded.labels or []
            for i in range(0, len(rows), batch_size):
                chunk = rows[i : i + batch_size]
                enc = tok(
                    [r["text"] for r in chunk],
                    truncation=True,
                    max_length=max_seq_len,
                    padding=True,
                    return_tensors="pt",
                ).to(loaded.device)
                probs = torch.softmax(model(**enc).logits.float(), dim=-1).cpu()
                for row, p in zip(chunk, probs, strict=True):
                    out.append(
                        {
                            "id": row["id"],
                            "predicted": labels[int(p.argmax())],
                            "scores": {label: round(float(p[j]), 6) for j, label in enumerate(labels)},
                        }
                    )
            return out
        for row in rows:
            ids = tok(prompt_text(tok, row), add_special_tokens=False, return_tensors="pt")["input_ids"]
            ids = ids[:, -max_seq_len:].to(loaded.device)
            gen = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id,
            )
            text = tok.decode(gen[0, ids.shape[1] :], skip_special_tokens=True)
            out.append({"id": row["id"], "predicted": text})
    return out


def main_predict(
    *,
    job_dir: Path | None,
    base_model: Path | None,
    adapter: Path | None,
    input_path: Path,
    output_path: Path,
    max_new_tokens: int = 32,
    batch_size: int = 32,
) -> int:
    if adapter is None:
        if job_dir is None:
            print("trainer predict: give --job-dir DIR or --adapter DIR", file=sys.stderr)
            return 2
        adapter = job_dir / "adapter"
    try:
        meta = read_meta(adapter)
        rows = _read_input(input_path, meta["task"])
    except (FileNotFoundError, PredictInputError) as e:
        print(f"trainer predict: {e}", file=sys.stderr)
        return 2
    loaded = load_for_inference(adapter, base_model=base_model)
    preds = predict_rows(
        loaded,
        rows,
        max_seq_len=int(meta.get("max_seq_len", 256)),
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
    )
    tmp = output_path.with_name(output_path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for p in preds:
            fh.write(json.dumps(p, ensure_ascii=False) + "\n")
    tmp.replace(output_path)
    return 0


def serve(loaded: LoadedModel, lines: IO[bytes], out: IO[str], *, max_seq_len: int, max_new_tokens: int = 32) -> int:
    """Answer each JSON line of `lines` with one JSON line on `out`, flushed; the number answered."""
    answered = 0
    for raw in iter(lines.readline, b""):
        line = raw.decode("utf-8", errors="replace")
        if not line.strip():
            continue
        row_id: Any = None
        try:
            row = _parse_row(line, loaded.task)
            row_id = row["id"]
            answer = predict_rows(loaded, [row], max_seq_len=max_seq_len, max_new_tokens=max_new_tokens, batch_size=1)[
                0
            ]
        except PredictInputError as e:
            answer = {"id": row_id, "error": str(e)}
        except Exception as e:  # one row must not end the server
            answer = {"id": row_id, "error": f"{type(e).__name__}: {e}"}
        out.write(json.dumps(answer, ensure_ascii=False) + "\n")
        out.flush()
        answered += 1
    return answered


def main_serve(*, job_dir: Path | None, base_model: Path | None, adapter: Path | None, max_new_tokens: int = 32) -> int:
    """`predict --serve`: load base model + adapter once, answer stdin until EOF."""
    if adapter is None:
        if job_dir is None:
            print("trainer predict: give --job-dir DIR or --adapter DIR", file=sys.stderr)
            return 2
        adapter = job_dir / "adapter"
    try:
        meta = read_meta(adapter)
    except FileNotFoundError as e:
        print(f"trainer predict: {e}", file=sys.stderr)
        return 2
    # stdout carries answers only: anything else printed (Python or C) goes to stderr
    sys.stdout.flush()
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    loaded = load_for_inference(adapter, base_model=base_model)
    labels = ",".join(loaded.labels or []) or "-"
    print(f"trainer predict: serving task={loaded.task} labels={labels}", file=sys.stderr, flush=True)
    n = serve(
        loaded, sys.stdin.buffer, answers, max_seq_len=int(meta.get("max_seq_len", 256)), max_new_tokens=max_new_tokens
    )
    answers.close()
    print(f"trainer predict: end of input after {n} rows", file=sys.stderr, flush=True)
    return 0
