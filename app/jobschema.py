"""The job file's shape as pydantic models: types, ranges, choices, required and unknown keys.

The models are the one description of a job file. `app.jobs` validates a file's data with them
(then checks what needs the file system: paths, shipped files, eval rows), `tuneharness schema job`
prints their JSON Schema, and `docs/job.schema.json` is that schema checked in, so an editor
completes and checks a job file as it is typed.

Each field carries its documentation (`description`, what an editor shows on hover) and, where the
generic wording would not help, a `Hint`: the fix a refusal names, or the problem's wording for one
kind of mistake. `first_problem` turns pydantic's `ValidationError` into one (field path, problem,
fix) the loader prints as one line with the file's line number.

`train` is a union discriminated by `train_kind`: the built-in trainer's job.json (`BuiltinTrain`,
`kind: qlora`, the default) or the user's own training (`app.trainspec.CommandTrain`, `kind:
command`). Another kind is another model with its own `kind` literal, tagged into that union.
"""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal, NamedTuple, Union

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import PydanticCustomError

from app.numbers import MAX_COUNT, MAX_HOURS, MAX_USD, MAX_USD_PER_HOUR, range_problem
from app.trainspec import CommandTrain

__all__ = [
    "DEFAULT_GATE_SEEDS",
    "GATE_METRICS",
    "MAX_GATE_TIMEOUT_S",
    "MAX_KILL_AFTER_HOURS",
    "MAX_STANDBY_HOSTS",
    "PROVIDERS",
    "BuiltinTrain",
    "GateConfig",
    "GateSection",
    "Hint",
    "HubModel",
    "JobFile",
    "Lora",
    "NeedsSection",
    "Problem",
    "first_problem",
    "job_schema",
    "kind_of",
    "train_kind",
]

PROVIDERS = ("vast", "runpod", "sim")
GATE_METRICS = ("accuracy", "macro_f1")
DEFAULT_GATE_SEEDS = (1, 2)
# Warm standby hosts per job: each one bills its GPU while it waits, so keep the number small.
MAX_STANDBY_HOSTS = 4
# A rental's kill-time is a backstop against a host billing forever: a week at most.
MAX_KILL_AFTER_HOURS = 168.0
# the evaluate queue's soft limit is 1800 s: every predictor's timeout together must fit under it
MAX_GATE_TIMEOUT_S = 1700.0


@dataclass(frozen=True, slots=True, eq=False)  # hashed by identity: typing hashes Annotated metadata
class Hint:
    """How a refusal of this field reads: `fix` (what to write instead) and `problems`, the
    problem's wording per pydantic error type, with `{input!r}`, `{kind}`, `{choices}` and the
    error's context (`{actual_length}`) filled in."""

    fix: str = ""
    problems: Mapping[str, str] = field(default_factory=dict)


def _rule(problem: str, fix: str, *, field_name: str = "") -> PydanticCustomError:
    """A refusal a validator raises: the problem and fix as written, at `field_name` under the
    model (or at the field the validator checks)."""
    return PydanticCustomError("job_rule", "{problem}", {"problem": problem, "fix": fix, "field": field_name})


def _one_or_many(value: Any) -> Any:
    """`gpu: RTX 3090` is the list `[RTX 3090]`."""
    return [value] if isinstance(value, str) else value


# -- the value types ---------------------------------------------------------------------------
Text = Annotated[str, Field(pattern=r"\S")]  # non-empty, not only blanks
PathText = Annotated[str, Field(pattern=r"\S", description="A path relative to the job file (or absolute).")]
_NAMES_FIX = "write e.g. [RTX 3090, RTX 4090]"
Names = Annotated[
    list[Text],
    BeforeValidator(_one_or_many, json_schema_input_type=Text | list[Text]),
    Hint(fix=_NAMES_FIX, problems={"*": "must be a list of names, got {kind}"}),
]
Count = Annotated[int, Field(ge=1, le=MAX_COUNT)]
Whole = Annotated[int, Field(ge=0, le=MAX_COUNT)]


