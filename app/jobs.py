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
checked before anything is enqueued or spent.
"""

from __future__ import annotations

import json
import os
import re
import stat
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, select
from sqlmodel import Field, SQLModel

from app.db import money_check, read_connection, write_transaction
from app.errors import UserError
from app.numbers import MAX_COUNT, MAX_HOURS, MAX_USD, MAX_USD_PER_HOUR, range_problem
from app.policy.ranking import JobShape, Requirements
from app.safetext import printable

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
    "kill_after_hours",
    "datacenter_only",
    "expected_tflops",
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
_GATE_CONFIG = (
    "metric",
    "min_margin",
    "ood",
    "critical_labels",
    "max_missed",
    "model",
    "task",
    "baseline_name",
    "min_canaries",
)
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
        # finite and in range: NaN passes every comparison and .inf every lower bound
        if maximum is None and integer:
            maximum = MAX_COUNT
        problem = range_problem(value, minimum=minimum, maximum=maximum, integer=integer)
        if problem is not None:
            raise self.fail(path, *problem)
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


_HUB_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_HUB_REVISION = re.compile(r"^[0-9a-f]{40}$")


def _hub_model(c: _Check, value: Mapping[str, Any]) -> None:
    """`train.base_model: {hf: ORG/NAME, revision: <40-hex commit>}`: a public Hugging Face model."""
    hub = c.mapping(value, "train.base_model", ("hf", "revision"))
    for key in ("hf", "revision"):
        if key not in hub:
            raise c.fail(
                "train.base_model", f"`{key}` is missing", "write base_model: {hf: ORG/NAME, revision: <40-hex commit>}"
            )
    repo = c.string(hub["hf"], "train.base_model.hf")
    if not _HUB_REPO.match(repo):
        raise c.fail("train.base_model.hf", f"{repo!r} is not ORG/NAME", "use the model's id as the hub shows it")
    revision = c.string(hub["revision"], "train.base_model.revision")
    if not _HUB_REVISION.match(revision):
        raise c.fail(
            "train.base_model.revision",
            f"{revision!r} is not a 40-hex commit",
            "pin the commit the hub shows for the model (a branch or tag can change under a running job)",
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
    c.number(train["learning_rate"], "train.learning_rate", minimum=0, maximum=1)
    if "max_grad_norm" in train:
        c.number(train["max_grad_norm"], "train.max_grad_norm", minimum=0, maximum=MAX_COUNT)
    if "status_every_s" in train:
        c.number(train["status_every_s"], "train.status_every_s", minimum=0.1, maximum=10)
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
    c.number(lora["alpha"], "train.lora.alpha", minimum=0, maximum=MAX_COUNT)
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
        if key == "base_model" and isinstance(train[key], Mapping):
            _hub_model(c, train[key])  # a public model the host fetches itself: nothing shipped
            continue
        rel = c.string(train[key], f"train.{key}")
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
        ("min_vram_gb", {"minimum": 0, "maximum": 10_000}),
        ("max_usd_per_hour", {"minimum": 0, "maximum": MAX_USD_PER_HOUR}),
        ("disk_gb", {"minimum": 1, "maximum": 100_000}),
        ("min_reliability", {"minimum": 0, "maximum": 1}),
        ("min_download_mbps", {"minimum": 0, "maximum": 1_000_000}),
        ("download_gb", {"minimum": 0, "maximum": 100_000}),
        ("train_hours", {"minimum": 0, "maximum": MAX_HOURS}),
        ("expected_tflops", {"minimum": 0.001, "maximum": 100_000}),
    ):
        if key in raw_needs:
            needs_kw[key] = c.number(raw_needs[key], f"needs.{key}", **kw)
    if "num_gpus" in raw_needs:
        needs_kw["num_gpus"] = int(c.number(raw_needs["num_gpus"], "needs.num_gpus", minimum=1, integer=True))
    if "image" in raw_needs:
        needs_kw["image"] = c.string(raw_needs["image"], "needs.image")
    needs_kw["min_reliability_hard"] = "min_reliability" in raw_needs
    if "datacenter_only" in raw_needs:
        if not isinstance(raw_needs["datacenter_only"], bool):
            raise c.fail(
                "needs.datacenter_only",
                f"{raw_needs['datacenter_only']!r} is not true or false",
                "write datacenter_only: true (or leave it out)",
            )
        needs_kw["datacenter_only"] = raw_needs["datacenter_only"]
    if "kill_after_hours" in raw_needs:
        needs_kw["kill_after_hours"] = _kill_after_hours(c, raw_needs["kill_after_hours"], needs_kw)
    if "standby_hosts" in raw_needs:
        needs_kw["standby_hosts"] = int(
            c.number(
                raw_needs["standby_hosts"], "needs.standby_hosts", minimum=0, maximum=MAX_STANDBY_HOSTS, integer=True
            )
        )

    budget = None
    if top.get("budget_usd") is not None:
        budget = c.number(top["budget_usd"], "budget_usd", minimum=0, maximum=MAX_USD)
    gate = None
    if top.get("gate") is not None:
        tf = train.get("train_file")
        train_file = _contained(c, tf, "train.train_file", base) if isinstance(tf, str) else None
        gate = _gate_section(c, top["gate"], base, check_files=check_files, train_file=train_file)

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


# A rental's kill-time is a backstop against a host billing forever: a week at most.
MAX_KILL_AFTER_HOURS = 168.0


def _kill_after_hours(c: _Check, value: Any, needs_kw: Mapping[str, Any]) -> float:
    """needs.kill_after_hours: a finite number of hours in (0, MAX_KILL_AFTER_HOURS], and no less
    than the training it must cover (a shorter one stops every host before the job can finish)."""
    hours = c.number(value, "needs.kill_after_hours", minimum=0, maximum=MAX_KILL_AFTER_HOURS)
    if hours <= 0:
        raise c.fail("needs.kill_after_hours", "must be more than 0 hours", "write e.g. kill_after_hours: 3")
    train_hours = float(needs_kw.get("train_hours", Needs().train_hours))
    if hours < train_hours:
        raise c.fail(
            "needs.kill_after_hours",
            f"{hours:g} h is shorter than train_hours {train_hours:g} h: the reaper would stop every host first",
            f"give at least {train_hours:g} h plus the pull, or leave it out (derived from train_hours)",
        )
    return hours


def _path(c: _Check, value: Any, path: str, base: Path, *, check_files: bool, what: str) -> str:
    rel = c.string(value, path)
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
    c: _Check, rows: list[tuple[str, str, str]], cfg: Any, train_file: Path | None, where: str
) -> None:
    """The gate's integrity checks, at submit rather than after hours of training: enough canaries
    (gate.json's `min_canaries`, DEFAULT_MIN_CANARIES unless it says lower on purpose), and no eval
    row whose input is also in the training data (by content hash, `app.evalrows`)."""
    from app.evalrows import leak_message, leaked_rows, training_hashes
    from app.policy.gate_rules import DEFAULT_MIN_CANARIES

    wanted = DEFAULT_MIN_CANARIES
    if isinstance(cfg, dict) and "min_canaries" in cfg:
        wanted = int(c.number(cfg["min_canaries"], "gate.config.min_canaries", minimum=0, integer=True))
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
    c: _Check, raw: Any, base: Path, *, check_files: bool, train_file: Path | None = None
) -> dict[str, Any]:
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
    rows: list[tuple[str, str, str]] = []
    for i, e in enumerate(evals):
        where = f"gate.eval[{i}]" if isinstance(g["eval"], list) and f"gate.eval[{i}]" in c.lines else "gate.eval"
        p = _path(c, e, where, base, check_files=check_files, what="a JSONL eval file")
        if check_files:
            rows += _check_eval_rows(c, Path(p), where)
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
    if check_files:
        _check_eval_integrity(c, rows, cfg, train_file, "gate.eval")
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
