"""Job files (YAML) and the job table: what a user submits, validated with errors that name the
field and the line.

A job file says what to train (the trainer's job.json fields under `train`; the base model and
data it names are shipped to the host), what it needs from a host, its budget, and its gate:

    name: log-doctor
    train:                      # the trainer's job.json (docs: trainer/jobspec.py)
      base_model: models/tiny-causal
      task: causal_lm
      train_file: data/train.jsonl
      eval_file: data/eval.jsonl
      max_steps: 200
      checkpoint_every: 50
      seed: 1
      learning_rate: 2.0e-4
      batch_size: 8
      max_seq_len: 256
      lora: {r: 8, alpha: 16, target_modules: [q_proj, v_proj]}
      quantization: nf4
    needs:
      gpu: [RTX 3090, RTX 4090]
      min_vram_gb: 24
      max_usd_per_hour: 0.60
      providers: [vast, runpod]
      image: pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime
      disk_gb: 60
      min_reliability: 0.98       # optional: a hard floor on the platform's score (unset: the score only weighs in)
      datacenter_only: false      # optional: only datacenter hosts (Vast datacenter, RunPod secure cloud)
      min_download_mbps: 500      # optional
      download_gb: 23             # optional: image + model pulled (ranking, reservation)
      train_hours: 0.5            # optional: expected training time (ranking, reservation, kill-time)
      kill_after_hours: 3         # optional: each rental's kill-time after its create (default: derived)
      standby_hosts: 1            # optional (default 0): verified hosts kept waiting for this job's recoveries
      expected_tflops: 48         # optional: bf16 TFLOP/s a healthy card reaches (default: learned, docs/jobs.md)
    budget_usd: 5.00
    gate:                         # optional: evaluate and judge the adapters (docs/gate.md)
      config: gate.json           # a gate.json path, or the gate.json mapping inline
      eval: data/gate-eval.jsonl  # or a list; rows {"id", "slice", "text" | "prompt", "expected"}
      baseline: predictions:data/baseline.jsonl   # or command:CMD (run in the job file's directory)
      incumbent: adapter:prod/adapter             # optional: the model in production now
      seeds: [1, 2]               # optional (default [1, 2]); at least two
      timeout_s: 400              # optional: per predictor (default 400)

A job with a gate trains one adapter per seed: submit records the job and one run per seed
(`<job>-seed-<N>`, the job's `train` with `seed: N`, the budget split evenly), each provisioned
and supervised on its own; when the last run's adapter is pulled, `evaluate_job` builds the
trial and judges it.

Paths are relative to the job file and may not climb out of its directory (an absolute path is a
deliberate choice); what is shipped is a regular file or a directory. Every number is finite and
in range (`app.numbers`): NaN and infinity are refused where they are read. The trainer
validates job.json fully on the host; here the fields, their types and the shipped files are
checked before anything is enqueued or spent: the shape by the models of `app.jobschema` (which
also publish the file's JSON Schema, docs/job.schema.json), then what needs the file system.
"""

from __future__ import annotations

import json
import os
import stat
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy import Engine, select
from sqlmodel import Field, SQLModel

from app import jobschema
from app.db import money_check, read_connection, write_transaction
from app.errors import UserError
from app.jobschema import (
    DEFAULT_GATE_SEEDS,
    MAX_STANDBY_HOSTS,
    BuiltinTrain,
    GateConfig,
    GateSection,
    HubModel,
    JobFile,
    NeedsSection,
    Problem,
    first_problem,
)
from app.numbers import MAX_USD, range_problem
from app.policy.ranking import JobShape, Requirements
from app.safetext import printable
from app.trainspec import CommandTrain

__all__ = [
    "DEFAULT_GATE_SEEDS",
    "JOB_PHASES",
    "MAX_STANDBY_HOSTS",
    "JobEvaluation",
    "JobEvaluationRow",
    "JobFileError",
    "JobRecord",
    "JobRow",
    "JobSpec",
    "JobStore",
    "Needs",
    "load_job_file",
    "parse_job_text",
    "seed_run_id",
    "spec_from_dict",
]

JOB_PHASES = (
    "queued",
    "provisioning",
    "training",
    "paused",
    "evaluating",
    "done",
    "failed",
    "cancelled",
    # the fleet cannot move it on without the operator (a missing key, a refused key, an internal
    # error): its detail holds the reason and the fix; `tuneharness resume` continues it
    "blocked",
)
PROVIDERS = jobschema.PROVIDERS

