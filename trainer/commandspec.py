"""job.json of a `command` job: the user's own training, run by `trainer run` under the slice protocol.

`{"kind": "command", ...}` instead of the built-in trainer's fields (docs/byo-training.md). Parsed
and validated once; every refusal names the field and the fix (exit 2 before anything starts).
"""

from __future__ import annotations

import json
import math
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.jobspec import JobError

__all__ = ["STACKS", "CommandSpec", "is_command_job", "load_command_job", "parse_command_job"]

STACKS = ("trainer", "log")
# A `log` command's progress: `step 12`, `step=12/200`, `step: 12 ... loss=0.5`.
DEFAULT_PROGRESS = r"\bstep[=: ]+(?P<step>\d+)(?:\s*/\s*(?P<max_steps>\d+))?(?:.*?\bloss[=: ]+(?P<loss>[-+0-9.eE]+))?"
_PIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==[^\s;#]+$")
_FIELDS = (
    "kind",
    "stack",
    "command",
    "setup",
    "env",
    "online",
    "max_steps",
    "keep_checkpoints",
    "status_every_s",
    "grace_s",
    "checkpoints",
    "checkpoint_files",
    "resume_args",
    "output",
    "progress",
    "adapter_meta",
    "seed",
)


@dataclass(frozen=True, slots=True)
class CommandSpec:
    command: tuple[str, ...]  # argv; a string command becomes ("sh", "-c", text)
    stack: str = "trainer"
    setup: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    online: bool = False
    max_steps: int | None = None
    keep_checkpoints: int = 3
    status_every_s: float = 5.0
    grace_s: float = 60.0
    checkpoints: str | None = None  # log stack: glob (relative to DIR) of the run's checkpoint directories
    checkpoint_files: tuple[str, ...] = ()  # log stack: the files a complete checkpoint holds
    resume_args: tuple[str, ...] = ()  # log stack: appended on resume, `{checkpoint}` replaced
    output: str | None = None  # log stack: the directory the finished run leaves
    progress: str = DEFAULT_PROGRESS
    adapter_meta: tuple[tuple[str, Any], ...] = ()
    seed: int = 0  # the run's seed (a gate trains one run per seed): TUNEHARNESS_SEED in the command's env
    job_dir: Path = Path(".")

    def argv(self, *, resume: Path | None) -> list[str]:
        """The command to start; on a `log` stack's resume, with `resume_args` appended."""
        extra = [a.replace("{checkpoint}", str(resume)) for a in self.resume_args] if resume is not None else []
        if not extra:
            return list(self.command)
        if self.command[:2] == ("sh", "-c"):
            return ["sh", "-c", self.command[2] + " " + shlex.join(extra)]
        return [*self.command, *extra]


def _fail(name: str, problem: str) -> JobError:
    return JobError(name, problem)


def _strings(name: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _fail(name, f"must be a list of non-empty strings, got {value!r}")
    return tuple(value)


def _number(name: str, value: Any, *, minimum: float, maximum: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _fail(name, f"must be a finite number, got {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
        raise _fail(name, f"must be {bound}, got {value}")
    return float(value)


def _int(name: str, value: Any, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _fail(name, f"must be an integer >= {minimum}, got {value!r}")
    return value


def _relative(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise _fail(name, f"must be a non-empty path, got {value!r}")
    if Path(value).is_absolute() or ".." in Path(value).parts:
        raise _fail(name, f"must be a path inside the job directory, got {value!r}")
    return value


def is_command_job(raw: Any) -> bool:
    return isinstance(raw, dict) and raw.get("kind") == "command"


def parse_command_job(raw: Any, *, job_dir: Path) -> CommandSpec:
    """Validate a decoded job.json of kind `command`; raise JobError naming the first bad field."""
    if not is_command_job(raw):
        raise _fail("kind", "must be 'command'")
    for key in raw:
        if key not in _FIELDS:
            raise _fail(key, f"unknown field; a command job takes: {', '.join(_FIELDS)}")
    stack = raw.get("stack", "trainer")
    if stack not in STACKS:
        raise _fail("stack", f"must be one of {', '.join(STACKS)}, got {stack!r}")
    command_raw = raw.get("command")
    if isinstance(command_raw, str) and command_raw.strip():
        command: tuple[str, ...] = ("sh", "-c", command_raw)
    elif isinstance(command_raw, list) and command_raw:
        command = _strings("command", command_raw)
    else:
        raise _fail("command", f"must be a command line or a non-empty list of arguments, got {command_raw!r}")
    setup = _strings("setup", raw.get("setup", []))
    for pin in setup:
        if not _PIN.match(pin):
            raise _fail("setup", f"{pin!r} is not a pin. Fix: write name==version")
    env_raw = raw.get("env", {})
    if not isinstance(env_raw, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env_raw.items()):
        raise _fail("env", f"must map names to strings, got {env_raw!r}")
    if any(k.startswith("TUNEHARNESS_") for k in env_raw):
        raise _fail("env", "names starting with TUNEHARNESS_ belong to the trainer. Fix: rename them")
    online = raw.get("online", False)
    if not isinstance(online, bool):
        raise _fail("online", f"must be true or false, got {online!r}")
    max_steps = raw.get("max_steps")
    if max_steps is not None:
        max_steps = _int("max_steps", max_steps, minimum=1)
    meta = raw.get("adapter_meta", {})
    if not isinstance(meta, dict):
        raise _fail("adapter_meta", f"must be an object, got {meta!r}")
    progress = raw.get("progress", DEFAULT_PROGRESS)
    try:
        if "step" not in re.compile(progress).groupindex:
            raise _fail("progress", "needs a named group (?P<step>\\d+)")
    except (re.error, TypeError) as e:
        raise _fail("progress", f"is not a regular expression: {e}") from None
    spec = CommandSpec(
        command=command,
        stack=stack,
        setup=setup,
        env=tuple(sorted(env_raw.items())),
        online=online,
        max_steps=max_steps,
        keep_checkpoints=_int("keep_checkpoints", raw.get("keep_checkpoints", 3), minimum=1),
        status_every_s=_number("status_every_s", raw.get("status_every_s", 5.0), minimum=0.1, maximum=10.0),
        grace_s=_number("grace_s", raw.get("grace_s", 60.0), minimum=0.0),
        checkpoints=None if raw.get("checkpoints") is None else _relative("checkpoints", raw["checkpoints"]),
        checkpoint_files=_strings("checkpoint_files", raw.get("checkpoint_files", [])),
        resume_args=_strings("resume_args", raw.get("resume_args", [])),
        output=None if raw.get("output") is None else _relative("output", raw["output"]),
        progress=progress,
        adapter_meta=tuple(sorted(meta.items())),
        seed=_int("seed", raw.get("seed", 0), minimum=0),
        job_dir=job_dir,
    )
    if stack == "log":
        for name in ("checkpoints", "output"):
            if getattr(spec, name) is None:
                raise _fail(name, "is required for a `log` stack (where the run writes it)")
        if not spec.checkpoint_files:
            raise _fail("checkpoint_files", "is required for a `log` stack: the files a complete checkpoint holds")
        if not any("{checkpoint}" in a for a in spec.resume_args):
            raise _fail("resume_args", "must name {checkpoint} for a `log` stack, e.g. [--resume, '{checkpoint}']")
    return spec


def load_command_job(job_dir: Path) -> CommandSpec:
    path = job_dir / "job.json"
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise JobError("<file>", f"{path} does not exist") from None
    except (OSError, json.JSONDecodeError) as e:
        raise JobError("<file>", f"{path} is not readable JSON: {e}") from None
    return parse_command_job(raw, job_dir=job_dir)
