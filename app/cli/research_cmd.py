"""`tuneharness research start FILE | board [RUN] | show RUN | stop RUN`: autoresearch runs on rented
hosts (docs/research.md)."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from app.errors import UserError

app = typer.Typer(
    help="Autoresearch: one-axis mutations of the best config, time-boxed, accepted only above the noise.",
    no_args_is_help=True,
)


def _service() -> Any:
    from app import bootstrap

    return bootstrap.research()


def _latest(svc: Any) -> str:
    runs = svc.runs()
    if not runs:
        raise UserError("no research runs yet. Fix: tuneharness research start RESEARCH.yaml")
    return str(runs[-1])  # oldest first


@app.command("start")
def start(file: Annotated[str, typer.Argument(help="the research file (YAML, docs/research.md)")]) -> None:
    """Validate the research file and enqueue the run; prints its id."""
    from app import bootstrap
    from app.research import load_research_file

    rf = load_research_file(file)  # bad input: one line, exit 2, nothing written
    bootstrap.require_broker()
    svc = _service()
    run_id = svc.create(rf)
    bootstrap.enqueue_research(run_id, 0)
    typer.echo(run_id)


def _summary(svc: Any, run_id: str) -> dict[str, Any]:
    store = svc.store(run_id)
    spec = store.spec()
    state = store.state() or {}
    return {
        "run": run_id,
        "name": spec["name"],
        "tier": spec["tier"],
        "time_box_s": spec["time_box_s"],
        "budget_usd": spec["budget_usd"],
        "phase": state.get("phase", "queued"),
        "finished": state.get("finished_reason"),
        "iteration": state.get("iteration", 0),
        "best_val_loss": state.get("best_mean"),
        "noise": state.get("noise"),
        "spent_usd": round(float(state.get("spent_usd") or 0.0), 6),
        "reserved_usd": round(float(state.get("committed_usd") or 0.0), 6),
        "running": [p["exp_id"] for p in state.get("running", [])],
        "accepted": [
            {"exp": a["exp_id"], "axis": a["axis"], "new": a["new"], "val_loss": a["mean"], "cost_usd": a["cost_usd"]}
            for a in state.get("accepted", [])
        ],
        "best": store.best(),
        "files": str(store.export()),
    }


@app.command("board")
def board(
    run: Annotated[str | None, typer.Argument(help="the run id (default: the newest run)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="the experiments and the running best as JSON")] = False,
) -> None:
    """The leaderboard: every experiment by validation loss, each accepted change and what it cost to find."""
    from app.research import render_board

    svc = _service()
    run_id = run or _latest(svc)
    store = svc.store(run_id)
    store.spec()  # an unknown run: one line, exit 2
    store.export()
    if as_json:
        typer.echo(json.dumps({**_summary(svc, run_id), "experiments": store.experiments()}, indent=1))
        return
    typer.echo(render_board(run_id, store.experiments(), store.state()), nl=False)


@app.command("show")
def show(
    run: Annotated[str, typer.Argument(help="the run id (tuneharness research board)")],
    as_json: Annotated[bool, typer.Option("--json", help="print it as JSON")] = False,
) -> None:
    """One run: its phase, best config, spend and where its files are."""
    svc = _service()
    summary = _summary(svc, run)
    if as_json:
        typer.echo(json.dumps(summary, indent=1))
        return
    typer.echo(
        f"{run}: {summary['phase']}"
        + (f" ({summary['finished']})" if summary["finished"] else "")
        + f", iteration {summary['iteration']}, tier {summary['tier']}, time box {summary['time_box_s']:g}s"
    )
    best = summary["best_val_loss"]
    typer.echo(f"best val loss {best if best is not None else '-'}; noise {summary['noise'] or '-'}")
    typer.echo(
        f"spent ${summary['spent_usd']:.4f}, reserved ${summary['reserved_usd']:.4f} of ${summary['budget_usd']:g}"
    )
    for a in summary["accepted"]:
        typer.echo(
            f"  accepted {a['axis']} = {a['new']} ({a['exp']}): {a['val_loss']:.4f}, found for ${a['cost_usd']:.4f}"
        )
    typer.echo(f"files: {summary['files']} (experiments.jsonl, best.json, board.md)")


@app.command("stop")
def stop(
    run: Annotated[str, typer.Argument(help="the run id (tuneharness research board)")],
    reason: Annotated[str, typer.Option("--reason", help="why, for the ledger")] = "operator",
) -> None:
    """Cancel the run's experiments in flight and finish it with its best config written."""
    svc = _service()
    state = svc.stop(run, reason=reason)
    typer.echo(f"stopped {run}: best val loss {state.best_mean if state.best_mean is not None else '-'}")
