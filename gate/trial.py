"""Reading and validating a trial directory; the judge itself is `app.policy.gate_rules`.

A trial directory holds `gate.json`, `baseline.jsonl`, optionally `incumbent.jsonl`, and one
`candidate-seed-<SEED>.jsonl` per training seed. Any other `*.jsonl` file is refused (a misspelt
`incumbent.jsonl` must not silently switch a rule off); other files (a README, `decision.json`)
are ignored and are not part of the trial's hash.

Malformed input raises `MalformedTrial` (a `UserError`: one line, exit 2) naming the file and,
where there is one, the line.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.errors import UserError
from app.policy.gate_rules import (
    CANARY,
    DEFAULT_MIN_CANARIES,
    HELDOUT,
    METRICS,
    OOD_PREFIX,
    GateConfig,
    Metric,
    OodFloor,
    Row,
    Trial,
    exact,
)

__all__ = [
    "BASELINE_FILE",
    "CONFIG_FILE",
    "INCUMBENT_FILE",
    "LoadedTrial",
    "MalformedTrial",
    "TrialMeta",
    "candidate_file",
    "hash_files",
    "load_trial",
    "parse_gate_config",
    "read_rows",
    "valid_slice",
]

CONFIG_FILE = "gate.json"
BASELINE_FILE = "baseline.jsonl"
INCUMBENT_FILE = "incumbent.jsonl"
_CANDIDATE_RE = re.compile(r"^candidate-seed-([A-Za-z0-9_.-]+)\.jsonl$")
_ROW_FIELDS = ("id", "slice", "expected", "predicted")
_CONFIG_KEYS = {
    "metric",
    "min_margin",
    "ood",
    "critical_labels",
    "max_missed",
    "model",
    "task",
    "baseline_name",
    "min_canaries",
}


class MalformedTrial(UserError):
    """A trial file cannot be judged as it stands; the message names the file and line."""


def candidate_file(seed: str) -> str:
    name = f"candidate-seed-{seed}.jsonl"
    if not _CANDIDATE_RE.match(name):
        raise MalformedTrial(f"seed {seed!r} cannot name a file. Fix: use letters, digits, '_', '.' or '-'")
    return name


@dataclass(frozen=True, slots=True)
class TrialMeta:
    """What gate.json says about the trial besides the rules: names for people and history."""

    model: str
    task: str | None = None
    baseline_name: str | None = None


@dataclass(frozen=True, slots=True)
class LoadedTrial:
    """A validated trial: the policy's input, its metadata, and the hash that identifies it."""

    path: Path
    trial: Trial
    meta: TrialMeta
    trial_hash: str
    files: tuple[str, ...]


def valid_slice(name: str) -> bool:
    return name in (HELDOUT, CANARY) or (name.startswith(OOD_PREFIX) and len(name) > len(OOD_PREFIX))


def hash_files(directory: Path, files: tuple[str, ...]) -> str:
    """sha256 over `name NUL sha256(content) LF` for each judged file, names sorted."""
    outer = hashlib.sha256()
    for name in sorted(files):
        data = _read_bytes(directory / name)
        outer.update(name.encode() + b"\0" + hashlib.sha256(data).hexdigest().encode() + b"\n")
    return outer.hexdigest()


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise MalformedTrial(f"{path}: cannot read ({exc.strerror or exc}). Fix: check the file") from None


