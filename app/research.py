"""Research files (YAML), the fields of an experiment's record, and the board.

A research file names a base job file and how to search around it (docs/research.md):

    name: tiny-search
    job: job.yaml                  # a job file: model, data, trainer settings, needs
    axes:                          # one-axis mutations of the best config
      learning_rate: {times: [2.0, 0.5]}
      warmup_steps: {plus: [4, -4], min: 0}
      lr_schedule: {choices: [cosine, linear]}
    time_box_s: 20                 # every experiment trains for this long (compute-matched)
    val_fraction: 0.2              # the trainer's held-out split; the metric is its loss
    tier: RTX 3090                 # the hardware tier: every experiment rents this GPU model
    iterations: 2
    mutations: 2                   # per iteration
    parallelism: 2                 # experiments in flight at once
    baseline_seeds: [1, 2]         # at least two: their spread is the noise floor
    seeds: [1]                     # of each mutation
    noise_sigmas: 2                # accept only a gain above this many standard deviations
    budget_usd: 1.0                # the run's cap
    job_budget_usd: 0.10           # each experiment job's cap, reserved out of budget_usd first

A run's state lives in the fleet's database (`app.researchstore`); experiments.jsonl, best.json
and board.md under TUNEHARNESS_HOME/research/<run>/ are exported from it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.jobs import JobFileError, JobSpec, _compose, _read_job_text, load_job_file
from app.numbers import MAX_COUNT, MAX_USD, range_problem
from app.policy.research import Axis, AxisKind, ResearchConfig, get_path

__all__ = [
    "EXPERIMENT_FIELDS",
    "ResearchFile",
    "load_research_file",
    "parse_research_text",
    "render_board",
    "research_root",
]

_TOP = (
    "name",
    "job",
    "axes",
    "time_box_s",
    "val_fraction",
    "tier",
    "iterations",
    "mutations",
    "parallelism",
    "baseline_seeds",
    "seeds",
    "noise_sigmas",
    "min_noise",
    "slow_fraction",
    "expected_tflops",
    "budget_usd",
    "job_budget_usd",
)
_REQUIRED = ("name", "job", "axes", "time_box_s", "tier", "budget_usd", "job_budget_usd")
# Fields of the train section that hold whole numbers (their steps round).
_INTEGER_AXES = ("warmup_steps", "batch_size", "grad_accum", "max_seq_len", "lora.r")
_AXIS_KEYS = ("times", "plus", "choices", "min", "max")
_TRAIN_AXES = (
    "learning_rate",
    "warmup_steps",
    "weight_decay",
    "batch_size",
    "grad_accum",
    "lr_schedule",
    "max_grad_norm",
    "lora.r",
    "lora.alpha",
    "lora.dropout",
)
_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,39}$")

# The keys of one experiments.jsonl line, in order (docs/research.md explains each).
EXPERIMENT_FIELDS = (
    "run",
    "exp",
    "iteration",
    "axis",
    "old",
    "new",
    "parent",
    "config",
    "seeds",
    "metric",
    "metric_per_seed",
    "mean",
    "best_mean",
    "noise",
    "verdict",
    "why",
    "status",
    "jobs",
    "hosts",
    "gpu_models",
    "tflops",
    "wall_s",
    "steps",
    "usd",
)


@dataclass(frozen=True, slots=True)
class ResearchFile:
    name: str
    job: JobSpec
    config: ResearchConfig
    time_box_s: float
    val_fraction: float
    tier: str
    job_budget_usd: float
    source: str

    def to_dict(self) -> dict[str, Any]:
        c = self.config
        return {
            "name": self.name,
            "job": self.job.to_dict(),
            "axes": [
                {
                    "name": a.name,
                    "kind": a.kind.value,
                    "steps": list(a.steps),
                    "integer": a.integer,
                    "min": a.minimum,
                    "max": a.maximum,
                }
                for a in c.axes
            ],
            "iterations": c.iterations,
            "mutations": c.mutations,
            "parallelism": c.parallelism,
            "baseline_seeds": list(c.baseline_seeds),
            "seeds": list(c.seeds),
            "budget_usd": c.budget_usd,
            "noise_sigmas": c.noise_sigmas,
            "min_noise": c.min_noise,
            "slow_fraction": c.slow_fraction,
            "expected_tflops": c.expected_tflops,
            "time_box_s": self.time_box_s,
            "val_fraction": self.val_fraction,
            "tier": self.tier,
            "job_budget_usd": self.job_budget_usd,
            "source": self.source,
        }

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> ResearchFile:
        from app.jobs import spec_from_dict

        axes = tuple(
            Axis(
                name=str(a["name"]),
                kind=AxisKind(a["kind"]),
                steps=tuple(a["steps"]),
                integer=bool(a["integer"]),
                minimum=a["min"],
                maximum=a["max"],
            )
            for a in d["axes"]
        )
        return ResearchFile(
            name=str(d["name"]),
            job=spec_from_dict(d["job"]),
            config=ResearchConfig(
                axes=axes,
                iterations=int(d["iterations"]),
                mutations=int(d["mutations"]),
                parallelism=int(d["parallelism"]),
                baseline_seeds=tuple(int(s) for s in d["baseline_seeds"]),
                seeds=tuple(int(s) for s in d["seeds"]),
                budget_usd=float(d["budget_usd"]),
                reserve_usd=float(d["job_budget_usd"]),
                noise_sigmas=float(d["noise_sigmas"]),
                min_noise=float(d["min_noise"]),
                slow_fraction=float(d["slow_fraction"]),
                expected_tflops=None if d["expected_tflops"] is None else float(d["expected_tflops"]),
            ),
            time_box_s=float(d["time_box_s"]),
            val_fraction=float(d["val_fraction"]),
            tier=str(d["tier"]),
            job_budget_usd=float(d["job_budget_usd"]),
            source=str(d["source"]),
        )


class _Check:
    """Refusals that point at the field's line in the research file."""

    def __init__(self, source: str, lines: Mapping[str, int]) -> None:
        self.source, self.lines = source, lines

    def fail(self, path: str, problem: str, fix: str) -> JobFileError:
        line = self.lines.get(path)
        if line is None and "." in path:
            line = self.lines.get(path.rsplit(".", 1)[0])
        return JobFileError(self.source, line, path, problem, fix)

    def mapping(self, value: Any, path: str, allowed: Sequence[str]) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(path or "(file)", "must be a mapping", "write `key: value` lines")
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
        maximum: float | None = None,
        integer: bool = False,
    ) -> float:
        problem = range_problem(
            value, minimum=minimum, maximum=MAX_COUNT if maximum is None and integer else maximum, integer=integer
        )
        if problem is not None:
            raise self.fail(path, *problem)
        return float(value)

    def string(self, value: Any, path: str) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.fail(path, "must be a non-empty string", "write a text value")
        return value


