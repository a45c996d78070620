"""Check and split a blind collector's rows into a new real-excerpt batch (dev + test halves).

    .venv/bin/python scripts/split_real_batch.py N ROWS.jsonl [ROWS2.jsonl ...] [--dry-run]

Writes `data/triage/real/devN.jsonl` and `testN.jsonl` (refuses to overwrite either). The
protocol is `data/triage/real/COLLECTING.md`; this is the part after the collector stops, and
it never prints a log, a `why` or a title, so whoever runs it stays blind to the test half:

* a row with `doubt` is set aside unread (only counted);
* a row is dropped when its thread is already used (by an earlier batch or an earlier row here),
  its id is taken, its label is not one of the eight states, its log is empty or over 16 KB, or
  its log is contained in `data/triage/handwritten.txt` or in an earlier excerpt, or holds an earlier
  excerpt of three lines or more (one line like a bare `Killed` may well recur);
* the rest is split per state by `sha256(id)`: even positions go to dev, odd ones to test.

Nothing is written when a check fails on the input itself (a malformed line, a missing field).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.triage.corpus import DATA_DIR
from app.triage.rules import STATES

REAL_DIR = DATA_DIR / "real"
HANDWRITTEN = DATA_DIR / "handwritten.txt"
FIELDS = ("id", "log", "label", "framework", "source", "why")
KEPT = ("id", "log", "idle_seconds", "label", "framework", "source", "why")  # a committed row's keys, in order
MAX_LOG_BYTES = 16_384
_URL = re.compile(r"https?://\S+")


def thread_of(source: str) -> str:
    """The thread URL in a `source`, without a trailing ")" or "." and without a comment anchor."""
    m = _URL.search(source or "")
    return m.group(0).rstrip(").,").split("#")[0] if m else ""


def _existing() -> tuple[set[str], set[str], list[str]]:
    threads, ids, logs = set(), set(), []
    for path in sorted(REAL_DIR.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                ids.add(row["id"])
                threads.add(thread_of(row.get("source", "")))
                logs.append(row["log"].strip())
    return threads, ids, logs


def _read(paths: list[Path]) -> list[dict]:
    rows = []
    for path in paths:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise SystemExit(f"error: {path}:{n} is not JSON ({e.msg}); fix the line and run again") from None
            if not isinstance(row, dict):
                raise SystemExit(f'error: {path}:{n} is not a JSON object; each line is one row {{"id": ..., ...}}')
            if row.get("doubt"):
                rows.append(row)  # set aside below, unread
                continue
            missing = [f for f in FIELDS if not isinstance(row.get(f), str)]
            if missing:
                raise SystemExit(f"error: {path}:{n} lacks {', '.join(missing)}; every row needs {', '.join(FIELDS)}")
            rows.append(row)
    return rows


def split(batch: int, paths: list[Path], *, dry_run: bool, out_dir: Path = REAL_DIR) -> int:
    dev_path, test_path = out_dir / f"dev{batch}.jsonl", out_dir / f"test{batch}.jsonl"
    if not dry_run and (dev_path.exists() or test_path.exists()):
        raise SystemExit(f"error: batch {batch} exists ({dev_path.name} or {test_path.name}); pick the next number")
    threads, ids, logs = _existing()
    handwritten = HANDWRITTEN.read_text(encoding="utf-8")
    dropped: Counter[str] = Counter()
    kept: list[dict] = []
    for row in _read(paths):
        if row.get("doubt"):
            dropped["doubt (set aside unread)"] += 1
            continue
        log = row["log"].strip()
        thread = thread_of(row["source"])
        reason = (
            "no github.com thread URL"
            if "github.com/" not in thread
            else "thread already used"
            if thread in threads
            else "id taken"
            if row["id"] in ids
            else "label not a state"
            if row["label"] not in STATES
            else "empty or over 16 KB"
            if not log or len(row["log"].encode("utf-8")) > MAX_LOG_BYTES
            else "in handwritten.txt"
            if log in handwritten
            else "overlaps an earlier excerpt"
            if any(log in old or (old.count("\n") >= 2 and old in log) for old in logs)
            else ""
        )
        if reason:
            dropped[reason] += 1
            continue
        threads.add(thread)
        ids.add(row["id"])
        logs.append(log)
        kept.append({k: row[k] for k in KEPT if k in row})
    dev, test = [], []
    for state in STATES:
        of_state = sorted(
            (r for r in kept if r["label"] == state), key=lambda r: hashlib.sha256(r["id"].encode()).hexdigest()
        )
        dev += of_state[0::2]
        test += of_state[1::2]
    print(
        f"batch {batch}: {len(kept)} rows kept ({len(dev)} dev, {len(test)} test); dropped: "
        + (", ".join(f"{n} {why}" for why, n in sorted(dropped.items())) or "none")
    )
    print(
        "per state (dev/test): "
        + ", ".join(f"{s} {sum(r['label'] == s for r in dev)}/{sum(r['label'] == s for r in test)}" for s in STATES)
    )
    if dry_run or not kept:
        return 0 if kept else 1
    for path, rows in ((dev_path, dev), (test_path, test)):
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        tmp.replace(path)
    print(
        f"wrote {dev_path} and {test_path}; set REAL_BATCH_COUNT in app/triage/corpus.py to {batch} "
        "and add the batch's row to the table in data/triage/real/README.md"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("batch", type=int, help="the new batch's number (dev<N>/test<N>)")
    ap.add_argument(
        "rows", nargs="+", type=Path, help="collectors' rows.jsonl files, in order (earlier wins a shared thread)"
    )
    ap.add_argument("--dry-run", action="store_true", help="check and count, write nothing")
    ap.add_argument(
        "--out-dir", type=Path, default=REAL_DIR, help="where devN/testN go (default: the real data folder)"
    )
    args = ap.parse_args(argv)
    for path in args.rows:
        if not path.is_file():
            raise SystemExit(f"error: {path} is not a file; give the collector's rows.jsonl")
    return split(args.batch, args.rows, dry_run=args.dry_run, out_dir=args.out_dir)


if __name__ == "__main__":
    sys.exit(main())
