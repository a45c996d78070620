"""`tuneharness gate`: judge a trial, evaluate candidates into a trial, read the gate's history.

Exit codes of `judge` and `run`: 0 promote, 1 refuse, 2 malformed input (one line naming the
file and line). Needs no broker: the ledger is created on demand under TUNEHARNESS_HOME and an
alert that cannot be sent is kept in the outbox.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from app.alerts import OutboxNotifier

app = typer.Typer(help="The deploy gate: promote or refuse a candidate model.", no_args_is_help=True)


def _echo_judgement(result: dict[str, Any], *, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(result, indent=2, sort_keys=False))
        return
    trial = result["trial"]
    scores = result["scores"]
    typer.echo(f"{result['decision'].upper()}  model {trial['model']}  trial {trial['hash'][:16]}")
    for r in result["reasons"]:
        typer.echo(f"  refused  {r['code']}: {r['detail']}")
    for w in result["warnings"]:
        typer.echo(f"  warning  {w['code']}: {w['detail']}")
    metric = scores["metric"]
    typer.echo(f"  {metric} by slice (candidate worst seed | baseline | incumbent):")
    inc = scores.get("incumbent") or {}
    slices = sorted(set(scores["candidate"]["worst"]) | set(scores["baseline"]) | set(inc))
    for sl in slices:
        cells = [scores["candidate"]["worst"].get(sl), scores["baseline"].get(sl), inc.get(sl)]
        text = " | ".join("—" if c is None else f"{c:.4f}" for c in cells)
        typer.echo(f"    {sl:<20} {text}")
    ledger = result["ledger"]
    typer.echo(f"  ledger seq {ledger['seq']}" + ("" if ledger["recorded_now"] else " (already recorded)"))


def _finish(notifier: OutboxNotifier, exit_code: int) -> None:
    notifier.drain(timeout_s=5.0)
    raise typer.Exit(exit_code)


@app.command("judge")
def judge(
    trial_dir: Annotated[
        Path, typer.Argument(help="The trial directory (gate.json, baseline.jsonl, candidate-seed-*.jsonl).")
    ],
    as_json: Annotated[bool, typer.Option("--json", help="Print the decision as JSON.")] = False,
    write_decision: Annotated[
        bool, typer.Option("--write-decision", help="Also write decision.json into the trial directory.")
    ] = False,
) -> None:
    """Judge a trial: exit 0 promote, 1 refuse, 2 malformed input."""
    from app import bootstrap

    notifier = bootstrap.notifier()
    judgement = bootstrap.gate(notify=notifier).judge(trial_dir)
    if write_decision:
        judgement.write_decision()
    _echo_judgement(judgement.as_dict(), as_json=as_json)
    _finish(notifier, judgement.exit_code)


@app.command("history")
def history(
    as_json: Annotated[bool, typer.Option("--json", help="Print trials and production as JSON.")] = False,
    markdown: Annotated[bool, typer.Option("--markdown", help="Print the README's table of models.")] = False,
) -> None:
    """List judged trials, their decisions, and what is in production now."""
    from app import bootstrap
    from app.alerts import InMemoryNotifier

    svc = bootstrap.gate(notify=InMemoryNotifier())
    hist = svc.history()
    if as_json:
        typer.echo(json.dumps(hist.as_dict(), indent=2))
        return
    if markdown:
        typer.echo(svc.markdown(hist), nl=False)
        return
    if not hist.entries:
        typer.echo("no trials judged yet. Judge one: tuneharness gate judge TRIAL_DIR")
        return
    for e in hist.entries:
        codes = f" ({', '.join(e.reasons)})" if e.reasons else ""
        worst = "—" if e.worst_heldout is None else f"{e.worst_heldout:.4f}"
        typer.echo(
            f"{e.seq:>6}  {e.at[:19]}  {e.model:<24} {e.decision:<8} {e.metric} {worst}  "
            f"trial {e.trial_hash[:12]}{codes}"
        )
    typer.echo("in production:")
    if not hist.production:
        typer.echo("  nothing (no trial has been promoted)")
    for model, e in sorted(hist.production.items()):
        typer.echo(f"  {model:<24} trial {e.trial_hash[:12]}  promoted at seq {e.seq}  {e.trial_path}")


@app.command("run")
def run(
    out: Annotated[Path, typer.Option("--out", help="The trial directory to create (must not exist).")],
    config: Annotated[Path, typer.Option("--config", help="The gate.json for this trial.")],
    eval_sets: Annotated[
        list[Path], typer.Option("--eval", help="Eval-set JSONL {id, slice, expected, text|prompt}; repeatable.")
    ],
    baseline: Annotated[str, typer.Option("--baseline", help="adapter:DIR, command:CMD or predictions:FILE.")],
    candidates: Annotated[
        list[str], typer.Option("--candidate", help="SEED=adapter:DIR (or command:/predictions:); one per seed.")
    ],
    incumbent: Annotated[
        str | None, typer.Option("--incumbent", help="adapter:DIR, command:CMD or predictions:FILE.")
    ] = None,
    base_model: Annotated[
        Path | None, typer.Option("--base-model", help="Base model directory for adapter predictors.")
    ] = None,
    timeout_s: Annotated[float, typer.Option("--timeout-s", help="Per-predictor time limit, seconds.")] = 3600.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the decision as JSON.")] = False,
) -> None:
    """Evaluate candidates (one per seed), baseline and incumbent into a trial, then judge it."""
    from app import bootstrap
    from app.numbers import MAX_HOURS, finite

    finite(timeout_s, "--timeout-s", minimum=1, maximum=MAX_HOURS * 3600)
    notifier = bootstrap.notifier()
    judgement = bootstrap.gate(notify=notifier).run(
        out,
        config_path=config,
        eval_paths=eval_sets,
        baseline=baseline,
        candidates=candidates,
        incumbent=incumbent,
        base_model=base_model,
        timeout_s=timeout_s,
        progress=lambda msg: typer.echo(msg, err=True),
    )
    _echo_judgement(judgement.as_dict(), as_json=as_json)
    _finish(notifier, judgement.exit_code)