class _Section(BaseModel):
    """A mapping of a job file: unknown keys refused, types strict (`"8"` is not 8, `true` is not 1)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    # keys whose explicit `null` means "unset"; every other key must hold a value when written
    nullable: ClassVar[frozenset[str]] = frozenset()
    # the fix for a missing required key ({key}: its name)
    missing_fix: ClassVar[str] = "add {key}"
    # the fix when the section is not a mapping
    mapping_fix: ClassVar[str] = "write `key: value` lines"

    @model_validator(mode="before")
    @classmethod
    def _no_null(cls, data: Any) -> Any:
        """`key:` with nothing after it is a mistake, not "the default" (except where it says so)."""
        if isinstance(data, dict):
            for key, value in data.items():
                if value is None and key in cls.model_fields and key not in cls.nullable:
                    raise PydanticCustomError("job_null", "null", {"field": key})
        return data


# -- train: the built-in trainer's job.json ------------------------------------------------------
class HubModel(_Section):
    """A public Hugging Face model the host fetches itself, pinned to a commit."""

    missing_fix = "write base_model: {{hf: ORG/NAME, revision: <40-hex commit>}}"

    hf: Annotated[
        str,
        Field(
            pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$",
            description="The model's id as the hub shows it: ORG/NAME.",
        ),
        Hint(
            fix="use the model's id as the hub shows it",
            problems={"string_pattern_mismatch": "{input!r} is not ORG/NAME"},
        ),
    ]
    revision: Annotated[
        str,
        Field(pattern=r"^[0-9a-f]{40}$", description="The 40-hex commit the hub shows for the model."),
        Hint(
            fix="pin the commit the hub shows for the model (a branch or tag can change under a running job)",
            problems={"string_pattern_mismatch": "{input!r} is not a 40-hex commit"},
        ),
    ]


def _base_model_kind(value: Any) -> str:
    return "hub" if isinstance(value, dict) else "path"


class Lora(_Section):
    """The LoRA adapter: rank, scale and the modules it wraps."""

    missing_fix = "add train.lora.{key}"

    r: Count = Field(description="LoRA rank.")
    alpha: float = Field(ge=0, le=MAX_COUNT, allow_inf_nan=False, description="LoRA scale (alpha).")
    dropout: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] | SkipJsonSchema[None] = Field(
        default=None, description="LoRA dropout in [0, 1] (default 0)."
    )
    target_modules: Names = Field(
        description="Module names to wrap: q_proj/v_proj for Qwen2/Llama, query/value for BERT/MiniLM."
    )


class BuiltinTrain(_Section):
    """The built-in trainer's job.json (QLoRA micro-runs; docs/trainer.md). Its base model and data
    are shipped to the host."""

    missing_fix = "add train.{key} (the trainer's job.json field)"

    kind: Literal["qlora"] = Field(
        default="qlora", description="The built-in QLoRA trainer: the default, so it need not be written."
    )
    base_model: Annotated[
        Annotated[PathText, Tag("path")] | Annotated[HubModel, Tag("hub")],
        Discriminator(_base_model_kind),
    ] = Field(
        description=(
            "A model directory next to the job file (shipped to the host), or a public hub model "
            "{hf: ORG/NAME, revision: <40-hex commit>} the host fetches itself. A tiny random model to "
            "try things: python -m trainer make-tiny-model DIR."
        )
    )
    task: Literal["causal_lm", "classification"] = Field(description="What the adapter learns.")
    train_file: PathText = Field(description="Training rows, JSONL (docs/trainer.md: data rows).")
    max_steps: Count = Field(description="Optimizer steps of the whole run.")
    checkpoint_every: Count = Field(description="Steps between checkpoints; at most max_steps.")
    seed: Whole = Field(description="Fixes adapter init, dropout and the data order (a gate trains one run per seed).")
    learning_rate: float = Field(ge=0, le=1, allow_inf_nan=False, description="Peak learning rate (AdamW).")
    batch_size: Count = Field(description="Rows per micro-batch.")
    max_seq_len: Count = Field(description="Tokens per row (prompt cut from the left, completion from the right).")
    lora: Lora = Field(description="The LoRA adapter: {r: 8, alpha: 16, target_modules: [q_proj, v_proj]}.")
    quantization: Literal["nf4", "none"] = Field(
        description="nf4: base weights in 4-bit NF4 (bitsandbytes); none: full precision."
    )
    eval_file: PathText | SkipJsonSchema[None] = Field(
        default=None, description="Evaluated once at the end (loss; accuracy for classification)."
    )
    lr_schedule: Literal["constant", "linear", "cosine"] | SkipJsonSchema[None] = Field(
        default=None, description="Decay after warm-up, to 0 at max_steps (default constant)."
    )
    warmup_steps: Whole | SkipJsonSchema[None] = Field(default=None, description="Linear warm-up steps (default 0).")
    grad_accum: Count | SkipJsonSchema[None] = Field(
        default=None, description="Micro-batches per optimizer step (default 1)."
    )
    max_grad_norm: Annotated[float, Field(ge=0, le=MAX_COUNT, allow_inf_nan=False)] | SkipJsonSchema[None] = Field(
        default=None, description="Gradient clipping (default 1.0)."
    )
    keep_checkpoints: Count | SkipJsonSchema[None] = Field(
        default=None, description="Complete checkpoints kept on the host (default 3)."
    )
    log_every: Count | SkipJsonSchema[None] = Field(
        default=None, description="Steps between `step` lines in train.log (default 1)."
    )
    status_every_s: Annotated[float, Field(ge=0.1, le=10, allow_inf_nan=False)] | SkipJsonSchema[None] = Field(
        default=None, description="Heartbeat period of status.json (default 5)."
    )
    deterministic: Annotated[
        bool,
        Hint(fix="write `deterministic: true` (bit-identical resumes on a GPU, slower) or leave it out"),
    ] = Field(
        default=False,
        description="Bit-identical resumes on a GPU (torch's deterministic algorithms), about 13% slower.",
    )
    weight_decay: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] | SkipJsonSchema[None] = Field(
        default=None, description="AdamW weight decay of the adapter's parameters (0-1, default 0)."
    )
    val_fraction: Annotated[float, Field(ge=0, le=0.5, allow_inf_nan=False)] | SkipJsonSchema[None] = Field(
        default=None, description="Share of train_file held out for validation, never trained on (0-0.5, default 0)."
    )
    val_seed: Whole | SkipJsonSchema[None] = Field(
        default=None, description="Seed of the validation split (default 0)."
    )
    time_box_s: Annotated[float, Field(ge=1, le=MAX_HOURS * 3600, allow_inf_nan=False)] | SkipJsonSchema[None] = Field(
        default=None, description="Wall-clock seconds the training may take in all (unset: no time box)."
    )

    @model_validator(mode="after")
    def _checkpoint_within_run(self) -> BuiltinTrain:
        if self.checkpoint_every > self.max_steps:
            raise _rule(
                f"{self.checkpoint_every} > max_steps {self.max_steps}",
                "checkpoint at most every max_steps steps",
                field_name="checkpoint_every",
            )
        return self


def train_kind(value: Any) -> str:
    """The kind of a `train:` section (the built-in trainer unless it says otherwise)."""
    kind = value.get("kind", "qlora") if isinstance(value, dict) else "qlora"
    return kind if isinstance(kind, str) else "qlora"


# -- needs: what a host must offer -----------------------------------------------------------
_Provider = Annotated[
    Literal["vast", "runpod", "sim"],
    Hint(fix=f"use {', '.join(PROVIDERS)}", problems={"literal_error": "unknown provider {input!r}"}),
]


class NeedsSection(_Section):
    """What a host must offer, and how the job ranks and bounds its rentals."""

    gpu: Names = Field(
        default_factory=list, description="GPU models, any vendor spelling: [RTX 3090, RTX 4090]. Unset: any GPU."
    )
    min_vram_gb: Annotated[float, Field(ge=0, le=10_000, allow_inf_nan=False)] | SkipJsonSchema[None] = Field(
        default=None, description="Least GPU memory, GB."
    )
    max_usd_per_hour: Annotated[float, Field(ge=0, le=MAX_USD_PER_HOUR, allow_inf_nan=False)] | SkipJsonSchema[None] = (
        Field(
            default=None,
            description="Most a host may cost per hour, all-in (GPU + storage), dollars.",
        )
    )
    providers: Annotated[
        list[_Provider],
        BeforeValidator(_one_or_many, json_schema_input_type=_Provider | list[_Provider]),
        Hint(fix=_NAMES_FIX, problems={"*": "must be a list of names, got {kind}"}),
    ] = Field(
        default_factory=list,
        description=(
            "Marketplaces to rent from: sim (the simulated marketplace), vast, runpod. Unset: the configured ones."
        ),
    )
    image: Text | SkipJsonSchema[None] = Field(
        default=None, description="The container image (default pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime)."
    )
    disk_gb: Annotated[float, Field(ge=1, le=100_000, allow_inf_nan=False)] | SkipJsonSchema[None] = Field(
        default=None, description="Disk to rent, GB (default 60)."
    )
    num_gpus: Count | SkipJsonSchema[None] = Field(default=None, description="GPUs per host (default 1).")
    min_reliability: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] | SkipJsonSchema[None] = Field(
        default=None,
        description="A hard floor on the platform's reliability score (unset: 0.98, and the score only weighs in).",
    )
    min_download_mbps: Annotated[float, Field(ge=0, le=1_000_000, allow_inf_nan=False)] | SkipJsonSchema[None] = Field(
        default=None, description="Least download speed, Mbit/s."
    )
    download_gb: Annotated[float, Field(ge=0, le=100_000, allow_inf_nan=False)] | SkipJsonSchema[None] = Field(
        default=None,
        description="Image + model the host pulls, GB (default 20): ranks offers, sizes the reservation.",
    )
    train_hours: Annotated[float, Field(ge=0, le=MAX_HOURS, allow_inf_nan=False)] | SkipJsonSchema[None] = Field(
        default=None,
        description="Expected training time (default 1): ranks offers, sizes the reservation and kill-time.",
    )
    standby_hosts: Annotated[int, Field(ge=0, le=MAX_STANDBY_HOSTS)] | SkipJsonSchema[None] = Field(
        default=None,
        description=(
            f"Verified hosts kept waiting (and billing) for this job's recoveries (0-{MAX_STANDBY_HOSTS}, default 0)."
        ),
    )
    kill_after_hours: (
        Annotated[float, Field(ge=0, le=MAX_KILL_AFTER_HOURS, allow_inf_nan=False)] | SkipJsonSchema[None]
    ) = Field(
        default=None,
        description=(
            "Each host is stopped this long after its create: more than 0, at most 168, no less than "
            "train_hours (unset: derived from train_hours)."
        ),
    )
    datacenter_only: Annotated[bool, Hint(fix="write datacenter_only: true (or leave it out)")] = Field(
        default=False, description="Only datacenter hosts (Vast datacenter, RunPod secure cloud)."
    )
    expected_tflops: Annotated[float, Field(ge=0.001, le=100_000, allow_inf_nan=False)] | SkipJsonSchema[None] = Field(
        default=None,
        description=(
            "bf16 TFLOP/s a healthy card of the job's GPU reaches on the preflight; a host below 85% of it "
            "is throttled (unset: learned per GPU model)."
        ),
    )

    @model_validator(mode="after")
    def _kill_time_covers_training(self) -> NeedsSection:
        hours = self.kill_after_hours
        if hours is None:
            return self
        if hours <= 0:
            raise _rule("must be more than 0 hours", "write e.g. kill_after_hours: 3", field_name="kill_after_hours")
        train_hours = 1.0 if self.train_hours is None else self.train_hours
        if hours < train_hours:
            raise _rule(
                f"{hours:g} h is shorter than train_hours {train_hours:g} h: the reaper would stop every host first",
                f"give at least {train_hours:g} h plus the pull, or leave it out (derived from train_hours)",
                field_name="kill_after_hours",
            )
        return self


# -- gate: evaluate and judge the adapters --------------------------------------------------------
_METRIC = Annotated[
    Literal["accuracy", "macro_f1"],
    Hint(fix="use accuracy or macro_f1", problems={"literal_error": "metric {input!r} is not one of {choices}"}),
]


class GateConfig(_Section):
    """gate.json's rules, inline (gate/trial.py reads them; docs/gate.md)."""

    missing_fix = "add gate.config.{key}: one of accuracy, macro_f1"

    metric: _METRIC = Field(description="The score the gate compares: accuracy or macro_f1.")
    min_margin: Annotated[float, Field(ge=0, allow_inf_nan=False)] | SkipJsonSchema[None] = Field(
        default=None, description="How much the worst seed must beat the baseline by."
    )
    ood: dict[str, Any] | SkipJsonSchema[None] = Field(
        default=None, description='Floors per out-of-distribution slice: {"<name>": {"floor": 0.85}}.'
    )
    critical_labels: list[Text] | SkipJsonSchema[None] = Field(
        default=None, description="Labels whose misses count against max_missed (set both or neither)."
    )
    max_missed: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] | SkipJsonSchema[None] = Field(
        default=None, description="Most share of critical labels missed."
    )
    model: Text | SkipJsonSchema[None] = Field(default=None, description="The model's name in the gate's history.")
    task: Text | SkipJsonSchema[None] = Field(default=None, description="The task's name in the gate's history.")
    baseline_name: Text | SkipJsonSchema[None] = Field(default=None, description="The baseline's name in reports.")
    min_canaries: Whole | SkipJsonSchema[None] = Field(
        default=None, description="Distinct canary rows the eval set must hold (default 10); lower it on purpose."
    )


