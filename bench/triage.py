"""Benchmark the triage chain.

    .venv/bin/python bench/triage.py            # rules only (one core, CPU time)
    .venv/bin/python bench/triage.py --chain    # + the whole chain without LLM, specialist loaded

Rules: tails per second over the committed corpus (every split), measured with process CPU time
so other load on the machine does not count against it; plus the worst case of 32 KB tails.
Chain: every eval/OOD/hand-written row through rules -> specialist (all residue in one trainer
predict call), wall time per row, with and without the one-off model load.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.triage.corpus import DATA_DIR
from app.triage.rules import classify


def _rows() -> list[dict]:
    rows: list[dict] = []
    for split in ("train", "eval", "ood", "handwritten"):
        path = DATA_DIR / "corpus" / f"{split}.jsonl"
        rows += [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return rows


def bench_rules(rows: list[dict], *, repeats: int = 3) -> dict:
    best = 0.0
    for _ in range(repeats):
        t0 = time.process_time()
        for r in rows:
            classify(r["log"], idle_seconds=r["idle_seconds"])
        best = max(best, len(rows) / max(time.process_time() - t0, 1e-9))
    big = [("".join(r["log"] for r in rows[i : i + 40]))[-32768:] for i in range(0, 4000, 40)]
    t0 = time.process_time()
    for text in big:
        classify(text, idle_seconds=30)
    big_rate = len(big) / max(time.process_time() - t0, 1e-9)
    mean_kb = sum(len(r["log"]) for r in rows) / len(rows) / 1024
    return {"tails": len(rows), "mean_tail_kb": round(mean_kb, 2), "rules_tails_per_s_one_core": round(best),
            "rules_32kb_tails_per_s_one_core": round(big_rate)}


def bench_chain(rows: list[dict]) -> dict:
    from app.triage.chain import TriageChain, TriageInput
    from app.triage.digest import digest
    from app.triage.specialist import default_specialist

    spec = default_specialist(require_promotion=False)
    if spec is None:
        return {"chain": "no specialist adapter shipped (app/triage/log_doctor/adapter)"}
    evalish = [r for r in rows if r["split"] != "train"]
    inputs = [TriageInput(r["id"], r["log"], r["idle_seconds"]) for r in evalish]
    t0 = time.perf_counter()
    spec.predict([digest(evalish[0]["log"], evalish[0]["idle_seconds"])])
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    results = TriageChain(specialist=spec).triage_many(inputs)
    total_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    spec.predict([digest(r["log"], r["idle_seconds"]) for r in evalish])
    all_s = time.perf_counter() - t0
    stages = {s: sum(1 for r in results if r.stage == s) for s in ("rules", "specialist", "llm")}
    return {
        "chain_rows": len(inputs),
        "chain_stages": stages,
        "chain_ms_per_tail_incl_one_model_load": round(1000 * total_s / len(inputs), 2),
        "model_load_and_one_row_s": round(load_s, 2),
        "specialist_ms_per_tail_every_row_loaded": round(1000 * max(all_s - load_s, 0.0) / len(inputs), 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chain", action="store_true", help="also run the chain with the shipped specialist")
    args = ap.parse_args()
    rows = _rows()
    out = bench_rules(rows)
    if args.chain:
        out.update(bench_chain(rows))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
