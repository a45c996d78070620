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
      standby_hosts: 1            # optional (default 0): verified hosts kept waiting for this job's recoveries
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
    "DEFAULT_GATE_SEEDS",
    "JOB_PHASES",
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

JOB_PHASES = ("queued", "provisioning", "training", "evaluating", "done", "failed", "cancelled")
PROVIDERS = ("vast", "runpod", "sim")

_TOP = ("name", "train", "needs", "budget_usd", "gate")
_NEEDS = (
    "gpu",
    "min_vram_gb",
    "max_usd_per_hour",
    "providers",
    "image",
    "disk_gb",
    "num_gpus",
    "min_reliability",
    "min_download_mbps",
    "download_gb",
    "train_hours",
    "standby_hosts",
)
# Warm standby hosts per job: each one bills its GPU while it waits, so keep the number small.
MAX_STANDBY_HOSTS = 4
# The trainer's job.json contract (trainer/jobspec.py is the authority on the host).
_TRAIN_REQUIRED = (
    "base_model",
    "task",
    "train_file",
    "max_steps",
    "checkpoint_every",
    "seed",
    "learning_rate",
    "batch_size",
    "max_seq_len",
    "lora",
    "quantization",
)
_TRAIN_OPTIONAL = (
    "eval_file",
    "lr_schedule",
    "warmup_steps",
    "grad_accum",
    "max_grad_norm",
    "keep_checkpoints",
    "log_every",
    "status_every_s",
    "deterministic",
)
_TRAIN_INTS = (
    "max_steps",
    "checkpoint_every",
    "seed",
    "batch_size",
    "max_seq_len",
    "warmup_steps",
    "grad_accum",
    "keep_checkpoints",
    "log_every",
)
_TRAIN_CHOICES = {
    "task": ("causal_lm", "classification"),
    "lr_schedule": ("constant", "linear", "cosine"),
    "quantization": ("nf4", "none"),
}
_TRAIN_PATHS = ("base_model", "train_file", "eval_file")
_GATE = ("config", "eval", "baseline", "incumbent", "seeds", "timeout_s")
# gate.json's keys (gate/trial.py is the authority; checked here so a typo fails at submit)
_GATE_CONFIG = ("metric", "min_margin", "ood", "critical_labels", "max_missed", "model", "task", "baseline_name")
_METRICS = ("accuracy", "macro_f1")
DEFAULT_GATE_SEEDS = (1, 2)
DEFAULT_GATE_TIMEOUT_S = 400.0
# the evaluate queue's soft limit is 1800 s: every predictor's timeout together must fit under it
MAX_GATE_TIMEOUT_S = 1700.0


def seed_run_id(job_id: str, seed: int) -> str:
    """The id of a gated job's training run for `seed`."""
    return f"{job_id}-seed-{seed}"


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
    standby_hosts: int = 0  # verified hosts kept waiting (and billing) for this job's recoveries

    def requirements(self) -> Requirements:
        """The provisioning policy's filters for this job."""
        return Requirements(
            gpu_names=self.gpu,
            min_gpu_ram_gb=self.min_vram_gb,
            num_gpus=self.num_gpus,
            min_reliability=self.min_reliability,
            min_inet_down_mbps=self.min_download_mbps,
            max_dph=self.max_usd_per_hour,
            providers=self.providers,
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
            download_gb=self.needs.download_gb, train_s=self.needs.train_hours * 3600.0, disk_gb=self.needs.disk_gb
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
            },
            "budget_usd": self.budget_usd,
            "gate": None if self.gate is None else dict(self.gate),
            "base_dir": self.base_dir,
            "source": self.source,
            "ship": list(self.ship),
            "parent": self.parent,
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

    def number(
        self,
        value: Any,
        path: str,
        *,
        minimum: float | None = None,
        integer: bool = False,
        maximum: float | None = None,
    ) -> float:
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