# The trainer's job.json contract (trainer/jobspec.py is the authority on the host), read off the model.
_TRAIN_REQUIRED = tuple(k for k, f in BuiltinTrain.model_fields.items() if f.is_required())
_TRAIN_OPTIONAL = tuple(k for k, f in BuiltinTrain.model_fields.items() if not f.is_required() and k != "kind")
# gate.json's keys (gate/trial.py is the authority; checked here so a typo fails at submit)
_GATE_CONFIG = tuple(GateConfig.model_fields)
DEFAULT_GATE_TIMEOUT_S = 400.0


def seed_run_id(job_id: str, seed: int) -> str:
    """The id of a gated job's training run for `seed`."""
    return f"{job_id}-seed-{seed}"


class JobFileError(UserError):
    """A job file that cannot run; the message names the file, line, field and the fix."""

    def __init__(self, source: str, line: int | None, field_name: str, problem: str, fix: str) -> None:
        self.source, self.line, self.field, self.problem = source, line, field_name, problem
        where = f"{source} line {line}" if line is not None else source
        # what a file says is escaped, never sent to a terminal: one line, no control characters
        super().__init__(printable(f"{where}: {field_name}: {problem}. Fix: {fix}"))


@dataclass(frozen=True, slots=True)
class Needs:
    gpu: tuple[str, ...] = ()
    min_vram_gb: float = 0.0
    max_usd_per_hour: float | None = None
    providers: tuple[str, ...] = ()
    image: str = "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
    disk_gb: float = 60.0
    num_gpus: int = 1
    min_reliability: float = 0.98
    min_download_mbps: float = 0.0
    download_gb: float = 20.0  # image + model the host pulls (for ranking and the reservation)
    train_hours: float = 1.0  # expected training time at full speed (same)
    standby_hosts: int = 0  # verified hosts kept waiting (and billing) for this job's recoveries
    kill_after_hours: float | None = None  # each rental's kill-time after its create (None: derived)
    datacenter_only: bool = False  # only datacenter hosts (Vast datacenter, RunPod secure cloud)
    # bf16 TFLOP/s a healthy card of the job's GPU reaches on the preflight (None: learned per model,
    # app.policy.speeds); a host below 85% of it is throttled.
    expected_tflops: float | None = None
    # The job file named min_reliability: a hard filter. Unset, 0.98 is soft (only the prior of
    # the delivery probability under the guarded policy; see app.policy.ranking).
    min_reliability_hard: bool = False

    def requirements(self) -> Requirements:
        """The provisioning policy's filters for this job."""
        return Requirements(
            gpu_names=self.gpu,
            min_gpu_ram_gb=self.min_vram_gb,
            num_gpus=self.num_gpus,
            min_reliability=self.min_reliability,
            reliability_floor_soft=not self.min_reliability_hard,
            min_inet_down_mbps=self.min_download_mbps,
            max_dph=self.max_usd_per_hour,
            providers=self.providers,
            datacenter_only=self.datacenter_only,
        )


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A validated job file."""

    name: str
    train: Mapping[str, Any]
    needs: Needs
    budget_usd: float | None = None
    gate: Mapping[str, Any] | None = None  # normalised: config, eval, baseline, incumbent, seeds, timeout_s
    base_dir: str = "."
    source: str = "<job>"
    ship: tuple[str, ...] = field(default=())  # absolute paths to push to the host
    parent: str | None = None  # a gated job's training run: the job it trains a seed for

    @property
    def seeds(self) -> tuple[int, ...]:
        """The training seeds of a gated job (empty without a gate)."""
        if self.gate is None:
            return ()
        return tuple(int(s) for s in self.gate.get("seeds", DEFAULT_GATE_SEEDS))

    def seed_run(self, seed: int, *, parent: str) -> JobSpec:
        """This job's training run for `seed`: the same training with that seed, no gate, its share of the budget."""
        n = max(1, len(self.seeds))
        return JobSpec(
            name=f"{self.name}-seed-{seed}",
            train={**self.train, "seed": seed},
            needs=self.needs,
            budget_usd=None if self.budget_usd is None else self.budget_usd / n,
            gate=None,
            base_dir=self.base_dir,
            source=self.source,
            ship=self.ship,
            parent=parent,
        )

    def shape(self) -> JobShape:
        """What one attempt at this job pulls, trains and stores (for ranking and reservations)."""
        return JobShape(
            download_gb=self.needs.download_gb,
            train_s=self.needs.train_hours * 3600.0,
            disk_gb=self.needs.disk_gb,
            kill_after_s=None if self.needs.kill_after_hours is None else self.needs.kill_after_hours * 3600.0,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "train": dict(self.train),
            "needs": {
                "gpu": list(self.needs.gpu),
                "min_vram_gb": self.needs.min_vram_gb,
                "max_usd_per_hour": self.needs.max_usd_per_hour,
                "providers": list(self.needs.providers),
                "image": self.needs.image,
                "disk_gb": self.needs.disk_gb,
                "num_gpus": self.needs.num_gpus,
                "min_reliability": self.needs.min_reliability,
                "min_download_mbps": self.needs.min_download_mbps,
                "download_gb": self.needs.download_gb,
                "train_hours": self.needs.train_hours,
                "standby_hosts": self.needs.standby_hosts,
                "kill_after_hours": self.needs.kill_after_hours,
                "datacenter_only": self.needs.datacenter_only,
                "expected_tflops": self.needs.expected_tflops,
                "min_reliability_hard": self.needs.min_reliability_hard,
            },
            "budget_usd": self.budget_usd,
            "gate": None if self.gate is None else dict(self.gate),
            "base_dir": self.base_dir,
            "source": self.source,
            "ship": list(self.ship),
            "parent": self.parent,
        }


