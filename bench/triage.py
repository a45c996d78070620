"""Benchmark the triage chain.

    .venv/bin/python bench/triage.py            # rules only (one core, CPU time)
    .venv/bin/python bench/triage.py --chain    # + the whole chain without LLM, specialist loaded

Rules: tails per second over the committed corpus (every split, tails as generated: mean ~1.2 KB),
over the real excerpts from public issue threads as posted (`data/triage/real/`, mean ~0.9 KB),
and the corpus rows as the chain reads them from a long log: healthy progress of the same framework
before each tail, cut to the last 8, 16 and 32 KB (32 KB: what the CLI and the supervisor read), each
as text and as the bytes `read_tail_bytes` hands over (`..._bytes`: no decode and re-encode of the
whole tail; the CLI's path). Process CPU time, so
other load on the machine counts less against it (the load average is printed). Run it pinned to
one core (`taskset -c 0`) on a quiet machine; the best of a few passes is reported.
`machine_python_loop_ns` says how fast the machine runs plain Python: compare rates between machines
only next to it.

The rules remember line skeletons and per-line rule results across calls (bounded). Each timed
pass starts with empty memories, so it pays for learning the corpus's line shapes once
(`..._tails_per_s_one_core`); `..._cold` empties them before EVERY tail (a tail whose lines were
never seen: the worst case); `..._again` is a second pass over the same tails with the memories
kept (the supervisor re-reading the same logs). `--reference` also times `_classify_reference`,
the plain whole-text path (one needle scan over the whole tail, no line memories).
Chain: every eval/OOD/hand-written row through rules -> specialist (all residue in one trainer
predict call), wall time per row, with and without the one-off model load.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.triage import rules
from app.triage.corpus import DATA_DIR, REAL_SPLITS, real_rows
from bench import _results


def _rows() -> list[dict]:
    rows: list[dict] = []
    for split in ("train", "eval", "ood", "handwritten"):
        path = DATA_DIR / "corpus" / f"{split}.jsonl"
        rows += [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return rows


def _padded(rows: list[dict], kb: int) -> list[str]:
    """Each tail as the chain would read it from a long log: healthy progress of the same framework
    before it, cut to the last `kb` KB (the row's own ending, where the evidence is, stays)."""
    healthy: dict[str, str] = {}
    for r in rows:
        if r["state"] == "progressing":
            healthy[r["framework"]] = healthy.get(r["framework"], "") + r["log"]
    out = []
    for r in rows:
        pad = healthy.get(r["framework"]) or next(iter(healthy.values()))
        while len(pad) < kb * 1024:
            pad += pad
        out.append((pad + r["log"])[-kb * 1024 :])
    return out


def _rate(
    texts: list[str],
    idles: list[float | None],
    repeats: int,
    *,
    mode: str = "pass",
    classify: Callable[..., object] = rules.classify,
) -> float:
    """Best tails/s of `repeats` passes. mode: "pass" (memories emptied at the start of each pass),
    "cold" (emptied before every tail), "again" (a pass after an untimed one over the same tails)."""
    best = 0.0
    for _ in range(repeats):
        rules._forget()
        if mode == "again":
            for text, idle in zip(texts, idles, strict=True):
                classify(text, idle_seconds=idle)
        t0 = time.process_time()
        for text, idle in zip(texts, idles, strict=True):
            if mode == "cold":
                rules._forget()
            classify(text, idle_seconds=idle)
        best = max(best, len(texts) / max(time.process_time() - t0, 1e-9))
    rules._forget()
    return best


def machine_loop_ns(n: int = 2_000_000, repeats: int = 3) -> float:
    """The machine's speed for plain Python: CPU ns per iteration of `for i in range(n): s += i`
    (best of `repeats`). Rates from two machines compare only next to this: the same code's rules
    rates have differed about 2x between two build machines."""
    best = float("inf")
    for _ in range(repeats):
        s = 0
        t0 = time.process_time()
        for i in range(n):
            s += i
        best = min(best, time.process_time() - t0)
    return round(best / n * 1e9, 1)


def bench_rules(rows: list[dict], *, repeats: int = 3, reference: bool = False) -> dict:
    idles = [r["idle_seconds"] for r in rows]
    out: dict = {
        "tails": len(rows),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "machine_python_loop_ns": machine_loop_ns(),
        "mean_tail_kb": round(sum(len(r["log"]) for r in rows) / len(rows) / 1024, 2),
    }
    sample = rows[:: max(1, len(rows) // 800)]
    cases = [("", [r["log"] for r in rows], idles)]
    real = [r for split in REAL_SPLITS for r in real_rows(split)]
    out["real_excerpts"] = len(real)
    out["real_mean_tail_kb"] = round(sum(len(r["log"]) for r in real) / len(real) / 1024, 2)
    cases += [("_real", [r["log"] for r in real], [r.get("idle_seconds") for r in real])]
    for kb in (8, 16, 32):
        padded = _padded(sample, kb)
        cases += [(f"_{kb}kb", padded, [r["idle_seconds"] for r in sample])]
        # The same tails as `tuneharness triage FILE` hands them over: the bytes read from the file.
        cases += [(f"_{kb}kb_bytes", [t.encode("utf-8") for t in padded], [r["idle_seconds"] for r in sample])]
    for name, texts, tail_idles in cases:
        out[f"rules{name}_tails_per_s_one_core"] = round(_rate(texts, tail_idles, repeats))
        out[f"rules{name}_tails_per_s_one_core_cold"] = round(_rate(texts, tail_idles, 1, mode="cold"))
        out[f"rules{name}_tails_per_s_one_core_again"] = round(_rate(texts, tail_idles, repeats, mode="again"))
        if reference:
            out[f"reference{name}_tails_per_s_one_core"] = round(
                _rate(texts, tail_idles, 1, classify=rules._classify_reference)
            )
    out["load_average_1m_after"] = round(os.getloadavg()[0], 2)
    return out


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
    ap.add_argument("--reference", action="store_true", help="also time the plain whole-text rules path")
    args = ap.parse_args()
    started = _results.start()
    rows = _rows()
    out = bench_rules(rows, reference=args.reference)
    if args.chain:
        out.update(bench_chain(rows))
    print(json.dumps(out, indent=2))
    if args.chain:  # the chain's numbers; this run's rules rates stay in "raw"
        _results.write("triage_chain", chain_tables(out), started=started, raw=out)
    else:
        _results.write(
            "triage", rules_tables(out, sample=len(rows[:: max(1, len(rows) // 800)])), started=started, raw=out
        )


def rules_tables(out: dict, *, sample: int) -> list[dict]:
    """The rules stage's rates (bench_rules' output) as the table `bench/report.py` renders."""
    inputs = [
        ("", f"corpus tails as generated (mean {out['mean_tail_kb']} KB)", out["tails"]),
        ("_real", f"real excerpts as posted (mean {out['real_mean_tail_kb']} KB)", out["real_excerpts"]),
    ]
    for kb in (8, 16, 32):
        inputs += [
            (f"_{kb}kb", f"corpus tails after healthy progress, last {kb} KB, as text", sample),
            (f"_{kb}kb_bytes", f"the same {kb} KB tails as the bytes read from a file", sample),
        ]
    columns = ["input", "tails", "tails/s", "cold: memories emptied before every tail", "again: same tails re-read"]
    reference = any(k.startswith("reference") for k in out)
    if reference:
        columns.append("plain whole-text path (`_classify_reference`)")
    rows = []
    for key, what, n in inputs:
        row = [
            what,
            n,
            out[f"rules{key}_tails_per_s_one_core"],
            out[f"rules{key}_tails_per_s_one_core_cold"],
            out[f"rules{key}_tails_per_s_one_core_again"],
        ]
        rows.append([*row, out[f"reference{key}_tails_per_s_one_core"]] if reference else row)
    note = (
        f"Process CPU time, best of 3 passes (cold: one), the rules' memories emptied at the start of each. "
        f"This machine runs plain Python at {out['machine_python_loop_ns']} ns per loop iteration "
        f"(`machine_python_loop_ns`: compare rates between machines only next to it); load average "
        f"(1 min) {out['load_average_1m']} before the passes, {out['load_average_1m_after']} after."
    )
    return [_results.table("Triage rules speed on one core", columns, rows, note=note)]


def chain_tables(out: dict) -> list[dict]:
    """The chain's timing (bench_chain's output) as the table `bench/report.py` renders."""
    if "chain_rows" not in out:
        return [_results.table("Triage chain time per tail", ["what"], [[out["chain"]]])]
    stages = ", ".join(f"{stage} {n}" for stage, n in out["chain_stages"].items())
    rows = [
        ["rows triaged (every eval, OOD and hand-written corpus row)", out["chain_rows"]],
        ["rows decided by each stage", stages],
        ["ms per tail, whole chain, one model load included", out["chain_ms_per_tail_incl_one_model_load"]],
        ["s to load the specialist and predict one row", out["model_load_and_one_row_s"]],
        ["ms per tail, specialist on every row, model loaded", out["specialist_ms_per_tail_every_row_loaded"]],
    ]
    note = "Rules, then the shipped specialist on all the residue in one predict call; no LLM. Wall time."
    return [_results.table("Triage chain time per tail", ["measure", "value"], rows, note=note)]


if __name__ == "__main__":
    main()
