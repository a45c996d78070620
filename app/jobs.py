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
      min_reliability: 0.98       # optional (default 0.98)
      min_download_mbps: 500      # optional
      download_gb: 23             # optional: image + model pulled (ranking, reservation)
      train_hours: 0.5            # optional: expected training time (ranking, reservation)
    budget_usd: 5.00
    gate: gate.json               # optional: a gate.json path or the gate inline

Paths are relative to the job file. The trainer validates job.json fully on the host; here the
fields, their types and the shipped files are checked before anything is enqueued or spent.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, select
from sqlmodel import Field, SQLModel

from app.db import read_connection, write_transaction
from app.errors import UserError
from app.policy.ranking import JobShape, Requirements

__all__ = [
    "JOB_PHASES",
    "JobFileError",
    "JobRecord",
    "JobRow",
    "JobSpec",
    "JobStore",
    "Needs",
    "load_job_file",
    "parse_job_text",
    "spec_from_dict",
]

JOB_PHASES = ("queued", "provisioning", "training", "evaluating", "done", "failed", "cancelled")
PROVIDERS = ("vast", "runpod", "sim")

_TOP = ("name", "train", "needs", "budget_usd", "gate")
_NEEDS = ("gpu", "min_vram_gb", "max_usd_per_hour", "providers", "image", "disk_gb", "num_gpus",
          "min_reliability", "min_download_mbps", "download_gb", "train_hours")
# The trainer's job.json contract (issue 6; trainer/jobspec.py is the authority on the host).
_TRAIN_REQUIRED = ("base_model", "task", "train_file", "max_steps", "checkpoint_every", "seed",
                   "learning_rate", "batch_size", "max_seq_len", "lora", "quantization")
_TRAIN_OPTIONAL = ("eval_file", "lr_schedule", "warmup_steps", "grad_accum", "max_grad_norm",
                   "keep_checkpoints", "log_every", "status_every_s")
_TRAIN_INTS = ("max_steps", "checkpoint_every", "seed", "batch_size", "max_seq_len", "warmup_steps", "grad_accum",
               "keep_checkpoints", "log_every")
_TRAIN_CHOICES = {"task": ("causal_lm", "classification"), "lr_schedule": ("constant", "linear", "cosine"),
                  "quantization": ("nf4", "none")}
_TRAIN_PATHS = ("base_model", "train_file", "eval_file")


