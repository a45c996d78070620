"""Accuracy of train.log triage on REAL excerpts from public issue threads (data/triage/real/).

    .venv/bin/python bench/triage_real.py                 # every split, rules and chain
    .venv/bin/python bench/triage_real.py --split dev     # dev only (a split you may tune on)
    .venv/bin/python bench/triage_real.py --split test2   # the second batch's test split
    .venv/bin/python bench/triage_real.py --json OUT      # also write every prediction as JSON

Two predictors per split:

* rules: `app.triage.rules.classify`. An `unsure` verdict is scored by its best guess (`guess`),
  and the number of unsure rows is reported.
* chain: `TriageChain` as shipped, without an LLM: the shipped specialist (if one is promoted: one is,
  `app/triage/log_doctor/`), no escalation. A row no stage was confident about comes back as its best guess with
  `needs_operator`; that best guess is scored, and the needs_operator count is reported.

Printed: accuracy overall, per state, per framework, and every miss (with its evidence lines for dev
splits; for test splits only id, label and predicted, unless --test-evidence).
The excerpts come in batches (`REAL_BATCHES` in app/triage/corpus.py), each split into `devN` and
`testN` before any classifier ran on it; `data/triage/real/README.md` is their data card (each
batch's aim, rows and first-contact reading). The test splits must never be used to tune rules: look
at their misses only as id/label/predicted. Pooled totals and per-state precision/recall:
`python -m app.triage.report` (docs/triage.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.triage.chain import TriageChain, TriageInput
from app.triage.corpus import DATA_DIR
from app.triage.corpus import REAL_SPLITS as SPLITS
from app.triage.rules import STATES, UNSURE, classify
from app.triage.specialist import default_specialist
from bench import _results

REAL_DIR = DATA_DIR / "real"


def load(split: str) -> list[dict]:
    path = REAL_DIR / f"{split}.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def predict_rules(rows: list[dict]) -> list[dict]:
    out = []
    for r in rows:
        v = classify(r["log"], idle_seconds=r.get("idle_seconds"))
        out.append(
            {
                "id": r["id"],
                "predicted": v.guess if v.state == UNSURE else v.state,
                "unsure": v.state == UNSURE,
                "rule": v.rule,
                "confidence": v.confidence,
                "evidence": list(v.evidence),
            }
        )
    return out


def predict_chain(rows: list[dict]) -> tuple[list[dict], str]:
    specialist = default_specialist()
    chain = TriageChain(specialist=specialist, escalation=None)
    results = chain.triage_many([TriageInput(r["id"], r["log"], r.get("idle_seconds")) for r in rows])
    desc = f"specialist={'promoted' if specialist is not None else 'none (not promoted)'}, llm=none"
    out = [
        {
            "id": res.id,
            "predicted": res.state,
            "unsure": res.needs_operator,
            "rule": res.stage,
            "confidence": res.confidence,
            "evidence": list(res.evidence),
        }
        for res in results
    ]
    return out, desc


def _acc(pairs: list[tuple[str, str]]) -> str:
    n = len(pairs)
    ok = sum(1 for label, pred in pairs if label == pred)
    return f"{ok}/{n} = {ok / n:.3f}" if n else "-"


def report(split: str, name: str, rows: list[dict], preds: list[dict], *, show_misses: bool) -> dict:
    pairs = [(r["label"], p["predicted"]) for r, p in zip(rows, preds, strict=True)]
    unsure = sum(1 for p in preds if p["unsure"])
    ok = sum(1 for a, b in pairs if a == b)
    word = "needs_operator" if name == "chain" else "unsure"
    print(f"\n### {split} / {name}: accuracy {_acc(pairs)}  ({word}: {unsure}, scored by best guess)")
    print("  per state:")
    for st in STATES:
        sub = [(a, b) for a, b in pairs if a == st]
        if sub:
            print(f"    {st:<12} {_acc(sub)}")
    print("  per framework:")
    by_fw: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for r, pair in zip(rows, pairs, strict=True):
        by_fw[r.get("framework", "?")].append(pair)
    for fw in sorted(by_fw):
        print(f"    {fw:<14} {_acc(by_fw[fw])}")
    misses = [(r, p) for r, p in zip(rows, preds, strict=True) if r["label"] != p["predicted"]]
    confusion = Counter((r["label"], p["predicted"]) for r, p in misses)
    if confusion:
        print(
            "  confusions (label -> predicted): " + ", ".join(f"{a}->{b} x{n}" for (a, b), n in confusion.most_common())
        )
    print(f"  misses ({len(misses)}):")
    for r, p in misses:
        flag = f" [{word}]" if p["unsure"] else ""
        print(f"    - {r['id']}: label={r['label']} predicted={p['predicted']}{flag} (rule/stage {p['rule']})")
        if show_misses:
            for ev in p["evidence"]:
                print(f"        evidence: {ev[:200]}")
    return {"split": split, "predictor": name, "n": len(rows), "correct": ok, "unsure": unsure, "predictions": preds}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--split", choices=(*SPLITS, "all"), default="all")
    ap.add_argument("--json", type=Path, help="write all predictions here")
    ap.add_argument(
        "--test-evidence",
        action="store_true",
        help="also print evidence lines for test misses (off: test is not for tuning)",
    )
    args = ap.parse_args(argv)
    started = _results.start()
    splits = SPLITS if args.split == "all" else (args.split,)
    dumped = []
    summary = []
    scored: dict[str, dict[str, dict]] = {}
    for split in splits:
        rows = load(split)
        if not rows:  # a batch with at most one row per state sends them all to dev
            print(f"\n=== split {split}: no excerpts")
            continue
        states = Counter(r["label"] for r in rows)
        fws = Counter(r.get("framework", "?") for r in rows)
        print(f"\n=== split {split}: {len(rows)} excerpts")
        print("  states: " + ", ".join(f"{s}={states[s]}" for s in STATES))
        print("  frameworks: " + ", ".join(f"{k}={v}" for k, v in sorted(fws.items())))
        show = split.startswith("dev") or args.test_evidence
        res = report(split, "rules", rows, predict_rules(rows), show_misses=show)
        chain_preds, desc = predict_chain(rows)
        print(f"\n  (chain: {desc})")
        res2 = report(split, "chain", rows, chain_preds, show_misses=show)
        dumped += [res, res2]
        summary += [(split, "rules", res), (split, "chain", res2)]
        scored[split] = {"rules": _scores(rows, res), "chain": _scores(rows, res2)}
    print("\n=== summary")
    for split, name, res in summary:
        print(
            f"  {split:<6} {name:<6} {res['correct']}/{res['n']} = {res['correct'] / res['n']:.3f}"
            f"  (unsure/needs_operator {res['unsure']})"
        )
    if args.json:
        args.json.write_text(json.dumps(dumped, indent=1), encoding="utf-8")
    name = "triage_real" if args.split == "all" else f"triage_real_{args.split}"
    _results.write(name, result_tables(scored), started=started, raw={"per_split": scored})
    return 0


def _scores(rows: list[dict], res: dict) -> dict:
    """One split's counts for one predictor: n, correct, unsure, and [correct, n] per labelled state."""
    per_state: dict[str, list[int]] = {}
    for r, p in zip(rows, res["predictions"], strict=True):
        counts = per_state.setdefault(r["label"], [0, 0])
        counts[0] += r["label"] == p["predicted"]
        counts[1] += 1
    return {"n": res["n"], "correct": res["correct"], "unsure": res["unsure"], "per_state": per_state}