def _gate_config_kind(value: Any) -> str:
    return "inline" if isinstance(value, dict) else "file"


def _eval_kind(value: Any) -> str:
    return "many" if isinstance(value, list) else "one"


def _not_an_adapter(value: Any) -> Any:
    if isinstance(value, str) and value.startswith("adapter:"):
        raise _rule("the baseline is not an adapter", "write predictions:FILE or command:CMD")
    return value


_PREDICTOR_FIX = "write predictions:FILE or command:CMD (incumbent: also adapter:DIR)"
_NOT_A_PREDICTOR = {"string_pattern_mismatch": "{input!r} is not a predictor"}


class GateSection(_Section):
    """Evaluate the adapters on held-out, canary and OOD rows, and judge them (docs/gate.md)."""

    nullable = frozenset({"incumbent"})
    missing_fix = "add gate.{key} (docs/gate.md: From job to gate)"
    mapping_fix = "write gate: {config: gate.json, eval: eval.jsonl, baseline: predictions:FILE}"

    config: Annotated[
        Annotated[PathText, Tag("file")] | Annotated[GateConfig, Tag("inline")],
        Discriminator(_gate_config_kind),
    ] = Field(description="A gate.json path, or the gate.json mapping inline: {metric: accuracy, ...}.")
    eval: Annotated[
        Annotated[PathText, Tag("one")]
        | Annotated[list[PathText], Field(min_length=1), Hint(problems={"too_short": "no eval file"}), Tag("many")],
        Discriminator(_eval_kind),
        Hint(fix="name at least one JSONL eval file"),
    ] = Field(
        description=(
            'Eval rows, JSONL (a file or a list): {"id", "slice", "prompt" | "text", "expected"}; '
            'slice is "heldout", "canary" or "ood:<name>".'
        )
    )
    baseline: Annotated[
        str,
        Field(pattern=r"^(predictions|command):.*\S"),
        BeforeValidator(_not_an_adapter),  # after the pattern: it runs first, with its own words
        Hint(fix=_PREDICTOR_FIX, problems=_NOT_A_PREDICTOR),
    ] = Field(
        description="What the adapter must beat: predictions:FILE, or command:CMD (run in the job file's directory)."
    )
    incumbent: (
        Annotated[
            str,
            Field(pattern=r"^(predictions|command|adapter):.*\S"),
            Hint(fix=_PREDICTOR_FIX, problems=_NOT_A_PREDICTOR),
        ]
        | None
    ) = Field(default=None, description="The model in production now: predictions:FILE, command:CMD or adapter:DIR.")
    seeds: Annotated[
        list[Whole],
        Field(min_length=2),
        Hint(
            fix="write seeds: [1, 2]",
            problems={
                "list_type": "must be a list of whole numbers, got {kind}",
                "too_short": "{actual_length} seed(s); the gate judges the worst of at least two",
            },
        ),
    ] = Field(
        default_factory=lambda: list(DEFAULT_GATE_SEEDS),
        description="One training run per seed; the gate judges the worst (at least two, default [1, 2]).",
    )
    timeout_s: Annotated[float, Field(ge=1, le=MAX_GATE_TIMEOUT_S, allow_inf_nan=False)] | SkipJsonSchema[None] = Field(
        default=None,
        description="Seconds each predictor may run (default 400).",
    )

    @field_validator("seeds", mode="after")
    @classmethod
    def _distinct(cls, seeds: list[int]) -> list[int]:
        if len(set(seeds)) != len(seeds):
            raise _rule(f"{seeds} repeats a seed", "give distinct seeds")
        return seeds


