"""End to end, real processes: a research run on the simulated marketplace through the real fleet
(Redis, a Celery worker on every queue, `tuneharness sim serve` with an sshd per host, the real
trainer on the CPU). A tiny model, a 20-second time box, two iterations of two mutations, and a
lying host in the trace; the run ends with experiments.jsonl complete, a board, a best config, and
its spend within its budget."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.support.research_fleet import research_fleet, research_text, write_inputs

AXES = "  learning_rate: {times: [8.0, 0.25]}\n  warmup_steps: {plus: [20], min: 0}\n"
BUDGET_USD = 3.0


@pytest.mark.slow
def test_research_run_through_the_fleet_ends_with_its_records_board_and_best(
    th_env: dict[str, str], tmp_path: Path
) -> None:
    """Two iterations of two one-axis mutations after a two-seed baseline, through the real fleet with a lying
    host in the trace: every experiment is in experiments.jsonl with its metric, host, TFLOP/s and dollars;
    the liar was caught and never trained; the board and best.json exist; the spend is within the budget."""
    from app.db import make_engine
    from app.ledger import Ledger
    from app.research import EXPERIMENT_FIELDS

    started = time.monotonic()
    research = write_inputs(
        tmp_path, research_text(name="smoke", iterations=2, mutations=2, axes=AXES, budget_usd=BUDGET_USD)
    )
    with research_fleet(th_env, tmp_path) as fleet:
        out = fleet.cli("research", "start", str(research))
        assert out.returncode == 0, out.stderr
        run_id = out.stdout.strip()
        assert fleet.wait_finished(run_id, timeout_s=1200), fleet.log_tail()
        state = fleet.state(run_id)
        assert state is not None
        lines = fleet.experiments(run_id)

        # experiments.jsonl: the baseline and 2 x 2 mutations, every field present, one line each.
        assert state["finished_reason"] == "iterations done", state
        # Iteration 1 tries lr x8 and warmup +20; iteration 2 proposes what was not yet tried from the best:
        # two changes of a new best, or, when iteration 1 kept nothing, the one left (lr x0.25) and again
        # any change a slow host could not judge.
        assert lines[0]["axis"] is None and all(r["axis"] is not None for r in lines[1:])
        first = [r for r in lines if r["iteration"] == 1]
        second = [r for r in lines if r["iteration"] == 2]
        assert len(first) == 2 and [r["exp"] for r in lines] == sorted(r["exp"] for r in lines)
        kept = any(r["verdict"] == "accepted" for r in first)
        assert len(second) == (2 if kept else min(2, 1 + sum(r["verdict"] == "slow" for r in first))), lines
        assert len({r["exp"] for r in lines}) == len(lines)
        for r in lines:
            assert tuple(r) == EXPERIMENT_FIELDS
            assert r["status"] == "ok", r
            assert all(v is not None and v > 0 for v in r["metric_per_seed"].values()), r
            assert r["hosts"] and r["gpu_models"] and r["tflops"] and r["usd"] > 0, r
            assert all(s and s > 0 for s in r["steps"].values()), r
        base = lines[0]
        assert base["verdict"] == "baseline" and len(base["seeds"]) == 2 and base["noise"] is not None
        assert {r["iteration"] for r in lines[1:]} == {1, 2}
        assert all(r["verdict"] in ("accepted", "rejected") for r in lines[1:])
        assert all(r["config"][r["axis"]] == r["new"] and r["parent"][r["axis"]] == r["old"] for r in lines[1:])

        # The lying host was caught at its preflight and trained nothing.
        ledger = Ledger(make_engine(f"sqlite:///{fleet.home / 'tuneharness.db'}"))
        assert [e for e in ledger.rows(kind="host_failed") if e.machine == "m-liar"], fleet.log_tail()
        assert all("m-liar" not in h for r in lines for h in r["hosts"])

        # Board, best config, money.
        best = json.loads((fleet.run_dir(run_id) / "best.json").read_text())
        assert best["val_loss"] == state["best_mean"] and best["train"]["learning_rate"] > 0
        board = fleet.cli("research", "board", run_id)
        assert board.returncode == 0 and "| exp |" in board.stdout and "cost to find" in board.stdout, board.stderr
        as_json = json.loads(fleet.cli("research", "board", run_id, "--json").stdout)
        assert len(as_json["experiments"]) == len(lines) and as_json["phase"] == "finished"
        spent = sum(r["usd"] for r in lines)
        assert abs(spent - state["spent_usd"]) < 1e-6 and spent <= BUDGET_USD
        caps = json.loads(fleet.cli("budget", "show", "--json").stdout)
        cap = next(b for b in caps if b["name"] == f"research-{run_id}")
        assert cap["reserved_usd"] == 0 and cap["spent_usd"] <= cap["cap_usd"], cap
        print(
            f"wall {time.monotonic() - started:.0f}s; val loss {base['mean']:.4f} -> {state['best_mean']:.4f} "
            f"(noise {base['noise']:.4f}); ${spent:.4f} of ${BUDGET_USD:.2f}; verdicts {[r['verdict'] for r in lines]}"
        )
