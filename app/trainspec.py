"""`train: {kind: command, ...}`: the user's own training (a plain `transformers.Trainer` script, a
TRL script, an axolotl config, or any command) under the same guarantees as the built-in trainer.

The model checks the job file's section; `command_job_json` turns it into the host's job.json
(`trainer/commandspec.py` is the authority there) and `command_files` lists what is shipped.
For the stacks built on `transformers.Trainer` everything has a default: `script: sft.py` or
`axolotl: cfg.yml` is enough (docs/byo-training.md).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["CommandTrain", "HubRef", "command_files", "command_job_json"]

_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
Pin = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*==[^\s;#]+$")]
RelPath = Annotated[str, Field(min_length=1)]


class HubRef(BaseModel):
    """A public Hugging Face model the host fetches itself into `base_model/`, pinned to a commit."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    hf: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$", description="ORG/NAME.")
    revision: str = Field(pattern=r"^[0-9a-f]{40}$", description="The 40-hex commit the hub shows.")


class CommandTrain(BaseModel):
    """Bring your own training: exactly one of `script`, `axolotl` or `command`."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    kind: Literal["command"] = Field(description="The user's own training command (docs/byo-training.md).")
    script: RelPath | None = Field(
        default=None,
        description="A Python script built on transformers.Trainer (plain Trainer, TRL): run as `python SCRIPT ARGS`.",
    )
    axolotl: RelPath | None = Field(
        default=None, description="An axolotl config: run as `accelerate launch -m axolotl.cli.train CONFIG`."
    )
    command: str | list[str] | None = Field(
        default=None, description="Any command line (or argument list), run in the job's directory on the host."
    )
    args: list[str] = Field(default_factory=list, description="Arguments after the script; `{seed}` is the run's seed.")
    stack: Literal["trainer", "log"] | None = Field(
        default=None,
        description=(
            "trainer: the command runs a transformers.Trainer (the callback is injected; default for script and "
            "axolotl); log: any other command (progress from its output, the cap a signal)."
        ),
    )
    files: list[RelPath] = Field(
        default_factory=list,
        description="Files and directories shipped next to the job file's (same relative paths); the script or "
        "config is always shipped.",
    )
    base_model: RelPath | HubRef | None = Field(
        default=None,
        description="The base model: a directory shipped as base_model/, or {hf, revision} fetched by the host. "
        "Needed by the gate's built-in predictor.",
    )
    train_file: RelPath | None = Field(
        default=None, description="The training data (shipped); the gate checks eval rows against it."
    )
    setup: list[Pin] = Field(
        default_factory=list,
        description="Pinned packages (name==version) installed on the host without dependency resolution, cached.",
    )
    env: dict[str, str] = Field(default_factory=dict, description="Environment variables for the command.")
    online: bool = Field(default=False, description="Let the command reach the Hugging Face Hub (default offline).")
    max_steps: int | None = Field(default=None, ge=1, description="Steps of the whole run (status; the Trainer knows).")
    seed: int = Field(default=0, ge=0, description="The run's seed: `{seed}` in args, TUNEHARNESS_SEED in env.")
    keep_checkpoints: int = Field(default=3, ge=1, le=100, description="Complete checkpoints kept on the host.")
    grace_s: float = Field(default=60.0, ge=0, le=3600, description="Seconds between the cap's SIGTERM and SIGKILL.")
    checkpoints: RelPath | None = Field(default=None, description="log stack: glob of the run's checkpoint dirs.")
    checkpoint_files: list[RelPath] = Field(
        default_factory=list, description="log stack: files a checkpoint holds once complete."
    )
    resume_args: list[str] = Field(
        default_factory=list, description="log stack: arguments appended on resume; `{checkpoint}` is its path."
    )
    output: RelPath | None = Field(default=None, description="log stack: the directory the finished run leaves.")
    predict: str | None = Field(
        default=None,
        description="The gate's predictor for this run's output: a command reading rows on stdin, writing "
        "predictions on stdout; `{adapter}` is the output's directory. Default: the built-in predictor (PEFT).",
    )

    @model_validator(mode="after")
    def _one_way_to_run(self) -> CommandTrain:
        given = [n for n in ("script", "axolotl", "command") if getattr(self, n)]
        if len(given) != 1:
            raise ValueError(f"give exactly one of script, axolotl or command (got {', '.join(given) or 'none'})")
        for name, value in (("grace_s", self.grace_s),):
            if not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number")
        paths = [self.script, self.axolotl, self.train_file, self.checkpoints, self.output, *self.files]
        if isinstance(self.base_model, str):
            paths.append(self.base_model)
        for p in paths:
            if p is not None and (Path(p).is_absolute() or os.path.normpath(p).split(os.sep)[0] == os.pardir):
                raise ValueError(f"{p!r} must be a path under the job file's directory")
        if self.stack == "log":
            missing = [n for n in ("checkpoints", "output") if getattr(self, n) is None]
            if missing or not self.checkpoint_files or not any("{checkpoint}" in a for a in self.resume_args):
                raise ValueError(
                    "a log stack needs checkpoints, checkpoint_files, output and resume_args naming {checkpoint}"
                )
        return self


def _argv(t: CommandTrain) -> str | list[str]:
    args = [a.replace("{seed}", str(t.seed)) for a in t.args]
    if t.script is not None:
        return ["python", t.script, *args]
    if t.axolotl is not None:
        return ["accelerate", "launch", "-m", "axolotl.cli.train", t.axolotl, *args]
    assert t.command is not None
    if isinstance(t.command, str):
        return t.command.replace("{seed}", str(t.seed)) + ("" if not args else " " + " ".join(args))
    return [a.replace("{seed}", str(t.seed)) for a in t.command] + args


def command_job_json(train: Mapping[str, Any]) -> dict[str, Any]:
    """The host's job.json (`kind: command`) for a validated `train:` section."""
    t = CommandTrain.model_validate(dict(train))
    out: dict[str, Any] = {
        "kind": "command",
        "stack": t.stack or "trainer",
        "command": _argv(t),
        "keep_checkpoints": t.keep_checkpoints,
        "grace_s": t.grace_s,
        "env": dict(t.env),
        "online": t.online,
        "seed": t.seed,
    }
    if t.setup:
        out["setup"] = list(t.setup)
    if t.max_steps is not None:
        out["max_steps"] = t.max_steps
    if t.base_model is not None:
        out["adapter_meta"] = {"base_model": "base_model"}
    for name in ("checkpoints", "output"):
        if getattr(t, name) is not None:
            out[name] = getattr(t, name)
    if t.checkpoint_files:
        out["checkpoint_files"] = list(t.checkpoint_files)
    if t.resume_args:
        out["resume_args"] = list(t.resume_args)
    return out


def command_files(train: Mapping[str, Any], *, base_dir: str | Path) -> tuple[list[tuple[Path, str]], HubRef | None]:
    """(local file, path under the host's job dir) for everything shipped, and a hub model to fetch."""
    t = CommandTrain.model_validate(dict(train))
    base = Path(base_dir)
    out: list[tuple[Path, str]] = []
    hub = t.base_model if isinstance(t.base_model, HubRef) else None
    wanted = [p for p in (t.script, t.axolotl, t.train_file, *t.files) if p is not None]
    seen: set[str] = set()
    for rel in wanted:
        local = base / rel
        for path, remote in _walk(local, os.path.normpath(rel)):
            if remote not in seen:
                seen.add(remote)
                out.append((path, remote))
    if isinstance(t.base_model, str):
        for path, remote in _walk(base / t.base_model, "base_model"):
            out.append((path, remote))
    return out, hub


def _walk(local: Path, remote: str) -> list[tuple[Path, str]]:
    if local.is_dir():
        return [(p, f"{remote}/{p.relative_to(local).as_posix()}") for p in sorted(local.rglob("*")) if p.is_file()]
    return [(local, Path(remote).as_posix())]