class JobFileError(UserError):
    """A job file that cannot run; the message names the file, line, field and the fix."""

    def __init__(self, source: str, line: int | None, field_name: str, problem: str, fix: str) -> None:
        self.source, self.line, self.field, self.problem = source, line, field_name, problem
        where = f"{source} line {line}" if line is not None else source
        super().__init__(f"{where}: {field_name}: {problem}. Fix: {fix}")


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

    def requirements(self) -> Requirements:
        """The provisioning policy's filters for this job."""
        return Requirements(
            gpu_names=self.gpu, min_gpu_ram_gb=self.min_vram_gb, num_gpus=self.num_gpus,
            min_reliability=self.min_reliability, min_inet_down_mbps=self.min_download_mbps,
            max_dph=self.max_usd_per_hour, providers=self.providers,
        )


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A validated job file."""

    name: str
    train: Mapping[str, Any]
    needs: Needs
    budget_usd: float | None = None
    gate: Mapping[str, Any] | str | None = None
    base_dir: str = "."
    source: str = "<job>"
    ship: tuple[str, ...] = field(default=())  # absolute paths to push to the host

    def shape(self) -> JobShape:
        """What one attempt at this job pulls, trains and stores (for ranking and reservations)."""
        return JobShape(download_gb=self.needs.download_gb, train_s=self.needs.train_hours * 3600.0,
                        disk_gb=self.needs.disk_gb)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "train": dict(self.train),
            "needs": {
                "gpu": list(self.needs.gpu), "min_vram_gb": self.needs.min_vram_gb,
                "max_usd_per_hour": self.needs.max_usd_per_hour, "providers": list(self.needs.providers),
                "image": self.needs.image, "disk_gb": self.needs.disk_gb, "num_gpus": self.needs.num_gpus,
                "min_reliability": self.needs.min_reliability, "min_download_mbps": self.needs.min_download_mbps,
                "download_gb": self.needs.download_gb, "train_hours": self.needs.train_hours,
            },
            "budget_usd": self.budget_usd,
            "gate": self.gate if not isinstance(self.gate, Mapping) else dict(self.gate),
            "base_dir": self.base_dir,
            "source": self.source,
            "ship": list(self.ship),
        }


# -- YAML with line numbers -------------------------------------------------------------------
def _compose(text: str, source: str) -> tuple[Any, dict[str, int]]:
    """Parse YAML into plain data plus a map from dotted field path to its line (1-based)."""
    import yaml

    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise JobFileError(source, line, "(file)", f"not valid YAML ({problem})", "correct the YAML syntax") from None
    lines: dict[str, int] = {}
    if node is None:
        return None, lines

    def walk(n: Any, path: str) -> Any:
        lines.setdefault(path, n.start_mark.line + 1)
        if isinstance(n, yaml.MappingNode):
            out: dict[str, Any] = {}
            for k, v in n.value:
                key = str(k.value) if isinstance(k, yaml.ScalarNode) else f"(key at line {k.start_mark.line + 1})"
                sub = f"{path}.{key}" if path else key
                lines[sub] = k.start_mark.line + 1
                out[key] = walk(v, sub)
            return out
        if isinstance(n, yaml.SequenceNode):
            return [walk(v, f"{path}[{i}]") for i, v in enumerate(n.value)]
        loader = yaml.SafeLoader("")
        try:
            return loader.construct_object(n, deep=True)
        finally:
            loader.dispose()

    return walk(node, ""), lines


class _Check:
    def __init__(self, source: str, lines: Mapping[str, int]) -> None:
        self.source, self.lines = source, lines

    def fail(self, path: str, problem: str, fix: str) -> JobFileError:
        line = self.lines.get(path)
        if line is None and "." in path:
            line = self.lines.get(path.rsplit(".", 1)[0])
        return JobFileError(self.source, line, path, problem, fix)

    def mapping(self, value: Any, path: str, allowed: Sequence[str]) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(path or "(file)", f"must be a mapping, got {_kind(value)}", "write `key: value` lines")
        for key in value:
            if key not in allowed:
                raise self.fail(f"{path}.{key}" if path else key, "unknown field", f"use one of {', '.join(allowed)}")
        return value

    def number(self, value: Any, path: str, *, minimum: float | None = None, integer: bool = False,
               maximum: float | None = None) -> float:
        ok = isinstance(value, int) if integer else isinstance(value, int | float)
        if isinstance(value, bool) or not ok:
            want = "a whole number" if integer else "a number"
            raise self.fail(path, f"must be {want}, got {_kind(value)} {value!r}", f"write {want}")
        if minimum is not None and value < minimum:
            raise self.fail(path, f"must be at least {minimum:g}, got {value}", f"use a value >= {minimum:g}")
        if maximum is not None and value > maximum:
            raise self.fail(path, f"must be at most {maximum:g}, got {value}", f"use a value <= {maximum:g}")
        return float(value)

    def string(self, value: Any, path: str) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.fail(path, f"must be a non-empty string, got {_kind(value)}", "write a text value")
        return value

    def strings(self, value: Any, path: str) -> tuple[str, ...]:
        if isinstance(value, str):
            return (value,)
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            raise self.fail(path, f"must be a list of names, got {_kind(value)}", "write e.g. [RTX 3090, RTX 4090]")
        return tuple(value)


def _kind(v: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "text", bool: "true/false", type(None): "nothing"}.get(
        type(v), type(v).__name__
    )


def parse_job_text(text: str, *, source: str = "<job>", base_dir: str | Path = ".", check_files: bool = True) -> JobSpec:
    """Validate a job file's text; raise JobFileError naming the line and field of the first problem."""
    data, lines = _compose(text, source)
    c = _Check(source, lines)
    top = c.mapping(data, "", _TOP)
    for key in ("name", "train", "needs"):
        if key not in top:
            raise JobFileError(source, None, key, "missing", f"add `{key}:` at the top level")
    name = c.string(top["name"], "name")
    base = Path(base_dir)

    train = c.mapping(top["train"], "train", (*_TRAIN_REQUIRED, *_TRAIN_OPTIONAL))
    for key in _TRAIN_REQUIRED:
        if key not in train:
            raise c.fail("train", f"`{key}` is missing", f"add train.{key} (the trainer's job.json field)")
    for key in _TRAIN_INTS:
        if key in train:
            c.number(train[key], f"train.{key}", minimum=0 if key in ("seed", "warmup_steps") else 1, integer=True)
    c.number(train["learning_rate"], "train.learning_rate", minimum=0)
    for key, choices in _TRAIN_CHOICES.items():
        if key in train and train[key] not in choices:
            raise c.fail(f"train.{key}", f"{train[key]!r} is not one of {', '.join(choices)}", f"use one of {', '.join(choices)}")
    lora = c.mapping(train["lora"], "train.lora", ("r", "alpha", "dropout", "target_modules"))
    for key in ("r", "alpha", "target_modules"):
        if key not in lora:
            raise c.fail("train.lora", f"`{key}` is missing", f"add train.lora.{key}")
    c.number(lora["r"], "train.lora.r", minimum=1, integer=True)
    c.number(lora["alpha"], "train.lora.alpha", minimum=0)
    if "dropout" in lora:
        c.number(lora["dropout"], "train.lora.dropout", minimum=0, maximum=1)
    c.strings(lora["target_modules"], "train.lora.target_modules")
    if int(train["checkpoint_every"]) > int(train["max_steps"]):
        raise c.fail("train.checkpoint_every", f"{train['checkpoint_every']} > max_steps {train['max_steps']}",
                     "checkpoint at most every max_steps steps")
    ship: list[str] = []
    for key in _TRAIN_PATHS:
        if key not in train:
            continue
        rel = c.string(train[key], f"train.{key}")
        p = Path(rel) if Path(rel).is_absolute() else base / rel
        if check_files and not p.exists():
            raise c.fail(f"train.{key}", f"{p} does not exist", "point it at a file or directory next to the job file")
        ship.append(str(p.resolve()) if check_files else str(p))

    raw_needs = c.mapping(top["needs"], "needs", _NEEDS)
    needs_kw: dict[str, Any] = {}
    if "gpu" in raw_needs:
        needs_kw["gpu"] = c.strings(raw_needs["gpu"], "needs.gpu")
    if "providers" in raw_needs:
        provs = c.strings(raw_needs["providers"], "needs.providers")
        for i, prov in enumerate(provs):
            if prov not in PROVIDERS:
                raise c.fail(f"needs.providers[{i}]" if f"needs.providers[{i}]" in lines else "needs.providers",
                             f"unknown provider {prov!r}", f"use {', '.join(PROVIDERS)}")
        needs_kw["providers"] = provs
    for key, kw in (("min_vram_gb", {"minimum": 0}), ("max_usd_per_hour", {"minimum": 0}), ("disk_gb", {"minimum": 1}),
                    ("min_reliability", {"minimum": 0, "maximum": 1}), ("min_download_mbps", {"minimum": 0}),
                    ("download_gb", {"minimum": 0}), ("train_hours", {"minimum": 0})):
        if key in raw_needs:
            needs_kw[key] = c.number(raw_needs[key], f"needs.{key}", **kw)  # type: ignore[arg-type]
    if "num_gpus" in raw_needs:
        needs_kw["num_gpus"] = int(c.number(raw_needs["num_gpus"], "needs.num_gpus", minimum=1, integer=True))
    if "image" in raw_needs:
        needs_kw["image"] = c.string(raw_needs["image"], "needs.image")

    budget = None
    if top.get("budget_usd") is not None:
        budget = c.number(top["budget_usd"], "budget_usd", minimum=0)
    gate = top.get("gate")
    if gate is not None:
        if isinstance(gate, str):
            gp = Path(gate) if Path(gate).is_absolute() else base / gate
            if check_files and not gp.is_file():
                raise c.fail("gate", f"{gp} does not exist", "point it at a gate.json file, or write the gate inline")
            gate = str(gp.resolve()) if check_files else str(gp)
        elif not isinstance(gate, dict):
            raise c.fail("gate", f"must be a path or a mapping, got {_kind(gate)}", "write gate: gate.json")

    return JobSpec(name=name, train=train, needs=Needs(**needs_kw), budget_usd=budget, gate=gate,
                   base_dir=str(base.resolve()), source=source, ship=tuple(ship))