# -- YAML with line numbers -------------------------------------------------------------------
MAX_YAML_NODES = 10_000  # values in a job file once aliases are expanded
MAX_YAML_DEPTH = 32


def _compose(text: str, source: str) -> tuple[Any, dict[str, int]]:
    """Parse YAML into plain data plus a map from dotted field path to its line (1-based)."""
    import yaml

    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise JobFileError(source, line, "(file)", f"not valid YAML ({problem})", "correct the YAML syntax") from None
    except RecursionError:
        raise JobFileError(source, None, "(file)", "nested too deeply", "write a flat job file") from None
    lines: dict[str, int] = {}
    if node is None:
        return None, lines
    # Aliases share one node, so composing is cheap, but walking expands every alias: a "billion
    # laughs" file of a few lines would walk 10^9 nodes. Count them and stop early.
    budget = [MAX_YAML_NODES]

    def walk(n: Any, path: str, depth: int = 0) -> Any:
        budget[0] -= 1
        if budget[0] < 0 or depth > MAX_YAML_DEPTH:
            raise JobFileError(
                source,
                n.start_mark.line + 1,
                "(file)",
                f"expands to more than {MAX_YAML_NODES} values or {MAX_YAML_DEPTH} levels (YAML aliases?)",
                "write the job file without repeated aliases (&anchor / *alias)",
            )
        lines.setdefault(path, n.start_mark.line + 1)
        if isinstance(n, yaml.MappingNode):
            out: dict[str, Any] = {}
            for k, v in n.value:
                key = str(k.value) if isinstance(k, yaml.ScalarNode) else f"(key at line {k.start_mark.line + 1})"
                sub = f"{path}.{key}" if path else key
                lines[sub] = k.start_mark.line + 1
                out[key] = walk(v, sub, depth + 1)
            return out
        if isinstance(n, yaml.SequenceNode):
            return [walk(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(n.value)]
        loader = yaml.SafeLoader("")
        try:
            return loader.construct_object(n, deep=True)
        finally:
            loader.dispose()

    return walk(node, ""), lines


class _Check:
    """Where a refusal points: the field's line in the job file (else its section's)."""

    def __init__(self, source: str, lines: Mapping[str, int]) -> None:
        self.source, self.lines = source, lines

    def fail(self, path: str, problem: str, fix: str, *, field_name: str | None = None) -> JobFileError:
        line = self.lines.get(path)
        if line is None and "." in path:
            line = self.lines.get(path.rsplit(".", 1)[0])
        return JobFileError(self.source, line, path if field_name is None else field_name, problem, fix)

    def refuse(self, p: Problem) -> JobFileError:
        return self.fail(p.at, p.problem, p.fix, field_name=p.field)


def parse_job_text(
    text: str, *, source: str = "<job>", base_dir: str | Path = ".", check_files: bool = True
) -> JobSpec:
    """Validate a job file's text; raise JobFileError naming the line and field of the first problem.

    The models of `app.jobschema` check the shape (types, ranges, choices, keys); then what needs
    the file system is checked: paths contained and shippable, the gate's files and eval rows."""
    data, lines = _compose(text, source)
    c = _Check(source, lines)
    try:
        job = JobFile.model_validate(data)
    except ValidationError as exc:
        raise c.refuse(first_problem(exc)) from None
    base = Path(base_dir)
    # the trainer's job.json as written (its own parser reads it on the host); `kind` is ours
    train = {k: v for k, v in data["train"].items() if k != "kind"}
    ship: list[str] = []
    byo = isinstance(job.train, CommandTrain)  # the user's own training: app.trainspec
    if isinstance(job.train, CommandTrain):
        train, ship = dict(data["train"]), _command_ship(c, job.train, base, check_files=check_files)
    for key in () if byo else ("base_model", "train_file", "eval_file"):
        rel = getattr(job.train, key)
        if rel is None or isinstance(rel, HubModel):
            continue  # unset, or a public model the host fetches itself: nothing shipped
        p = _contained(c, rel, f"train.{key}", base)
        if check_files and not p.exists():
            fix = "point it at a file or directory next to the job file"
            if key == "base_model":  # the shipped example's model is made, not downloaded
                fix = (
                    f"point it at a model directory next to the job file, or write a tiny random one to try "
                    f"things: python -m trainer make-tiny-model {p}"
                )
            raise c.fail(f"train.{key}", f"{p} does not exist", fix)
        if check_files:
            _plain(c, p, f"train.{key}")
            _shippable(c, p, f"train.{key}")
        ship.append(str(p.resolve()) if check_files else str(p))

    gate = None
    if job.gate is not None:
        tf = job.train.train_file
        train_file = None if tf is None else _contained(c, tf, "train.train_file", base)
        gate = _gate_section(c, job.gate, base, check_files=check_files, train_file=train_file)

    return JobSpec(
        name=job.name,
        train=train,
        needs=_needs(job.needs),
        budget_usd=job.budget_usd,
        gate=gate,
        base_dir=str(base.resolve()),
        source=source,
        ship=tuple(ship),
    )


def _command_ship(c: _Check, t: CommandTrain, base: Path, *, check_files: bool) -> list[str]:
    """A `kind: command` section's shipped files and directories: contained, present, shippable."""
    named = [("train.script", t.script), ("train.axolotl", t.axolotl), ("train.train_file", t.train_file)]
    named += [(f"train.files[{i}]", f) for i, f in enumerate(t.files)]
    if isinstance(t.base_model, str):
        named.append(("train.base_model", t.base_model))
    ship = []
    for where, rel in named:
        if rel is None:
            continue
        p = _contained(c, rel, where, base)
        if check_files:
            if not p.exists():
                raise c.fail(where, f"{p} does not exist", "point it at a file or directory next to the job file")
            _plain(c, p, where)
            _shippable(c, p, where)
        ship.append(str(p.resolve()) if check_files else str(p))
    return ship


def _needs(n: NeedsSection) -> Needs:
    """The validated `needs:` as the policy's Needs: what the file left out keeps Needs' default."""
    given: dict[str, Any] = {key: getattr(n, key) for key in n.model_fields_set}
    for key in ("gpu", "providers"):
        if key in given:
            given[key] = tuple(given[key])
    return Needs(**given, min_reliability_hard="min_reliability" in given)


def _path(c: _Check, rel: str, path: str, base: Path, *, check_files: bool, what: str) -> str:
    p = _contained(c, rel, path, base)
    if check_files and not p.exists():
        raise c.fail(path, f"{p} does not exist", f"point it at {what} (paths are relative to the job file)")
    if check_files:
        _plain(c, p, path)
    return str(p.resolve()) if check_files else str(p)


def _shippable(c: _Check, p: Path, path: str) -> None:
    """What goes to a stranger's host holds no secret (app.shipguard): nothing from the state
    directory, no private key, no credential file."""
    from app.shipguard import shipping_refusal

    problem = shipping_refusal(p)
    if problem is not None:
        raise c.fail(
            path, problem, "ship only the model and the data: keep them outside TUNEHARNESS_HOME, without keys or .env"
        )


def _contained(c: _Check, rel: str, path: str, base: Path) -> Path:
    """`rel` against the job file's directory. A relative path may not climb out of it (`..`):
    a path from elsewhere is written absolute, on purpose."""
    if "\0" in rel:
        raise c.fail(path, "holds a NUL character", "write a plain path")
    if Path(rel).is_absolute():
        return Path(rel)
    if os.path.normpath(rel).split(os.sep)[0] == os.pardir:
        raise c.fail(
            path,
            f"{rel!r} leaves the job file's directory",
            "keep the file under the job file's directory, or write its absolute path on purpose",
        )
    return base / rel


def _plain(c: _Check, p: Path, path: str) -> None:
    """What is shipped or read is a regular file or a directory, never a FIFO, device or socket
    (reading one would hang or never end)."""
    try:
        mode = p.stat().st_mode
    except OSError as exc:
        raise c.fail(path, f"{p} cannot be read ({exc.strerror})", "point it at a readable file") from None
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise c.fail(path, f"{p} is not a regular file or directory", "point it at a file or a directory")


def _predictor(c: _Check, text: str, path: str, base: Path, *, check_files: bool) -> str:
    """A predictor (its form already checked by the model) with its file's path resolved."""
    kind, _, rest = text.partition(":")
    if kind == "command":
        return text
    return f"{kind}:{_path(c, rest, path, base, check_files=check_files, what='a file or directory')}"


def _check_eval_rows(c: _Check, file: Path, path: str) -> list[tuple[str, str, str]]:
    """Eval rows: {"id", "slice", "expected", "text" | "prompt"}; the first bad line is named.
    Returns each row's (id, slice, input)."""
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise c.fail(path, f"{file} cannot be read ({exc})", "point it at a UTF-8 JSONL file") from None
    rows: list[tuple[str, str, str]] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise c.fail(path, f"{file} line {lineno}: not JSON", "one JSON object per line") from None
        ok = isinstance(row, dict) and all(isinstance(row.get(k), str) and row[k] for k in ("id", "slice", "expected"))
        ok = ok and sum(isinstance(row.get(k), str) for k in ("text", "prompt")) == 1
        if not ok:
            raise c.fail(
                path,
                f"{file} line {lineno}: a row needs id, slice, expected and one of text or prompt",
                'write {"id": "h1", "slice": "heldout", "prompt": "...", "expected": "..."}',
            )
        sl = row["slice"]
        if sl not in ("heldout", "canary") and not (sl.startswith("ood:") and len(sl) > 4):
            raise c.fail(path, f"{file} line {lineno}: unknown slice {sl!r}", 'use "heldout", "canary" or "ood:<name>"')
        rows.append((row["id"], sl, row["text"] if isinstance(row.get("text"), str) else row["prompt"]))
    if not rows:
        raise c.fail(path, f"{file} holds no rows", "add held-out rows to evaluate on")
    return rows


def _check_eval_integrity(
    c: _Check, rows: list[tuple[str, str, str]], cfg: Mapping[str, Any], train_file: Path | None, where: str
) -> None:
    """The gate's integrity checks, at submit rather than after hours of training: enough canaries
    (gate.json's `min_canaries`, DEFAULT_MIN_CANARIES unless it says lower on purpose), and no eval
    row whose input is also in the training data (by content hash, `app.evalrows`)."""
    from app.evalrows import leak_message, leaked_rows, training_hashes
    from app.policy.gate_rules import DEFAULT_MIN_CANARIES

    wanted = int(cfg.get("min_canaries", DEFAULT_MIN_CANARIES))  # a whole number >= 0: the model checked it
    canaries = {row_id for row_id, sl, _ in rows if sl == "canary"}
    if len(canaries) < wanted:
        raise c.fail(
            where,
            f"{len(canaries)} canary row(s); the gate needs at least {wanted}",
            'add rows with "slice": "canary", or set min_canaries lower in the gate config on purpose',
        )
    if train_file is None or not train_file.is_file():
        return
    try:
        seen = training_hashes([train_file])
    except (OSError, UnicodeDecodeError) as exc:
        raise c.fail(
            "train.train_file", f"{train_file} cannot be read ({exc})", "point it at a UTF-8 JSONL file"
        ) from None
    leaked = leaked_rows(((row_id, text) for row_id, _, text in rows), seen)
    if leaked:
        raise c.fail(where, leak_message(leaked), "remove them from the eval set (or from the training data)")


def _gate_section(
    c: _Check, g: GateSection, base: Path, *, check_files: bool, train_file: Path | None = None
) -> dict[str, Any]:
    """The job's gate, normalised: paths absolute, seeds a list, the defaults filled in."""
    out: dict[str, Any] = {}
    cfg: dict[str, Any] | None = None
    if isinstance(g.config, GateConfig):
        cfg = g.config.model_dump(exclude_unset=True)
        out["config"] = dict(cfg)
    else:
        cfg_path = _path(c, g.config, "gate.config", base, check_files=check_files, what="a gate.json file")
        if check_files:
            cfg = _gate_json(c, Path(cfg_path))
        out["config"] = cfg_path
    evals = g.eval if isinstance(g.eval, list) else [g.eval]
    out["eval"] = []
    rows: list[tuple[str, str, str]] = []
    for i, e in enumerate(evals):
        where = f"gate.eval[{i}]" if isinstance(g.eval, list) and f"gate.eval[{i}]" in c.lines else "gate.eval"
        p = _path(c, e, where, base, check_files=check_files, what="a JSONL eval file")
        if check_files:
            rows += _check_eval_rows(c, Path(p), where)
        out["eval"].append(p)
    out["baseline"] = _predictor(c, g.baseline, "gate.baseline", base, check_files=check_files)
    if g.incumbent is not None:
        out["incumbent"] = _predictor(c, g.incumbent, "gate.incumbent", base, check_files=check_files)
    out["seeds"] = list(g.seeds)
    out["timeout_s"] = DEFAULT_GATE_TIMEOUT_S if g.timeout_s is None else float(g.timeout_s)
    if check_files:
        _check_eval_integrity(c, rows, cfg or {}, train_file, "gate.eval")
    return out


def _gate_json(c: _Check, path: Path) -> dict[str, Any]:
    """A referenced gate.json, read and checked by the same model as an inline one."""
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise c.fail("gate.config", f"{path} is not readable JSON ({exc})", "fix gate.json") from None
    if not isinstance(loaded, dict):
        raise c.fail("gate.config", f"{path} is not a JSON object", 'write gate.json as {"metric": ...}')
    try:
        GateConfig.model_validate(loaded)
    except ValidationError as exc:
        p = first_problem(exc, GateConfig)
        if p.problem == "unknown field":
            unknown = sorted(set(loaded) - set(_GATE_CONFIG))
            raise c.fail("gate.config", f"{path}: unknown key(s) {', '.join(unknown)}", p.fix) from None
        where = f"{p.field}: " if p.field not in ("", "(file)") else ""
        raise c.fail("gate.config", f"{path}: {where}{p.problem}", p.fix) from None
    return loaded


def spec_from_dict(d: Mapping[str, Any]) -> JobSpec:
    """The JobSpec `JobSpec.to_dict` stored (already validated at submit)."""
    n = dict(d["needs"])
    needs = Needs(**{**n, "gpu": tuple(n.get("gpu", ())), "providers": tuple(n.get("providers", ()))})
    gate = d.get("gate")
    return JobSpec(
        name=d["name"],
        train=d["train"],
        needs=needs,
        budget_usd=d.get("budget_usd"),
        gate=gate if isinstance(gate, Mapping) else None,
        base_dir=d.get("base_dir", "."),
        source=d.get("source", "<job>"),
        ship=tuple(d.get("ship", ())),
        parent=d.get("parent"),
    )


def load_job_file(path: str | Path) -> JobSpec:
    """Read and validate a job file; paths inside it are relative to its directory."""
    p = Path(path)
    return parse_job_text(_read_job_text(p), source=str(p), base_dir=p.parent)


# A job file is a page of YAML; anything bigger is not one.
MAX_JOB_FILE_BYTES = 1 << 20


def _read_job_text(p: Path) -> str:
    """The job file's text: a regular file (a FIFO or a device would block or never end), at most
    MAX_JOB_FILE_BYTES, UTF-8."""

    def refuse(problem: str, fix: str = "pass a job file (YAML text)") -> JobFileError:
        return JobFileError(str(p), None, "(file)", problem, fix)

    try:
        # O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting for one.
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise refuse(f"cannot be read ({exc.strerror})", "pass an existing job file") from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise refuse("is a directory", "pass the job file inside it")
        if not stat.S_ISREG(mode):
            raise refuse("is not a regular file (a FIFO, device or socket)")
        data = b""
        while len(data) <= MAX_JOB_FILE_BYTES:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            data += chunk
    except OSError as exc:
        raise refuse(f"cannot be read ({exc.strerror})", "pass an existing job file") from None
    finally:
        os.close(fd)
    if len(data) > MAX_JOB_FILE_BYTES:
        raise refuse(f"is larger than {MAX_JOB_FILE_BYTES >> 10} KiB", "a job file is a page of YAML")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise JobFileError(
            str(p), line, "(file)", "not UTF-8 text (a binary file?)", "pass the job file, saved as UTF-8"
        ) from None


# -- the job table ----------------------------------------------------------------------------
class JobRow(SQLModel, table=True):
    __tablename__ = "jobs"
    __table_args__ = (money_check("jobs", "budget_usd"),)

    job_id: str = Field(primary_key=True)
    name: str
    phase: str = "queued"
    spec_json: str
    budget_usd: float | None = None
    created_at: float
    updated_at: float
    detail: str = ""


_T = JobRow.__table__  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class JobRecord:
    job_id: str
    name: str
    phase: str
    spec: Mapping[str, Any]
    budget_usd: float | None
    created_at: float
    updated_at: float
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "name": self.name,
            "phase": self.phase,
            "budget_usd": self.budget_usd,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "detail": self.detail,
        }