def _seeds(c: _Check, value: Any, path: str, *, at_least: int) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) < at_least:
        raise c.fail(path, f"must be a list of at least {at_least} seeds, got {value!r}", "write e.g. [1, 2]")
    seeds = tuple(int(c.number(v, f"{path}[{i}]", minimum=0, integer=True)) for i, v in enumerate(value))
    if len(set(seeds)) != len(seeds):
        raise c.fail(path, f"repeats a seed: {list(seeds)}", "list each seed once")
    return seeds


def _axis(c: _Check, name: str, value: Any) -> Axis:
    path = f"axes.{name}"
    if name not in _TRAIN_AXES:
        raise c.fail(path, "is not a field a mutation can change", f"use one of {', '.join(_TRAIN_AXES)}")
    spec = c.mapping(value, path, _AXIS_KEYS)
    kinds = [k for k in ("times", "plus", "choices") if k in spec]
    if len(kinds) != 1:
        raise c.fail(path, "needs exactly one of times, plus, choices", "write e.g. {times: [2.0, 0.5]}")
    kind = AxisKind(kinds[0])
    raw = spec[kind.value]
    if not isinstance(raw, list) or not raw:
        raise c.fail(f"{path}.{kind.value}", "must be a non-empty list", "write e.g. [2.0, 0.5]")
    if kind is AxisKind.CHOICES:
        steps: tuple[Any, ...] = tuple(raw)
        for i, v in enumerate(raw):
            if isinstance(v, float) and not math.isfinite(v):
                raise c.fail(f"{path}.choices[{i}]", "is not a finite number", "write a finite value")
    elif kind is AxisKind.TIMES:
        steps = tuple(c.number(v, f"{path}.times[{i}]", minimum=0.001, maximum=1000) for i, v in enumerate(raw))
    else:
        steps = tuple(c.number(v, f"{path}.plus[{i}]", minimum=-1e6, maximum=1e6) for i, v in enumerate(raw))
    bounds = {k: c.number(spec[k], f"{path}.{k}", minimum=-1e12, maximum=1e12) for k in ("min", "max") if k in spec}
    return Axis(
        name=name,
        kind=kind,
        steps=steps,
        integer=name in _INTEGER_AXES,
        minimum=bounds.get("min"),
        maximum=bounds.get("max"),
    )