def parse_job_text(
    text: str, *, source: str = "<job>", base_dir: str | Path = ".", check_files: bool = True
) -> JobSpec:
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
    if "deterministic" in train and not isinstance(train["deterministic"], bool):
        raise c.fail(
            "train.deterministic",
            f"{train['deterministic']!r} is not true or false",
            "write `deterministic: true` (bit-identical resumes on a GPU, slower) or leave it out",
        )
    for key, choices in _TRAIN_CHOICES.items():
        if key in train and train[key] not in choices:
            raise c.fail(
                f"train.{key}", f"{train[key]!r} is not one of {', '.join(choices)}", f"use one of {', '.join(choices)}"
            )
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
        raise c.fail(
            "train.checkpoint_every",
            f"{train['checkpoint_every']} > max_steps {train['max_steps']}",
            "checkpoint at most every max_steps steps",
        )
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
                raise c.fail(
                    f"needs.providers[{i}]" if f"needs.providers[{i}]" in lines else "needs.providers",
                    f"unknown provider {prov!r}",
                    f"use {', '.join(PROVIDERS)}",
                )
        needs_kw["providers"] = provs
    for key, kw in (
        ("min_vram_gb", {"minimum": 0}),
        ("max_usd_per_hour", {"minimum": 0}),
        ("disk_gb", {"minimum": 1}),
        ("min_reliability", {"minimum": 0, "maximum": 1}),
        ("min_download_mbps", {"minimum": 0}),
        ("download_gb", {"minimum": 0}),
        ("train_hours", {"minimum": 0}),
    ):
        if key in raw_needs:
            needs_kw[key] = c.number(raw_needs[key], f"needs.{key}", **kw)  # type: ignore[arg-type]
    if "num_gpus" in raw_needs:
        needs_kw["num_gpus"] = int(c.number(raw_needs["num_gpus"], "needs.num_gpus", minimum=1, integer=True))
    if "image" in raw_needs:
        needs_kw["image"] = c.string(raw_needs["image"], "needs.image")
    if "standby_hosts" in raw_needs:
        needs_kw["standby_hosts"] = int(
            c.number(
                raw_needs["standby_hosts"], "needs.standby_hosts", minimum=0, maximum=MAX_STANDBY_HOSTS, integer=True
            )
        )

    budget = None
    if top.get("budget_usd") is not None:
        budget = c.number(top["budget_usd"], "budget_usd", minimum=0)
    gate = None
    if top.get("gate") is not None:
        gate = _gate_section(c, top["gate"], base, check_files=check_files)

    return JobSpec(
        name=name,
        train=train,
        needs=Needs(**needs_kw),
        budget_usd=budget,
        gate=gate,
        base_dir=str(base.resolve()),
        source=source,
        ship=tuple(ship),
    )


def _path(c: _Check, value: Any, path: str, base: Path, *, check_files: bool, what: str) -> str:
    rel = c.string(value, path)
    p = Path(rel) if Path(rel).is_absolute() else base / rel
    if check_files and not p.exists():
        raise c.fail(path, f"{p} does not exist", f"point it at {what} (paths are relative to the job file)")
    return str(p.resolve()) if check_files else str(p)


def _predictor(c: _Check, value: Any, path: str, base: Path, *, check_files: bool) -> str:
    text = c.string(value, path)
    kind, sep, rest = text.partition(":")
    if not sep or kind not in ("predictions", "command", "adapter") or not rest.strip():
        raise c.fail(
            path, f"{text!r} is not a predictor", "write predictions:FILE or command:CMD (incumbent: also adapter:DIR)"
        )
    if kind == "adapter" and path == "gate.baseline":
        raise c.fail(path, "the baseline is not an adapter", "write predictions:FILE or command:CMD")
    if kind == "command":
        return text
    return f"{kind}:{_path(c, rest, path, base, check_files=check_files, what='a file or directory')}"


def _check_eval_rows(c: _Check, file: Path, path: str) -> None:
    """Eval rows: {"id", "slice", "expected", "text" | "prompt"}; the first bad line is named."""
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise c.fail(path, f"{file} cannot be read ({exc})", "point it at a UTF-8 JSONL file") from None
    rows = 0
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
        rows += 1
    if rows == 0:
        raise c.fail(path, f"{file} holds no rows", "add held-out rows to evaluate on")


