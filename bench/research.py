"""A research run through the real fleet on the CPU: does validation loss fall over iterations?

    .venv/bin/python bench/research.py [--iterations 4] [--mutations 2]

Starts its own Redis, `tuneharness sim serve` (healthy RTX 3090 hosts and one liar), and a Celery
worker on every queue, in a temporary TUNEHARNESS_HOME; runs `tuneharness research start` on a tiny
model with a 20-second time box and a two-seed baseline, waits for the run to finish, and writes
`bench/results/research.json`: the best validation loss after each iteration, what each accepted
change cost to find, and the board.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import _results
from tests.support.research_fleet import research_fleet, research_text, write_inputs
from tests.support.services import start_redis

AXES = (
    "  learning_rate: {times: [4.0, 0.5]}\n"
    "  warmup_steps: {plus: [20], min: 0}\n"
    "  lora.r: {times: [2.0], max: 16}\n"
    "  batch_size: {times: [2.0, 0.5]}\n"
)


def _by_iteration(lines: list[dict[str, Any]], iterations: int) -> list[list[Any]]:
    """One row per iteration: the best loss after it, its experiments, the change it accepted and its cost."""
    rows: list[list[Any]] = []
    base = lines[0]
    best = float(base["mean"])
    spent = float(base["usd"])
    since = 0.0
    rows.append([0, round(best, 4), 1, "baseline (2 seeds)", None, round(spent, 4)])
    for it in range(1, iterations + 1):
        mine = [r for r in lines if r["iteration"] == it]
        if not mine:
            break
        cost = sum(float(r["usd"]) for r in mine)
        spent += cost
        since += cost
        won = [r for r in mine if r["verdict"] == "accepted"]
        change = None
        found = None
        if won:
            win = min(won, key=lambda r: r["mean"])
            best = float(win["mean"])
            change = f"{win['axis']}: {win['old']} -> {win['new']}"
            found = round(since, 4)
            since = 0.0
        rows.append([it, round(best, 4), len(mine), change or "none above the noise", found, round(spent, 4)])
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--mutations", type=int, default=2)
    ap.add_argument("--name", default="research", help="the results file's name")
    args = ap.parse_args(argv)
    started = _results.start()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-research-") as tmp:
        work = Path(tmp)
        (work / "redis").mkdir()
        redis = start_redis(work / "redis")
        try:
            home = work / "home"
            home.mkdir()
            env = {k: v for k, v in os.environ.items() if not k.startswith(("TUNEHARNESS_", "VAST_", "RUNPOD_"))}
            env.update(
                TUNEHARNESS_HOME=str(home),
                TUNEHARNESS_BROKER_URL=f"{redis.url.rsplit('/', 1)[0]}/1",
                HF_HUB_OFFLINE="1",
                TRANSFORMERS_OFFLINE="1",
                PYTHONPATH=str(_results.REPO),
            )
            budget = 0.5 * (2 + args.iterations * args.mutations) + 0.5
            text = research_text(
                name="bench", iterations=args.iterations, mutations=args.mutations, axes=AXES, budget_usd=budget
            )
            research = write_inputs(work, text)
            with research_fleet(env, work) as fleet:
                out = fleet.cli("research", "start", str(research))
                if out.returncode != 0:
                    print(out.stderr, file=sys.stderr)
                    return 1
                run_id = out.stdout.strip()
                if not fleet.wait_finished(run_id, timeout_s=3600):
                    print(fleet.log_tail(), file=sys.stderr)
                    return 1
                lines = fleet.experiments(run_id)
                state = fleet.state(run_id) or {}
                board = fleet.cli("research", "board", run_id).stdout
        finally:
            redis.stop()
    wall_s = time.monotonic() - t0
    print(board)
    rows = _by_iteration(lines, args.iterations)
    tables = [
        _results.table(
            "research run: best validation loss after each iteration",
            ["iteration", "best val loss", "experiments", "accepted change", "cost to find $", "spent $"],
            rows,
            note=(
                f"tiny causal LM on the CPU through the fleet on the simulated marketplace (RTX 3090 tier, one "
                f"lying host), 20 s time box, baseline seeds [1, 2], noise {lines[0]['noise']:.4f} (2 sigma); "
                f"{len(lines)} experiments, ${state.get('spent_usd', 0.0):.4f} of ${budget:.2f}; "
                f"finished: {state.get('finished_reason')}; wall {wall_s:.0f} s"
            ),
        )
    ]
    _results.write(args.name, tables, started=started, raw={"experiments": lines, "board": board, "state": state})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
