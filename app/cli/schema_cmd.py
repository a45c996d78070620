"""`tuneharness schema`: the JSON Schema of what a person writes (a job file), for editors and CI.

`tuneharness schema job` prints the job file's JSON Schema (draft 2020-12), generated from the
models that validate job files (`app/jobschema.py`); `docs/job.schema.json` is the same text,
checked in. Needs nothing running.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Annotated

import typer

from app.errors import UserError

app = typer.Typer(help="JSON Schemas of the files you write (editors complete and check them).", no_args_is_help=True)


def job_schema_text() -> str:
    """The job file's JSON Schema as `docs/job.schema.json` holds it (2-space indent, final newline)."""
    from app.jobschema import job_schema

    return json.dumps(job_schema(), indent=2, ensure_ascii=False) + "\n"


@app.command("job")
def job(
    out: Annotated[
        Path | None,
        typer.Option("--out", help="write the schema to this file (replaced atomically) instead of printing it"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON (the schema is JSON either way)")] = False,
) -> None:
    """Print the job file's JSON Schema: types, ranges, choices and each field's description.

    Regenerate the checked-in copy with `tuneharness schema job --out docs/job.schema.json`.
    Exit codes: 0 printed or written, 2 the file cannot be written.
    """
    text = job_schema_text()
    if out is None:
        typer.echo(text, nl=False)
        return
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, out)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise UserError(f"{out}: cannot be written ({exc.strerror}). Fix: pass a writable path with --out") from None
    typer.echo(f"wrote {out}")