def _gate_section(c: _Check, raw: Any, base: Path, *, check_files: bool) -> dict[str, Any]:
    """The job's gate, normalised: paths absolute, seeds a list, the defaults filled in."""
    if not isinstance(raw, dict):
        raise c.fail(
            "gate",
            f"must be a mapping, got {_kind(raw)}",
            "write gate: {config: gate.json, eval: eval.jsonl, baseline: predictions:FILE}",
        )
    g = c.mapping(raw, "gate", _GATE)
    for key in ("config", "eval", "baseline"):
        if key not in g:
            raise c.fail("gate", f"`{key}` is missing", f"add gate.{key} (docs/gate.md: From job to gate)")
    out: dict[str, Any] = {}
    cfg = g["config"]
    if isinstance(cfg, dict):
        c.mapping(cfg, "gate.config", _GATE_CONFIG)
        if "metric" not in cfg:
            raise c.fail("gate.config", "`metric` is missing", f"add gate.config.metric: one of {', '.join(_METRICS)}")
        out["config"] = dict(cfg)
    else:
        cfg_path = _path(c, cfg, "gate.config", base, check_files=check_files, what="a gate.json file")
        if check_files:
            try:
                loaded = json.loads(Path(cfg_path).read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise c.fail("gate.config", f"{cfg_path} is not readable JSON ({exc})", "fix gate.json") from None
            if not isinstance(loaded, dict):
                raise c.fail("gate.config", f"{cfg_path} is not a JSON object", 'write gate.json as {"metric": ...}')
            cfg = loaded
            unknown = sorted(set(cfg) - set(_GATE_CONFIG))
            if unknown:
                raise c.fail(
                    "gate.config", f"{cfg_path}: unknown key(s) {', '.join(unknown)}", f"use {', '.join(_GATE_CONFIG)}"
                )
        out["config"] = cfg_path
    if isinstance(cfg, dict) and cfg.get("metric") not in _METRICS:
        raise c.fail(
            "gate.config" + (".metric" if isinstance(g["config"], dict) else ""),
            f"metric {cfg.get('metric')!r} is not one of {', '.join(_METRICS)}",
            f"use {' or '.join(_METRICS)}",
        )
    evals = g["eval"] if isinstance(g["eval"], list) else [g["eval"]]
    if not evals:
        raise c.fail("gate.eval", "no eval file", "name at least one JSONL eval file")
    out["eval"] = []
    for i, e in enumerate(evals):
        where = f"gate.eval[{i}]" if isinstance(g["eval"], list) and f"gate.eval[{i}]" in c.lines else "gate.eval"
        p = _path(c, e, where, base, check_files=check_files, what="a JSONL eval file")
        if check_files:
            _check_eval_rows(c, Path(p), where)
        out["eval"].append(p)
    out["baseline"] = _predictor(c, g["baseline"], "gate.baseline", base, check_files=check_files)
    if g.get("incumbent") is not None:
        out["incumbent"] = _predictor(c, g["incumbent"], "gate.incumbent", base, check_files=check_files)
    seeds = g.get("seeds", list(DEFAULT_GATE_SEEDS))
    if not isinstance(seeds, list):
        raise c.fail("gate.seeds", f"must be a list of whole numbers, got {_kind(seeds)}", "write seeds: [1, 2]")
    for i, s in enumerate(seeds):
        c.number(s, f"gate.seeds[{i}]" if f"gate.seeds[{i}]" in c.lines else "gate.seeds", minimum=0, integer=True)
    if len(seeds) < 2:
        raise c.fail(
            "gate.seeds",
            f"{len(seeds)} seed(s); the gate judges the worst of at least two",
            "give two or more seeds, e.g. [1, 2]",
        )
    if len(set(seeds)) != len(seeds):
        raise c.fail("gate.seeds", f"{seeds} repeats a seed", "give distinct seeds")
    out["seeds"] = [int(s) for s in seeds]
    out["timeout_s"] = DEFAULT_GATE_TIMEOUT_S
    if "timeout_s" in g:
        out["timeout_s"] = c.number(g["timeout_s"], "gate.timeout_s", minimum=1, maximum=MAX_GATE_TIMEOUT_S)
    return out


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
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise JobFileError(
            str(p), None, "(file)", f"cannot be read ({exc.strerror})", "pass an existing job file"
        ) from None
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

    def set_phase(self, job_id: str, phase: str, *, detail: str = "", now: float | None = None) -> None:
        if phase not in JOB_PHASES:
            raise ValueError(f"unknown job phase {phase!r}; known: {JOB_PHASES}")
        with write_transaction(self._engine, lock="tuneharness.jobs") as conn:
            conn.execute(
                _T.update()
                .where(_T.c.job_id == job_id)
                .values(phase=phase, detail=detail, updated_at=time.time() if now is None else now)
            )

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