def _read_text(path: Path) -> str:
    data = _read_bytes(path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise MalformedTrial(f"{path}:{line}: not UTF-8 text. Fix: write the file as UTF-8") from None


def read_rows(path: Path) -> tuple[tuple[Row, int], ...]:
    """Every prediction row of a JSONL file with its line number; blank lines are skipped."""
    rows: list[tuple[Row, int]] = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(_read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise MalformedTrial(f"{where}: bad JSON ({exc.msg}). Fix: one JSON object per line") from None
        if not isinstance(obj, dict):
            raise MalformedTrial(f"{where}: a row must be a JSON object. Fix: one JSON object per line")
        values: dict[str, str] = {}
        for key in _ROW_FIELDS:
            if key not in obj:
                raise MalformedTrial(
                    f"{where}: missing field {key!r}. Fix: every row needs id, slice, expected, predicted"
                )
            if not isinstance(obj[key], str):
                raise MalformedTrial(f"{where}: field {key!r} must be a string, got {obj[key]!r}")
            values[key] = obj[key]
        if not values["id"]:
            raise MalformedTrial(f"{where}: empty id. Fix: give every row a unique non-empty id")
        if not valid_slice(values["slice"]):
            raise MalformedTrial(
                f'{where}: unknown slice {values["slice"]!r}. Fix: use "heldout", "canary" or "ood:<name>"'
            )
        if values["id"] in seen:
            raise MalformedTrial(
                f"{where}: id {values['id']!r} already on line {seen[values['id']]}. Fix: one row per id in each file"
            )
        seen[values["id"]] = lineno
        rows.append((Row(**values), lineno))
    return tuple(rows)


def _number(cfg: Mapping[str, Any], key: str, where: str, *, lo: float, hi: float | None) -> Any:
    value = cfg[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise MalformedTrial(f"{where}: {key!r} must be a number, got {value!r}")
    if not math.isfinite(value):  # JSON's NaN, Infinity and 1e309: every comparison with NaN is false
        raise MalformedTrial(f"{where}: {key!r} is {value}, not a finite number. Fix: write a number such as 0.02")
    if value < lo or (hi is not None and value > hi):
        span = f"from {lo} to {hi}" if hi is not None else f"at least {lo}"
        raise MalformedTrial(f"{where}: {key!r} is {value}; it must be {span}")
    return value


def parse_gate_config(path: Path, *, default_model: str) -> tuple[GateConfig, TrialMeta]:
    """Validate gate.json; every problem names the file and, for bad JSON, the line."""
    text = _read_text(path)
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MalformedTrial(f"{path}:{exc.lineno}: bad JSON ({exc.msg})") from None
    where = str(path)
    if not isinstance(cfg, dict):
        raise MalformedTrial(f"{where}: must be a JSON object")
    unknown = sorted(set(cfg) - _CONFIG_KEYS)
    if unknown:
        raise MalformedTrial(
            f"{where}: unknown key(s) {', '.join(unknown)}. Fix: use {', '.join(sorted(_CONFIG_KEYS))}"
        )
    metric = cfg.get("metric")
    if metric not in METRICS:
        raise MalformedTrial(f'{where}: "metric" must be "accuracy" or "macro_f1", got {metric!r}')
    min_margin = exact(_number(cfg, "min_margin", where, lo=0.0, hi=None)) if "min_margin" in cfg else exact(0)

    ood: dict[str, OodFloor] = {}
    raw_ood = cfg.get("ood", {})
    if not isinstance(raw_ood, dict):
        raise MalformedTrial(f'{where}: "ood" must be an object {{"<name>": {{"floor": 0.85}}}}')
    for name, spec in raw_ood.items():
        if not name or not isinstance(spec, dict):
            raise MalformedTrial(f'{where}: "ood.{name}" must be an object like {{"floor": 0.85, "blocking": true}}')
        extra = sorted(set(spec) - {"floor", "blocking"})
        if extra or "floor" not in spec:
            raise MalformedTrial(f'{where}: "ood.{name}" takes "floor" (required) and "blocking" only')
        floor = _number(spec, "floor", f"{where}: ood.{name}", lo=0.0, hi=1.0)
        blocking = spec.get("blocking", True)
        if not isinstance(blocking, bool):
            raise MalformedTrial(f'{where}: "ood.{name}.blocking" must be true or false')
        ood[name] = OodFloor(floor=exact(floor), blocking=blocking)

    has_labels, has_max = "critical_labels" in cfg, "max_missed" in cfg
    if has_labels != has_max:
        raise MalformedTrial(f'{where}: "critical_labels" and "max_missed" go together. Fix: set both or neither')
    labels: frozenset[str] = frozenset()
    max_missed = None
    if has_labels:
        raw_labels = cfg["critical_labels"]
        if not isinstance(raw_labels, list) or not raw_labels or not all(isinstance(x, str) and x for x in raw_labels):
            raise MalformedTrial(f'{where}: "critical_labels" must be a non-empty list of label strings')
        labels = frozenset(raw_labels)
        max_missed = exact(_number(cfg, "max_missed", where, lo=0.0, hi=1.0))

    min_canaries = DEFAULT_MIN_CANARIES
    if "min_canaries" in cfg:
        value = _number(cfg, "min_canaries", where, lo=0, hi=None)
        if not isinstance(value, int):
            raise MalformedTrial(f'{where}: "min_canaries" must be a whole number, got {value!r}')
        min_canaries = value

    meta_values: dict[str, str | None] = {}
    for key in ("model", "task", "baseline_name"):
        value = cfg.get(key)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise MalformedTrial(f"{where}: {key!r} must be a non-empty string")
        meta_values[key] = value
    metric_value: Metric = "accuracy" if metric == "accuracy" else "macro_f1"
    config = GateConfig(
        metric=metric_value,
        min_margin=min_margin,
        ood=ood,
        critical_labels=labels,
        max_missed=max_missed,
        min_canaries=min_canaries,
    )
    meta = TrialMeta(
        model=meta_values["model"] or default_model,
        task=meta_values["task"],
        baseline_name=meta_values["baseline_name"],
    )
    return config, meta


def load_trial(directory: Path) -> LoadedTrial:
    """Read, validate and hash a trial directory."""
    directory = Path(directory)
    if not directory.is_dir():
        raise MalformedTrial(f"{directory}: not a directory. Fix: pass a trial directory")
    names = sorted(p.name for p in directory.iterdir() if p.is_file())
    if CONFIG_FILE not in names:
        raise MalformedTrial(f"{directory}: no {CONFIG_FILE}. Fix: write the gate's configuration there")
    if BASELINE_FILE not in names:
        raise MalformedTrial(f"{directory}: no {BASELINE_FILE}. Fix: add the baseline's predictions")
    seeds: dict[str, str] = {}
    for name in names:
        if not name.endswith(".jsonl") or name in (BASELINE_FILE, INCUMBENT_FILE):
            continue
        m = _CANDIDATE_RE.match(name)
        if m is None:
            raise MalformedTrial(
                f"{directory / name}: unexpected prediction file. Fix: name it {BASELINE_FILE}, "
                f"{INCUMBENT_FILE} or candidate-seed-<SEED>.jsonl, or move it out of the trial"
            )
        seeds[m.group(1)] = name

    resolved = directory.resolve()
    config, meta = parse_gate_config(directory / CONFIG_FILE, default_model=resolved.name)
    files = [CONFIG_FILE, BASELINE_FILE, *seeds.values()]
    has_incumbent = INCUMBENT_FILE in names
    if has_incumbent:
        files.append(INCUMBENT_FILE)

    # Read every prediction file; an id must mean the same example everywhere.
    first_seen: dict[str, tuple[str, str, str]] = {}  # id -> (slice, expected, "file:line")
    loaded: dict[str, tuple[Row, ...]] = {}
    for name in sorted(files[1:]):
        path = directory / name
        rows = read_rows(path)
        for row, lineno in rows:
            here = f"{path}:{lineno}"
            prior = first_seen.get(row.id)
            if prior is None:
                first_seen[row.id] = (row.slice, row.expected, here)
                continue
            if prior[1] != row.expected:
                raise MalformedTrial(
                    f"{here}: id {row.id!r} expects {row.expected!r} but {prior[2]} expects "
                    f"{prior[1]!r}. Fix: one expected label per id across the trial"
                )
            if prior[0] != row.slice:
                raise MalformedTrial(
                    f"{here}: id {row.id!r} is in slice {row.slice!r} but {prior[2]} puts it in "
                    f"{prior[0]!r}. Fix: one slice per id across the trial"
                )
        loaded[name] = tuple(r for r, _ in rows)

    for name in (BASELINE_FILE, INCUMBENT_FILE):
        if name in loaded and not any(r.slice == HELDOUT for r in loaded[name]):
            raise MalformedTrial(
                f'{directory / name}: no held-out rows. Fix: the gate compares on the "heldout" slice; predict it'
            )

    trial = Trial(
        config=config,
        baseline=loaded[BASELINE_FILE],
        candidates={seed: loaded[name] for seed, name in seeds.items()},
        incumbent=loaded.get(INCUMBENT_FILE) if has_incumbent else None,
    )
    judged = tuple(sorted(files))
    return LoadedTrial(
        path=resolved,
        trial=trial,
        meta=meta,
        trial_hash=hash_files(directory, judged),
        files=judged,
    )