def _pool(scored: dict[str, dict[str, dict]], splits: list[str], predictor: str) -> dict:
    pooled = {"n": 0, "correct": 0, "unsure": 0, "per_state": {}}
    for split in splits:
        s = scored[split][predictor]
        pooled["n"] += s["n"]
        pooled["correct"] += s["correct"]
        pooled["unsure"] += s["unsure"]
        for state, (ok, n) in s["per_state"].items():
            counts = pooled["per_state"].setdefault(state, [0, 0])
            counts[0] += ok
            counts[1] += n
    return pooled


def _score(ok: int, n: int) -> str:
    return f"{ok}/{n} ({ok / n:.3f})" if n else "-"


def result_tables(scored: dict[str, dict[str, dict]]) -> list[dict]:
    """Accuracy pooled over the dev halves, the test halves and both; then per state."""
    groups = [
        ("dev halves (may be tuned on)", [s for s in scored if s.startswith("dev")]),
        ("test halves (never tuned on)", [s for s in scored if s.startswith("test")]),
        ("all", list(scored)),
    ]
    groups = [(name, splits) for name, splits in groups if splits]
    overall = []
    for name, splits in groups:
        rules, chain = _pool(scored, splits, "rules"), _pool(scored, splits, "chain")
        overall.append(
            [
                name,
                len(splits),
                rules["n"],
                _score(rules["correct"], rules["n"]),
                rules["unsure"],
                _score(chain["correct"], chain["n"]),
                chain["unsure"],
            ]
        )
    per_state = []
    pooled = {name: (_pool(scored, splits, "rules"), _pool(scored, splits, "chain")) for name, splits in groups}
    for state in STATES:
        row: list = [state]
        for name, _ in groups[-2:] if len(groups) > 1 else groups:
            rules, chain = pooled[name]
            ok_r, n = rules["per_state"].get(state, [0, 0])
            ok_c, _ = chain["per_state"].get(state, [0, 0])
            row += [n, _score(ok_r, n), _score(ok_c, n)]
        per_state.append(row)
    shown = [name.split(" (")[0] for name, _ in (groups[-2:] if len(groups) > 1 else groups)]
    state_columns = ["state"] + [f"{col} ({name})" for name in shown for col in ("excerpts", "rules", "chain")]
    note = (
        "rules: `app.triage.rules.classify`, an unsure verdict scored by its best guess. chain: "
        "`TriageChain` as shipped without an LLM (rules, then the promoted specialist); a row no stage was "
        "confident about is scored by its best guess and counted as needs_operator."
    )
    return [
        _results.table(
            "Triage accuracy on the real excerpts",
            ["splits", "split files", "excerpts", "rules", "rules unsure", "chain", "chain needs_operator"],
            overall,
            note=note,
        ),
        _results.table("Triage accuracy per state on the real excerpts", state_columns, per_state),
    ]


if __name__ == "__main__":
    raise SystemExit(main())