def parse_research_text(text: str, *, source: str, base_dir: Path) -> ResearchFile:
    """Validate a research file; raise JobFileError (one line: file, line, field, fix) on bad input."""
    raw, lines = _compose(text, source)
    c = _Check(source, lines)
    top = c.mapping(raw, "", _TOP)
    for key in _REQUIRED:
        if key not in top:
            raise JobFileError(source, None, key, "missing", f"add `{key}:` at the top level (docs/research.md)")
    name = c.string(top["name"], "name")
    if not _NAME.match(name):
        raise c.fail("name", f"{name!r} is not a short lowercase name", "use a-z, 0-9 and -, at most 40 characters")
    job_path = base_dir / c.string(top["job"], "job")
    if not job_path.is_file():
        raise c.fail("job", f"{job_path} does not exist", "point it at a job file next to the research file")
    job = load_job_file(job_path)
    if job.gate is not None:
        raise c.fail("job", "the base job has a gate", "remove the gate: research experiments are judged by val loss")
    axes_raw = c.mapping(top["axes"], "axes", _TRAIN_AXES)
    if not axes_raw:
        raise c.fail("axes", "names no axis", "add at least one, e.g. learning_rate: {times: [2.0, 0.5]}")
    axes = tuple(_axis(c, n, v) for n, v in axes_raw.items())
    for a in axes:
        if get_path(job.train, a.name) is None and a.kind is not AxisKind.CHOICES:
            raise c.fail(f"axes.{a.name}", f"the base job sets no {a.name}", f"set train.{a.name} in {job_path.name}")
    budget = c.number(top["budget_usd"], "budget_usd", minimum=0.0001, maximum=MAX_USD)
    job_budget = c.number(top["job_budget_usd"], "job_budget_usd", minimum=0.0001, maximum=MAX_USD)
    baseline_seeds = _seeds(c, top.get("baseline_seeds", [1, 2]), "baseline_seeds", at_least=2)
    seeds = _seeds(c, top.get("seeds", [1]), "seeds", at_least=1)
    if job_budget * len(baseline_seeds) > budget:
        raise c.fail(
            "budget_usd",
            f"${budget:g} cannot cover the baseline ({len(baseline_seeds)} jobs at ${job_budget:g})",
            "raise budget_usd or lower job_budget_usd",
        )
    expected = top.get("expected_tflops")
    config = ResearchConfig(
        axes=axes,
        iterations=int(c.number(top.get("iterations", 4), "iterations", minimum=1, maximum=1000, integer=True)),
        mutations=int(c.number(top.get("mutations", 2), "mutations", minimum=1, maximum=64, integer=True)),
        parallelism=int(c.number(top.get("parallelism", 2), "parallelism", minimum=1, maximum=64, integer=True)),
        baseline_seeds=baseline_seeds,
        seeds=seeds,
        budget_usd=budget,
        reserve_usd=job_budget,
        noise_sigmas=c.number(top.get("noise_sigmas", 2.0), "noise_sigmas", minimum=0, maximum=100),
        min_noise=c.number(top.get("min_noise", 0.0), "min_noise", minimum=0, maximum=1e6),
        slow_fraction=c.number(top.get("slow_fraction", 0.85), "slow_fraction", minimum=0, maximum=1),
        expected_tflops=None if expected is None else c.number(expected, "expected_tflops", minimum=0.001),
    )
    return ResearchFile(
        name=name,
        job=job,
        config=config,
        time_box_s=c.number(top["time_box_s"], "time_box_s", minimum=1, maximum=86_400),
        val_fraction=c.number(top.get("val_fraction", 0.2), "val_fraction", minimum=0.01, maximum=0.5),
        tier=c.string(top["tier"], "tier"),
        job_budget_usd=job_budget,
        source=source,
    )


def load_research_file(path: str | Path) -> ResearchFile:
    p = Path(path)
    return parse_research_text(_read_job_text(p), source=str(p), base_dir=p.parent)


def research_root(home: Path) -> Path:
    return home / "research"


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "-" if v is None else str(v)


def render_board(run_id: str, experiments: Sequence[Mapping[str, Any]], state: Mapping[str, Any] | None) -> str:
    """The leaderboard as Markdown: every experiment by metric, then each accepted change and its cost."""
    ranked = sorted(experiments, key=lambda r: (r.get("mean") is None, r.get("mean") or 0.0, str(r.get("exp"))))
    out = [f"## research run {run_id}", ""]
    if state is not None:
        out.append(
            f"phase {state.get('phase')}; best val loss {_fmt(state.get('best_mean'))}; "
            f"noise {_fmt(state.get('noise'))}; spent ${float(state.get('spent_usd') or 0.0):.4f}"
            + (f"; finished: {state['finished_reason']}" if state.get("finished_reason") else "")
        )
        out.append("")
    out += [
        "| exp | iter | axis | old -> new | val loss (seeds) | verdict | status | TFLOP/s | $ |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in ranked:
        change = "baseline" if r.get("axis") is None else f"{_fmt(r.get('old'))} -> {_fmt(r.get('new'))}"
        per_seed = ", ".join(_fmt(v) for v in (r.get("metric_per_seed") or {}).values())
        tflops = ", ".join(_fmt(v) for v in (r.get("tflops") or []))
        out.append(
            f"| {r.get('exp')} | {r.get('iteration')} | {_fmt(r.get('axis'))} | {change} | "
            f"{_fmt(r.get('mean'))} ({per_seed}) | {r.get('verdict')} | {r.get('status')} | {tflops or '-'} | "
            f"{float(r.get('usd') or 0.0):.4f} |"
        )
    accepted = list((state or {}).get("accepted") or [])
    out += ["", "| accepted change | val loss | cost to find |", "|---|---|---|"]
    for a in accepted:
        out.append(f"| {a['axis']} = {_fmt(a['new'])} ({a['exp_id']}) | {_fmt(a['mean'])} | ${a['cost_usd']:.4f} |")
    if not accepted:
        out.append("| none yet | | |")
    return "\n".join(out) + "\n"