class JobFile(_Section):
    """A tuneharness job file: what to train, what it needs from a host, its budget, and its deploy gate."""

    nullable = frozenset({"budget_usd", "gate"})
    missing_fix = "add `{key}:` at the top level"

    name: Text = Field(description="The job's name, shown by `tuneharness jobs`.")
    train: Annotated[
        Annotated[BuiltinTrain, Tag("qlora")] | Annotated[CommandTrain, Tag("command")],
        Discriminator(train_kind),
    ] = Field(
        description="What to train: the built-in trainer's job.json fields (docs/trainer.md), or `kind: command`: "
        "your own training (docs/byo-training.md)."
    )
    needs: NeedsSection = Field(description="What a host must offer (docs/jobs.md).")
    budget_usd: Annotated[float, Field(ge=0, le=MAX_USD, allow_inf_nan=False)] | None = Field(
        default=None,
        description="The job's own budget cap, dollars: nothing is rented that it cannot pay.",
    )
    gate: GateSection | None = Field(
        default=None, description="Evaluate and judge the adapters (docs/gate.md: From job to gate)."
    )


def job_schema() -> dict[str, Any]:
    """The job file's JSON Schema (draft 2020-12), as `docs/job.schema.json` holds it."""
    schema = JobFile.model_json_schema(mode="validation")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


