"""Accuracy of train.log triage on REAL excerpts from public issue threads (app/triage/data/real/).

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

Printed: accuracy overall, per state, per framework, and every miss with its evidence lines.
Every batch (128 after session 14; each one's collection, aim and first-contact reading are in
`app/triage/data/real/README.md` and `docs/triage.md`) was split into dev and test before any
classifier ran on it. The first thirty-five: `dev`/`test` (the
first, 87 rows), `dev2`/`test2` and `dev3`/`test3` and `dev4`/`test4` (74, 66 and 74 rows, collected blind
in session 3; the third from frameworks the first two barely had: JAX, TF, Paddle, MindSpore,
ESPnet, ...; the fourth from LLM fine-tuning as run in 2024-25 and from vision, speech, RL, GNN), and
`dev5`/`test5` (76 rows, session 4, collected by state across every ecosystem) and `dev6`/`test6`
(75 rows, session 4, frameworks rarer in such threads), `dev7`/`test7` (48 rows, session 4:
finished runs, and LLM fine-tuning failures of 2023-26), `dev8`/`test8` (19 rows, session 4:
finished and running logs only), `dev9`/`test9` (56 rows, session 5: every ecosystem, by state; no
finished run could be found that no earlier batch had), `dev10`/`test10` (61 rows, session 5: 2024-26
LLM and RL tooling first), `dev11`/`test11` (66 rows, session 5: logs unlike HF's: non-English, Windows,
notebooks, Caffe/MXNet/Chainer/Lua Torch), `dev12`/`test12` (50 rows, session 5: healthy logs that look
alarming; XPU, Gaudi, TPU, ROCm, tabular ML), `dev13`/`test13` (31 rows, session 5: healthy runs with
alarming lines, and failures of every state), `dev14`/`test14` (29 rows, session 5: device faults and
divergence only), `dev15`/`test15` (18 rows, session 6: schedulers, containers and managed platforms),
`dev16`/`test16` (25 rows, session 6: LLM stacks of 2024-26 seen less often), `dev17`/`test17` (15 rows,
session 6: RL, science, vision, speech and diffusion trainers), `dev18`/`test18` (11 rows, session 6: runs
posted in pull requests), `dev19`/`test19` (9 rows, session 6: runs that ended, posted with a question
about what came after), `dev20`/`test20` (16 rows, session 6: failures after a long healthy stretch),
`dev21`/`test21` and `dev22`/`test22` (6 and 11 rows, session 6: an ordinary sample of every state,
of the common stacks and of others; nothing was tuned on them), and `dev23`-`dev27`/`test23`-`test27`
(17, 6, 22, 26 and 16 rows, session 7: ordinary samples of non-HF stacks, 2025-26 threads, model-release
repos, research code and the HF stack), and `dev28`-`dev31`/`test28`-`test31` (18, 17, 23 and 18 rows,
session 8: ordinary samples of Chinese model families' fine-tuning, vision, speech and classic NLP,
image generation and RL), and `dev32`-`dev35`/`test32`-`test35` (11, 12, 22 and 24 rows, session 8:
2025-26 threads, JAX/TPU and TF/Keras, vision-language fine-tuning, tabular/graph/science ML). The test splits must never be used to tune rules: look at their misses only as id/label/predicted.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.triage.chain import TriageChain, TriageInput
from app.triage.corpus import REAL_SPLITS as SPLITS
from app.triage.rules import STATES, UNSURE, classify
from app.triage.specialist import default_specialist

REAL_DIR = Path(__file__).resolve().parents[1] / "app" / "triage" / "data" / "real"


def load(split: str) -> list[dict]:
    path = REAL_DIR / f"{split}.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def predict_rules(rows: list[dict]) -> list[dict]:
    out = []
    for r in rows:
        v = classify(r["log"], idle_seconds=r.get("idle_seconds"))
        out.append({"id": r["id"], "predicted": v.guess if v.state == UNSURE else v.state,
                    "unsure": v.state == UNSURE, "rule": v.rule, "confidence": v.confidence,
                    "evidence": list(v.evidence)})
    return out


def predict_chain(rows: list[dict]) -> tuple[list[dict], str]:
    specialist = default_specialist()
    chain = TriageChain(specialist=specialist, escalation=None)
    results = chain.triage_many([TriageInput(r["id"], r["log"], r.get("idle_seconds")) for r in rows])
    desc = f"specialist={'promoted' if specialist is not None else 'none (not promoted)'}, llm=none"
    out = [{"id": res.id, "predicted": res.state, "unsure": res.needs_operator, "rule": res.stage,
            "confidence": res.confidence, "evidence": list(res.evidence)} for res in results]
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
        print("  confusions (label -> predicted): "
              + ", ".join(f"{a}->{b} x{n}" for (a, b), n in confusion.most_common()))
    print(f"  misses ({len(misses)}):")
    for r, p in misses:
        flag = f" [{word}]" if p["unsure"] else ""
        print(f"    - {r['id']}: label={r['label']} predicted={p['predicted']}{flag} (rule/stage {p['rule']})")
        if show_misses:
            for ev in p["evidence"]:
                print(f"        evidence: {ev[:200]}")
    return {"split": split, "predictor": name, "n": len(rows), "correct": ok, "unsure": unsure,
            "predictions": preds}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--split", choices=(*SPLITS, "all"), default="all")
    ap.add_argument("--json", type=Path, help="write all predictions here")
    ap.add_argument("--test-evidence", action="store_true",
                    help="also print evidence lines for test misses (off: test is not for tuning)")
    args = ap.parse_args(argv)
    splits = SPLITS if args.split == "all" else (args.split,)
    dumped = []
    summary = []
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
    print("\n=== summary")
    for split, name, res in summary:
        print(f"  {split:<6} {name:<6} {res['correct']}/{res['n']} = {res['correct'] / res['n']:.3f}"
              f"  (unsure/needs_operator {res['unsure']})")
    if args.json:
        args.json.write_text(json.dumps(dumped, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