def _record(row: Any) -> JobRecord:
    return JobRecord(
        row.job_id,
        row.name,
        row.phase,
        json.loads(row.spec_json),
        row.budget_usd,
        row.created_at,
        row.updated_at,
        row.detail,
    )


class JobStore:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def add(self, spec: JobSpec, *, now: float | None = None, job_id: str | None = None) -> str:
        now = time.time() if now is None else now
        jid = job_id or f"job-{time.strftime('%Y%m%d', time.gmtime(now))}-{uuid.uuid4().hex[:8]}"
        if spec.budget_usd is not None and range_problem(spec.budget_usd, minimum=0, maximum=MAX_USD) is not None:
            raise ValueError(f"job {jid}: budget_usd must be a finite amount, got {spec.budget_usd!r}")
        with write_transaction(self._engine, lock="tuneharness.jobs") as conn:
            conn.execute(
                _T.insert().values(
                    job_id=jid,
                    name=spec.name,
                    phase="queued",
                    spec_json=json.dumps(spec.to_dict()),
                    budget_usd=spec.budget_usd,
                    created_at=now,
                    updated_at=now,
                    detail="",
                )
            )
        return jid

    def get(self, job_id: str) -> JobRecord | None:
        with read_connection(self._engine) as conn:
            row = conn.execute(select(_T).where(_T.c.job_id == job_id)).first()
        return None if row is None else _record(row)

    def list(self) -> list[JobRecord]:
        with read_connection(self._engine) as conn:
            return [_record(r) for r in conn.execute(select(_T).order_by(_T.c.created_at, _T.c.job_id))]

    def set_phase(self, job_id: str, phase: str, *, detail: str = "", now: float | None = None) -> bool:
        """Move the job to `phase`; False when it did not move. A cancelled job stays cancelled: a task
        still in flight when the operator cancelled (a poll, a step) cannot bring it back; only
        `reopen` (the operator's resume) does."""
        if phase not in JOB_PHASES:
            raise ValueError(f"unknown job phase {phase!r}; known: {JOB_PHASES}")
        with write_transaction(self._engine, lock="tuneharness.jobs") as conn:
            moved = conn.execute(
                _T.update()
                .where(_T.c.job_id == job_id, _T.c.phase != "cancelled")
                .values(phase=phase, detail=detail, updated_at=time.time() if now is None else now)
            )
        return bool(moved.rowcount)

    def reopen(
        self, job_id: str, *, phase: str, detail: str, budget_usd: float | None = None, now: float | None = None
    ) -> None:
        """The operator resumes a cancelled or failed job: its phase (cancelled included) becomes
        `phase`, and its budget `budget_usd` when one is given."""
        if phase not in JOB_PHASES:
            raise ValueError(f"unknown job phase {phase!r}; known: {JOB_PHASES}")
        values: dict[str, Any] = {"phase": phase, "detail": detail, "updated_at": time.time() if now is None else now}
        if budget_usd is not None:
            if range_problem(budget_usd, minimum=0, maximum=MAX_USD) is not None:
                raise ValueError(f"job {job_id}: budget_usd must be a finite amount, got {budget_usd!r}")
            values["budget_usd"] = budget_usd
        with write_transaction(self._engine, lock="tuneharness.jobs") as conn:
            conn.execute(_T.update().where(_T.c.job_id == job_id).values(**values))

    # -- gated jobs: one training run per seed, then the evaluation ----------------------------
    def runs(self, job_id: str) -> dict[int, JobRecord | None]:
        """A gated job's training runs by seed (None: not recorded); empty for a job without a gate."""
        rec = self.get(job_id)
        if rec is None:
            return {}
        return {seed: self.get(seed_run_id(job_id, seed)) for seed in spec_from_dict(rec.spec).seeds}

    def parent_of(self, job_id: str) -> str | None:
        """The gated job a training run belongs to (None: not a seed run)."""
        rec = self.get(job_id)
        parent = None if rec is None else rec.spec.get("parent")
        return str(parent) if parent else None

    def run_finished(self, run_id: str, *, detail: str) -> str | None:
        """A training run's adapter is pulled: the run is `done`. Return its gated job when every
        run of that job is done (the job is then `evaluating`); None otherwise.

        Two runs finishing at once both see the other's `done` at worst (each writes before it
        reads), so the job is handed to evaluation at least once; evaluation is idempotent.
        """
        self.set_phase(run_id, "done", detail=detail)
        parent = self.parent_of(run_id)
        if parent is None:
            return None
        runs = self.runs(parent)
        if not runs or any(r is None or r.phase != "done" for r in runs.values()):
            return None
        job = self.get(parent)
        if job is not None and job.phase not in ("evaluating", "done", "failed", "cancelled"):
            self.set_phase(
                parent, "evaluating", detail=f"{len(runs)} seed adapters pulled: " + ", ".join(str(s) for s in runs)
            )
        return parent

    def run_failed(self, run_id: str, *, detail: str) -> None:
        """A training run failed: its gated job fails too (the gate needs every seed)."""
        parent = self.parent_of(run_id)
        job = None if parent is None else self.get(parent)
        if parent is not None and job is not None and job.phase not in ("done", "failed", "cancelled"):
            self.set_phase(parent, "failed", detail=f"seed run {run_id} failed: {detail}")

    def block(self, job_id: str, *, detail: str, now: float | None = None) -> tuple[str, ...]:
        """Mark the job `blocked` with `detail` (the reason and the fix), and a gated job's parent
        with it (the gate needs every seed); a job that ended (done, failed, cancelled) stays as it
        is. Return the ids that moved."""
        moved: tuple[str, ...] = ()
        parent = self.parent_of(job_id)
        for jid, why in ((job_id, detail), (parent, f"seed run {job_id} is blocked: {detail}")):
            rec = None if jid is None else self.get(jid)
            if jid is None or rec is None or rec.phase in ("done", "failed", "cancelled", "blocked"):
                continue
            if self.set_phase(jid, "blocked", detail=why, now=now):
                moved += (jid,)
        return moved

    def blocked(self) -> tuple[JobRecord, ...]:
        """Every job the fleet waits on the operator for."""
        return tuple(r for r in self.list() if r.phase == "blocked")

    def record_evaluation(self, ev: JobEvaluation) -> None:
        """Write down a job's trial and decision (once per job; a re-run of the same trial rewrites it)."""
        values = {
            "trial_path": ev.trial_path,
            "trial_hash": ev.trial_hash,
            "decision": ev.decision,
            "reasons_json": json.dumps(list(ev.reasons)),
            "at": ev.at,
        }
        with write_transaction(self._engine, lock="tuneharness.jobs") as conn:
            exists = conn.execute(select(_E.c.job_id).where(_E.c.job_id == ev.job_id)).first()
            if exists is None:
                conn.execute(_E.insert().values(job_id=ev.job_id, **values))
            else:
                conn.execute(_E.update().where(_E.c.job_id == ev.job_id).values(**values))

    def evaluation(self, job_id: str) -> JobEvaluation | None:
        with read_connection(self._engine) as conn:
            row = conn.execute(select(_E).where(_E.c.job_id == job_id)).first()
        if row is None:
            return None
        return JobEvaluation(
            row.job_id, row.trial_path, row.trial_hash, row.decision, tuple(json.loads(row.reasons_json)), float(row.at)
        )


class JobEvaluationRow(SQLModel, table=True):
    """A gated job's trial directory and the gate's decision on it."""

    __tablename__ = "job_evaluations"

    job_id: str = Field(primary_key=True)
    trial_path: str
    trial_hash: str
    decision: str
    reasons_json: str = "[]"
    at: float


_E = JobEvaluationRow.__table__  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class JobEvaluation:
    job_id: str
    trial_path: str
    trial_hash: str
    decision: str  # promote | refuse
    reasons: tuple[str, ...]
    at: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "trial_path": self.trial_path,
            "trial_hash": self.trial_hash,
            "decision": self.decision,
            "reasons": list(self.reasons),
            "at": self.at,
        }