# -- ValidationError -> one problem ----------------------------------------------------------------
class Problem(NamedTuple):
    """One refusal: the field's dotted path, what is wrong, what to write; `at` is the path whose
    line the message names (a missing key: its section's)."""

    field: str
    problem: str
    fix: str
    at: str


def kind_of(value: Any) -> str:
    """A value's kind in a person's words."""
    names = {dict: "a mapping", list: "a list", str: "text", bool: "true/false", type(None): "nothing"}
    return names.get(type(value), type(value).__name__)


@dataclass
class _Leaf:
    """What the walk along an error's location found: the path and the type at its end."""

    path: str = ""
    tp: Any = None
    hints: list[Hint] = field(default_factory=list)
    bounds: dict[str, float] = field(default_factory=dict)
    owner: type[BaseModel] | None = None  # the section the last key belongs to
    folded: str | None = None  # a list of names whose element is wrong: the list's path


def _unwrap(tp: Any, leaf: _Leaf) -> Any:
    """Strip Annotated, collecting hints and numeric bounds."""
    while typing.get_origin(tp) is Annotated:
        tp, *meta = typing.get_args(tp)
        for m in meta:
            _collect(m, leaf)
    return tp


def _collect(meta: Any, leaf: _Leaf) -> None:
    if isinstance(meta, Hint):
        leaf.hints.append(meta)
    for inner in getattr(meta, "metadata", None) or ():  # a FieldInfo's own constraints
        _collect(inner, leaf)
    for key in ("ge", "le"):
        value = getattr(meta, key, None)
        if isinstance(value, int | float) and not isinstance(value, bool):
            leaf.bounds[key] = float(value)


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType)