def spec_from_dict(d: Mapping[str, Any]) -> JobSpec:
    """The JobSpec `JobSpec.to_dict` stored (already validated at submit)."""
    n = dict(d["needs"])
    needs = Needs(**{**n, "gpu": tuple(n.get("gpu", ())), "providers": tuple(n.get("providers", ()))})
    return JobSpec(name=d["name"], train=d["train"], needs=needs, budget_usd=d.get("budget_usd"), gate=d.get("gate"),
                   base_dir=d.get("base_dir", "."), source=d.get("source", "<job>"), ship=tuple(d.get("ship", ())))


def load_job_file(path: str | Path) -> JobSpec:
    """Read and validate a job file; paths inside it are relative to its directory."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise JobFileError(str(p), None, "(file)", f"cannot be read ({exc.strerror})", "pass an existing job file") from None
    return parse_job_text(text, source=str(p), base_dir=p.parent)


# -- the job table ----------------------------------------------------------------------------
class JobRow(SQLModel, table=True):
    __tablename__ = "jobs"

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
        return {"job_id": self.job_id, "name": self.name, "phase": self.phase, "budget_usd": self.budget_usd,
                "created_at": self.created_at, "updated_at": self.updated_at, "detail": self.detail}


def _record(row: Any) -> JobRecord:
    return JobRecord(row.job_id, row.name, row.phase, json.loads(row.spec_json), row.budget_usd, row.created_at,
                     row.updated_at, row.detail)


class JobStore:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def add(self, spec: JobSpec, *, now: float | None = None, job_id: str | None = None) -> str:
        now = time.time() if now is None else now
        jid = job_id or f"job-{time.strftime('%Y%m%d', time.gmtime(now))}-{uuid.uuid4().hex[:8]}"
        with write_transaction(self._engine, lock="tuneharness.jobs") as conn:
            conn.execute(_T.insert().values(job_id=jid, name=spec.name, phase="queued", spec_json=json.dumps(spec.to_dict()),
                                            budget_usd=spec.budget_usd, created_at=now, updated_at=now, detail=""))
        return jid

    def get(self, job_id: str) -> JobRecord | None:
        with read_connection(self._engine) as conn:
            row = conn.execute(select(_T).where(_T.c.job_id == job_id)).first()
        return None if row is None else _record(row)

    def list(self) -> list[JobRecord]:
        with read_connection(self._engine) as conn:
            return [_record(r) for r in conn.execute(select(_T).order_by(_T.c.created_at, _T.c.job_id))]

    def set_phase(self, job_id: str, phase: str, *, detail: str = "", now: float | None = None) -> None:
        if phase not in JOB_PHASES:
            raise ValueError(f"unknown job phase {phase!r}; known: {JOB_PHASES}")
        with write_transaction(self._engine, lock="tuneharness.jobs") as conn:
            conn.execute(_T.update().where(_T.c.job_id == job_id).values(
                phase=phase, detail=detail, updated_at=time.time() if now is None else now))
