"""`tuneharness triage`: read a train.log tail and say what state the run is in.

    tuneharness triage FILE [--idle-seconds N] [--json]      one verdict
    tuneharness triage --jsonl IN [--output OUT]              one JSON line per row
    tuneharness triage train-specialist [--out DIR]           reproduce the specialist + gate trial

FILE is read by seeking to its tail (`--tail-kb`, default 32), so a 2 GB log costs one small
read. Rows of `--jsonl` are `{"id", "log", "idle_seconds"?}`; the output rows are
`{"id", "state", "stage", "confidence", "action", "evidence"}` (+ `needs_operator`, `notes`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperGroup

from app.errors import UserError

if TYPE_CHECKING:
    from app.triage.chain import TriageChain


class _TriageGroup(TyperGroup):
    """A group whose first positional argument, when it is not a sub-command, is a log FILE."""

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["file", *args]
        return super().resolve_command(ctx, args)


app = typer.Typer(
    cls=_TriageGroup,
    help=(
        "Triage a train.log tail: rules, then the specialist, then a capped LLM. "
        "`tuneharness triage FILE` for one log, `--jsonl IN` for many, `train-specialist` to retrain."
    ),
    subcommand_metavar="FILE | COMMAND [ARGS]...",
    invoke_without_command=True,
)


def _chain(*, specialist: bool, llm: bool) -> TriageChain:
    from app import bootstrap

    return bootstrap.triage_chain(with_specialist=specialist, with_llm=llm)


def _print_result(res: dict[str, Any], *, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(res, ensure_ascii=False))
        return
    from app.safetext import printable

    # Evidence is the log's own text: a log may carry escape sequences a terminal would obey.
    flag = "  (needs operator)" if res.get("needs_operator") else ""
    typer.echo(printable(f"{res['state']}  [{res['stage']}, confidence {res['confidence']:.2f}]{flag}"))
    typer.echo(printable(f"  action: {res['action']}"))
    for ev in res["evidence"]:
        if ev:
            typer.echo(printable(f"  evidence: {ev}"))
    for note in res.get("notes", []):
        typer.echo(printable(f"  note: {note}"))


@app.callback()
def triage(
    ctx: typer.Context,
    jsonl: Annotated[
        Path | None, typer.Option("--jsonl", help="JSON lines {id, log, idle_seconds?}; '-' for stdin.")
    ] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="With --jsonl: write results here (default stdout).")
    ] = None,
    no_specialist: Annotated[bool, typer.Option("--no-specialist", help="Skip the specialist model.")] = False,
    no_llm: Annotated[bool, typer.Option("--no-llm", help="Never call the escalation LLM.")] = False,
) -> None:
    """Triage train.log tails: `triage FILE`, `triage --jsonl IN`, or `triage train-specialist`."""
    if ctx.invoked_subcommand is not None:
        return
    if jsonl is None:
        typer.echo(ctx.get_help())
        raise typer.Exit(0)
    import stat

    from app.numbers import is_finite_number
    from app.safetext import printable
    from app.triage.chain import TriageInput

    rows: list[TriageInput] = []
    try:
        if str(jsonl) != "-":
            # A file or a stream (a pipe, `<(cmd)`); a device such as /dev/zero never ends a line.
            mode = jsonl.stat().st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
                raise UserError(f"{printable(str(jsonl))} is not a JSONL file or a pipe. Fix: pass a JSONL file")
        fh = sys.stdin if str(jsonl) == "-" else jsonl.open(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise UserError(f"cannot read {jsonl}: {exc.strerror}. Fix: pass an existing JSONL file") from None
    with fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserError(f"{jsonl}:{lineno}: not JSON ({exc.msg}). Fix: one JSON object per line") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("log", ""), str):
                raise UserError(
                    f'{jsonl}:{lineno}: a row is an object with a string \'log\'. Fix: {{"id": ..., "log": ...}}'
                )
            idle = obj.get("idle_seconds")
            if idle is not None and not (is_finite_number(idle) and idle >= 0):
                raise UserError(f"{jsonl}:{lineno}: idle_seconds must be a finite number >= 0. Fix: e.g. 120")
            rows.append(
                TriageInput(
                    str(obj.get("id", lineno)),
                    obj.get("log") or "",
                    None if idle is None else float(idle),
                    obj.get("job"),
                )
            )
    results = _chain(specialist=not no_specialist, llm=not no_llm).triage_many(rows)
    out = output.open("w", encoding="utf-8") if output is not None else None
    try:
        for r in results:
            text = json.dumps(r.as_dict(), ensure_ascii=False)
            if out is not None:
                out.write(text + "\n")
            else:
                typer.echo(text)
    finally:
        if out is not None:
            out.close()


@app.command("file", hidden=True)
def triage_file(
    file: Annotated[Path, typer.Argument(help="The train.log (read from its tail).")],
    idle_seconds: Annotated[
        float | None, typer.Option("--idle-seconds", help="Seconds since the log last grew.")
    ] = None,
    idle_from_mtime: Annotated[
        bool, typer.Option("--idle-from-mtime", help="Take idle seconds from the file's mtime.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
    tail_kb: Annotated[int, typer.Option("--tail-kb", min=1, max=1024, help="How much of the tail to read.")] = 32,
    no_specialist: Annotated[bool, typer.Option("--no-specialist", help="Skip the specialist model.")] = False,
    no_llm: Annotated[bool, typer.Option("--no-llm", help="Never call the escalation LLM.")] = False,
) -> None:
    """One verdict for one log file."""
    import stat
    import time

    from app.safetext import printable
    from app.triage.rules import read_tail_bytes

    name = printable(str(file))
    try:
        # stat first: opening a FIFO waits for a writer and a device may never end; the tail of
        # a regular file is what triage reads (a stream goes through --jsonl).
        mode = file.stat().st_mode
        if stat.S_ISDIR(mode):
            raise UserError(f"{name} is a directory. Fix: pass the train.log file")
        if not stat.S_ISREG(mode):
            raise UserError(
                f"{name} is not a regular file (a FIFO, device or socket). "
                "Fix: pass the train.log file, or stream rows with --jsonl -"
            )
        tail = read_tail_bytes(file, max_bytes=tail_kb * 1024)
        mtime = file.stat().st_mtime
    except IsADirectoryError:
        raise UserError(f"{name} is a directory. Fix: pass the train.log file") from None
    except OSError as exc:
        raise UserError(f"cannot read {name}: {exc.strerror}. Fix: pass an existing log file") from None
    if idle_seconds is not None:
        from app.numbers import finite

        finite(idle_seconds, "--idle-seconds", minimum=0, maximum=10**9)
    if idle_seconds is None and idle_from_mtime:
        idle_seconds = max(0.0, time.time() - mtime)
    result = _chain(specialist=not no_specialist, llm=not no_llm).triage(tail, idle_seconds=idle_seconds, id=str(file))
    _print_result(result.as_dict(), as_json=as_json)


@app.command("train-specialist")
def train_specialist(
    out: Annotated[Path, typer.Option("--out", help="Work directory: corpus, job dirs, trial.")] = Path(
        "triage-specialist"
    ),
    seeds: Annotated[str, typer.Option("--seeds", help="Comma-separated training seeds (two for the gate).")] = "1,2",
    max_steps: Annotated[int, typer.Option("--max-steps", min=1)] = 200,
    max_seq_len: Annotated[int, typer.Option("--max-seq-len", min=16)] = 128,
    quantization: Annotated[str, typer.Option("--quantization", help="nf4 or none (nf4 is slow on CPU).")] = "nf4",
    corpus_seed: Annotated[int, typer.Option("--corpus-seed")] = 8,
    learning_rate: Annotated[float, typer.Option("--learning-rate")] = 3e-3,
    reuse: Annotated[
        bool, typer.Option("--reuse", help="Keep seeds already trained in --out; re-evaluate only.")
    ] = False,
    real_dev_weight: Annotated[
        int,
        typer.Option(
            "--real-dev-weight", min=0, help="Times each real dev excerpt joins the train split (0: generated only)."
        ),
    ] = 3,
    real_batches: Annotated[
        int | None,
        typer.Option(
            "--real-batches", min=1, help="Train on the dev halves of the first N real batches only (default: all)."
        ),
    ] = None,
    install: Annotated[
        bool, typer.Option("--install", help="Copy the best seed's adapter into the package if the gate promotes.")
    ] = False,
) -> None:
    """Build the corpus, train the specialist with two seeds, evaluate, write and judge a gate trial."""
    # The defaults are TrainingPlan's (the shipped recipe), written out so that `--help` does not
    # import the rules; tests/unit/triage/test_training_plan.py holds the two equal.
    from app.triage.training import TrainingFailed, TrainingPlan, train_and_judge

    try:
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError:
        raise UserError(f"--seeds {seeds!r}: give integers, e.g. 1,2") from None
    if quantization not in ("nf4", "none"):
        raise UserError(f"--quantization {quantization!r}: use nf4 or none")
    plan = TrainingPlan(
        out_dir=out,
        seeds=tuple(seed_list),
        max_steps=max_steps,
        max_seq_len=max_seq_len,
        quantization=quantization,
        corpus_seed=corpus_seed,
        learning_rate=learning_rate,
        reuse=reuse,
        real_dev_weight=real_dev_weight,
        real_batches=real_batches,
    )
    try:
        summary = train_and_judge(plan, install=install, echo=typer.echo)
    except TrainingFailed as exc:  # each names what failed and the fix: one line, not a traceback
        raise UserError(str(exc)) from None
    typer.echo(json.dumps(summary, indent=2))
    raise typer.Exit(0 if summary.get("decision") == "promote" else 1)