def _branch(tp: Any, tag: Any) -> tuple[Any, bool]:
    """The member of union `tp` that location segment `tag` names, and whether the segment was a tag."""
    members = [m for m in typing.get_args(tp) if m is not type(None)]
    if len(members) == 1:  # `X | None`: pydantic validates X in place, no member named
        return members[0], False
    for m in members:
        for meta in typing.get_args(m)[1:] if typing.get_origin(m) is Annotated else ():
            if isinstance(meta, Tag) and meta.tag == tag:
                return m, True
        base = typing.get_args(m)[0] if typing.get_origin(m) is Annotated else m
        kind = getattr(base, "model_fields", {}).get("kind")
        if (kind is not None and kind.default == tag) or getattr(base, "__name__", None) == tag:
            return m, True  # a member named by its `kind` or, in a plain union, by its model's name
    # a plain union (`X | SkipJsonSchema[None]`): pydantic names the member it tried
    return members[0], isinstance(tag, str)


def _walk(loc: tuple[int | str, ...], root: type[BaseModel]) -> _Leaf:
    leaf = _Leaf(tp=root, owner=None)
    segments = list(loc)
    while True:
        tp = _unwrap(leaf.tp, leaf)
        if _is_union(tp):
            member, consumed = _branch(tp, segments[0] if segments else None)
            if consumed and segments:
                segments.pop(0)
            leaf.tp = member
            continue
        leaf.tp = tp
        if not segments:
            return leaf
        seg = segments.pop(0)
        if isinstance(tp, type) and issubclass(tp, BaseModel) and isinstance(seg, str):
            leaf.owner = tp
            leaf.path = f"{leaf.path}.{seg}" if leaf.path else seg
            info = tp.model_fields.get(seg)
            if info is None:
                leaf.tp = None
                return leaf
            leaf.hints, leaf.bounds = [], {}
            _collect(info, leaf)
            leaf.tp = info.annotation
        elif typing.get_origin(tp) is list and isinstance(seg, int):
            if leaf.folded is None and leaf.hints and any("*" in h.problems for h in leaf.hints):
                leaf.folded = leaf.path  # a list of names is judged whole
            leaf.path = f"{leaf.path}[{seg}]"
            leaf.hints, leaf.bounds = [], {}
            leaf.tp = typing.get_args(tp)[0]
        else:
            leaf.path = f"{leaf.path}.{seg}" if leaf.path else str(seg)
            leaf.tp = Any


def _numeric(tp: Any) -> bool:
    return tp in (int, float)


def first_problem(exc: ValidationError, root: type[BaseModel] = JobFile) -> Problem:
    """The first of pydantic's errors validating `root`, as the field's path, a problem in plain words and the fix."""
    errors = exc.errors(include_url=False)
    err = errors[0]
    if isinstance(err.get("input"), dict | list) and len(err["loc"]) > 0:
        # a mapping tried against a union's scalar member first: the member that took it says more
        deeper = [
            e
            for e in errors[1:]
            if len(e["loc"]) > len(err["loc"]) and e["loc"][: len(err["loc"]) - 1] == err["loc"][:-1]
        ]
        err = deeper[0] if deeper else err
    kind, loc, value, ctx = err["type"], tuple(err["loc"]), err.get("input"), dict(err.get("ctx") or {})
    if kind == "job_null":
        loc, value = (*loc, ctx["field"]), None
    leaf = _walk(loc, root)
    if kind == "job_rule":
        path = leaf.path
        if ctx.get("field"):
            path = f"{path}.{ctx['field']}" if path else str(ctx["field"])
        return Problem(path, str(ctx["problem"]), str(ctx["fix"]), path)
    owner = leaf.owner
    if kind == "missing" and owner is not None:
        key = leaf.path.rsplit(".", 1)[-1]
        parent = leaf.path.rsplit(".", 1)[0] if "." in leaf.path else ""
        fix = str(getattr(owner, "missing_fix", "add {key}")).format(key=key)
        if not parent:
            return Problem(key, "missing", fix, "")
        return Problem(parent, f"`{key}` is missing", fix, parent)
    if kind == "extra_forbidden" and owner is not None:
        return Problem(leaf.path, "unknown field", f"use one of {', '.join(owner.model_fields)}", leaf.path)
    tp, path = leaf.tp, leaf.path or "(file)"
    hint_fix = next((h.fix for h in reversed(leaf.hints) if h.fix), "")
    problems: dict[str, str] = {}
    for h in leaf.hints:
        problems.update(h.problems)
    if kind == "union_tag_invalid":  # a `kind:` no model has
        expected = str(ctx.get("expected_tags", "")).replace("'", "")
        return Problem(
            f"{path}.kind", f"{ctx.get('tag')!r} is not one of {expected}", f"use {expected}", f"{path}.kind"
        )
    if kind == "value_error":  # a model's own rule, raised as ValueError: its message is the problem
        problem = str(ctx.get("error", err["msg"]))
        return Problem(path, problem, hint_fix or "see the field's description: tuneharness schema job", path)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        fix = str(getattr(tp, "mapping_fix", "write `key: value` lines"))
        return Problem(path, f"must be a mapping, got {kind_of(value)}", fix, path)
    if leaf.folded is not None and kind not in problems:
        return Problem(leaf.folded, "must be a list of names, got a list", _NAMES_FIX, leaf.folded)
    if _numeric(tp) and kind not in problems:
        return Problem(path, *_number_problem(value, tp is int, leaf.bounds), at=path)
    choices = ", ".join(str(c) for c in typing.get_args(tp)) if typing.get_origin(tp) is Literal else ""
    words = {"input": value, "kind": kind_of(value), "choices": choices, **ctx}
    template = problems.get(kind) or problems.get("*")
    if template is not None:
        return Problem(path, template.format(**words), hint_fix or "write a valid value", path)
    if tp is bool:
        return Problem(path, f"{value!r} is not true or false", hint_fix or "write true or false", path)
    if choices:
        return Problem(path, f"{value!r} is not one of {choices}", hint_fix or f"use one of {choices}", path)
    if tp is str and kind == "string_pattern_mismatch" and ctx.get("pattern") != r"\S":
        return Problem(
            path, f"{value!r} does not match {ctx.get('pattern')}", hint_fix or "write it in that form", path
        )
    if tp is str:
        return Problem(
            path, f"must be a non-empty string, got {kind_of(value)}", hint_fix or "write a text value", path
        )
    return Problem(
        path, str(err["msg"]), hint_fix or "correct the value", path
    )  # pragma: no cover - every field is typed above


def _number_problem(value: Any, integer: bool, bounds: Mapping[str, float]) -> tuple[str, str]:
    """The problem with a number as `app.numbers` words it: the type first, then finite, then the range."""
    want = "a whole number" if integer else "a number"
    ok = isinstance(value, int) if integer else isinstance(value, int | float)
    if isinstance(value, bool) or not ok:
        return f"must be {want}, got {kind_of(value)} {value!r}", f"write {want}"
    minimum, maximum = bounds.get("ge"), bounds.get("le")
    if maximum is not None and math.isinf(maximum):
        maximum = None
    problem = range_problem(value, minimum=minimum, maximum=maximum, integer=integer)
    if problem is None:  # pragma: no cover - pydantic refused it, so a bound did
        return f"{value!r} is out of range", "write a value in range"
    return problem
