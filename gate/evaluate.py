"""Evaluate predictors on eval sets and write a trial directory (`tuneharness gate run`).

Nothing is trained here. A predictor is one of:

- `adapter:DIR`: a local adapter on `--base-model`, run through the trainer's own model-loading
  code as a program: `python -m trainer predict --base-model B --adapter DIR --input IN --output OUT`
  (the control plane never imports the trainer);
- `command:CMD`: any program that reads input rows as JSON lines on stdin and writes
  `{"id", "predicted"}` lines on stdout (e.g. the rules-only triage baseline);
- `predictions:FILE`: predictions already made, `{"id", "predicted"}` per line.

Eval-set rows: `{"id", "slice", "expected", "text" | "prompt"}`; predictors receive
`{"id", "text"}` (classification) or `{"id", "prompt"}` (causal LM). A predictor that skips an
id leaves that row out of its file, and the judge refuses with `incomplete_predictions`.

Predictors are code we did not write (a command from a job file, an adapter pulled off a
stranger's host), so they run with `predictor_env`: a short allow-list (PATH, HOME, locale,
TMPDIR, the Python and GPU variables loading needs), and never a secret (the catalogue's secrets,
any `*_KEY`, `*_TOKEN`, `*_PASSWORD`, `*_SECRET`, database or broker URL, or a URL holding a
password).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from app.errors import UserError
from app.evalrows import leak_message, leaked_rows, training_hashes
from gate.trial import (
    BASELINE_FILE,
    CONFIG_FILE,
    INCUMBENT_FILE,
    candidate_file,
    parse_gate_config,
    valid_slice,
)

__all__ = [
    "EvalError",
    "EvalRow",
    "PredictorSpec",
    "build_trial",
    "check_not_in_training",
    "parse_spec",
    "predict",
    "predictor_env",
    "read_eval_sets",
    "read_predictions",
    "write_trial",
]

PredictorKind = Literal["adapter", "command", "predictions"]
_KINDS: tuple[PredictorKind, ...] = ("adapter", "command", "predictions")
_PROJECT_ROOT = Path(__file__).resolve().parents[1]


class EvalError(UserError):
    """An eval set, a predictor or its output is unusable; the message names what and where."""


# What a predictor process may see of ours; everything else (vendor keys, the database's password,
# the webhook's token) stays behind.
_PASSED_ENV = (
    "PATH", "HOME", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR",
    "PYTHONPATH", "VIRTUAL_ENV", "HF_HOME", "HF_HUB_CACHE", "TRANSFORMERS_CACHE",
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NVIDIA_VISIBLE_DEVICES", "OMP_NUM_THREADS",
    "CUDA_HOME", "LD_LIBRARY_PATH", "TORCH_HOME", "XDG_CACHE_HOME", "USER", "LOGNAME",
)  # fmt: skip
_SECRET_NAME = re.compile(r"(KEY|TOKEN|PASSWORD|PASSWD|SECRET|CREDENTIALS?|DB_URL|DATABASE_URL|BROKER_URL)$", re.I)
_URL_WITH_PASSWORD = re.compile(r"://[^/\s:@]*:[^/\s@]+@")


def predictor_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment a predictor runs with: the allow-list above, minus anything secret."""
    from app.settings_catalogue import secret_names

    secrets = secret_names()
    env = {
        name: environ[name]
        for name in _PASSED_ENV
        if name in environ
        and name not in secrets
        and not _SECRET_NAME.search(name)
        and not _URL_WITH_PASSWORD.search(environ[name])
    }
    env["HF_HUB_OFFLINE"] = "1"
    return env


@dataclass(frozen=True, slots=True)
class EvalRow:
    id: str
    slice: str
    expected: str
    input_field: Literal["text", "prompt"]
    input_value: str

    def predictor_input(self) -> dict[str, str]:
        return {"id": self.id, self.input_field: self.input_value}


@dataclass(frozen=True, slots=True)
class PredictorSpec:
    kind: PredictorKind
    value: str

    def describe(self) -> str:
        return f"{self.kind}:{self.value}"


def parse_spec(text: str, *, what: str) -> PredictorSpec:
    """`adapter:DIR`, `command:CMD` or `predictions:FILE`."""
    kind, sep, value = text.partition(":")
    if not sep or kind not in _KINDS or not value:
        raise EvalError(f"{what}: {text!r} is not a predictor. Fix: use adapter:DIR, command:CMD or predictions:FILE")
    return PredictorSpec(kind=next(k for k in _KINDS if k == kind), value=value)


def read_eval_sets(paths: Sequence[Path]) -> list[EvalRow]:
    """Eval rows from JSONL files; ids unique across all of them."""
    rows: list[EvalRow] = []
    seen: dict[str, str] = {}
    for path in paths:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise EvalError(f"{path}: cannot read the eval set ({exc}). Fix: check the path") from None
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise EvalError(f"{where}: bad JSON ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise EvalError(f"{where}: a row must be a JSON object")
            for key in ("id", "slice", "expected"):
                if not isinstance(obj.get(key), str) or not obj[key]:
                    raise EvalError(f"{where}: field {key!r} must be a non-empty string")
            if not valid_slice(obj["slice"]):
                raise EvalError(f'{where}: unknown slice {obj["slice"]!r}. Fix: "heldout", "canary" or "ood:<name>"')
            fields = [k for k in ("text", "prompt") if k in obj]
            if len(fields) != 1 or not isinstance(obj[fields[0]], str):
                raise EvalError(f'{where}: a row needs exactly one of "text" or "prompt" (a string)')
            if obj["id"] in seen:
                raise EvalError(f"{where}: id {obj['id']!r} already in {seen[obj['id']]}")
            seen[obj["id"]] = where
            field_name: Literal["text", "prompt"] = "text" if fields[0] == "text" else "prompt"
            rows.append(EvalRow(obj["id"], obj["slice"], obj["expected"], field_name, obj[fields[0]]))
    if not rows:
        raise EvalError("the eval sets hold no rows. Fix: pass --eval FILE with rows")
    return rows


def check_not_in_training(rows: Sequence[EvalRow], train_paths: Sequence[Path]) -> None:
    """Refuse eval rows whose input also appears in the training data (by content hash): a model
    scored on examples it was trained on proves nothing. The message names the rows."""
    if not train_paths:
        return
    try:
        seen = training_hashes(train_paths)
    except (OSError, UnicodeDecodeError) as exc:
        raise EvalError(f"cannot read the training data ({exc}). Fix: check the path") from None
    leaked = leaked_rows(((r.id, r.input_value) for r in rows), seen)
    if leaked:
        raise EvalError(
            f"{leak_message(leaked)}. Fix: remove them from the eval set (or from the training data) and evaluate again"
        )


def read_predictions(text: str, *, source: str) -> dict[str, str]:
    """`{"id", "predicted"}` lines -> {id: predicted}; one prediction per id."""
    out: dict[str, str] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{source}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise EvalError(f"{where}: bad JSON in predictions ({exc.msg})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("id"), str) or not isinstance(obj.get("predicted"), str):
            raise EvalError(f'{where}: a prediction is {{"id": str, "predicted": str}}')
        if obj["id"] in out and out[obj["id"]] != obj["predicted"]:
            raise EvalError(f"{where}: id {obj['id']!r} predicted twice, differently")
        out[obj["id"]] = obj["predicted"]
    return out


def _run(
    argv: list[str], *, what: str, stdin: str | None, timeout_s: float, env: Mapping[str, str], cwd: Path | None = None
) -> str:
    try:
        done = subprocess.run(
            argv, input=stdin, capture_output=True, text=True, timeout=timeout_s, env=dict(env), check=False, cwd=cwd
        )
    except FileNotFoundError:
        raise EvalError(f"{what}: program {argv[0]!r} not found. Fix: check the command") from None
    except subprocess.TimeoutExpired:
        raise EvalError(f"{what}: still running after {timeout_s:.0f}s; stopped. Fix: raise --timeout-s") from None
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise EvalError(f"{what}: exited {done.returncode}: {tail or '(no stderr)'}")
    return done.stdout


def predict(
    spec: PredictorSpec,
    rows: Sequence[EvalRow],
    *,
    what: str,
    base_model: Path | None,
    python: str = sys.executable,
    timeout_s: float = 3600.0,
    cwd: Path | None = None,
) -> dict[str, str]:
    """Run one predictor over the eval rows; return {id: predicted}. `cwd`: where a command runs."""
    if spec.kind == "predictions":
        path = Path(spec.value)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise EvalError(f"{what}: cannot read {path} ({exc})") from None
        return read_predictions(text, source=str(path))

    payload = "".join(json.dumps(r.predictor_input(), ensure_ascii=False) + "\n" for r in rows)
    env = predictor_env(os.environ)
    if spec.kind == "command":
        argv = shlex.split(spec.value)
        if not argv:
            raise EvalError(f"{what}: empty command")
        out = _run(argv, what=what, stdin=payload, timeout_s=timeout_s, env=env, cwd=cwd)
        return read_predictions(out, source=f"{what} stdout")

    # adapter: the trainer's own model-loading code, as a program.
    if base_model is None:
        raise EvalError(f"{what}: adapter predictors need --base-model PATH")
    adapter = Path(spec.value)
    if not adapter.is_dir():
        raise EvalError(f"{what}: adapter directory {adapter} not found")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_PROJECT_ROOT), env.get("PYTHONPATH", "")) if p)
    with tempfile.TemporaryDirectory(prefix="tuneharness-gate-") as tmp:
        inp, outp = Path(tmp) / "rows.jsonl", Path(tmp) / "preds.jsonl"
        inp.write_text(payload, encoding="utf-8")
        argv = [
            python, "-m", "trainer", "predict",
            "--base-model", str(base_model), "--adapter", str(adapter),
            "--input", str(inp), "--output", str(outp),
        ]  # fmt: skip
        _run(argv, what=what, stdin=None, timeout_s=timeout_s, env=env)
        try:
            text = outp.read_text(encoding="utf-8")
        except OSError:
            raise EvalError(f"{what}: the trainer wrote no predictions file") from None
    return read_predictions(text, source=f"{what} output")


def _trial_lines(rows: Sequence[EvalRow], preds: Mapping[str, str]) -> str:
    lines = [
        json.dumps({"id": r.id, "slice": r.slice, "expected": r.expected, "predicted": preds[r.id]}, ensure_ascii=False)
        for r in sorted(rows, key=lambda r: r.id)
        if r.id in preds
    ]
    return "".join(line + "\n" for line in lines)


def write_trial(
    out: Path,
    *,
    config_path: Path,
    rows: Sequence[EvalRow],
    baseline: Mapping[str, str],
    candidates: Mapping[str, Mapping[str, str]],
    incumbent: Mapping[str, str] | None = None,
) -> Path:
    """Write a complete trial directory atomically (a temp directory renamed into place)."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise EvalError(f"{out}: already exists. Fix: a trial is a record; choose a new --out directory")
    parse_gate_config(config_path, default_model=out.name)  # refuse a bad gate.json before any work
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        shutil.copyfile(config_path, tmp / CONFIG_FILE)
        (tmp / BASELINE_FILE).write_text(_trial_lines(rows, baseline), encoding="utf-8")
        if incumbent is not None:
            (tmp / INCUMBENT_FILE).write_text(_trial_lines(rows, incumbent), encoding="utf-8")
        for seed, preds in candidates.items():
            (tmp / candidate_file(seed)).write_text(_trial_lines(rows, preds), encoding="utf-8")
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def build_trial(
    out: Path,
    *,
    config_path: Path,
    eval_paths: Sequence[Path],
    baseline: str,
    candidates: Sequence[str],
    incumbent: str | None = None,
    base_model: Path | None = None,
    timeout_s: float = 3600.0,
    python: str = sys.executable,
    progress: Callable[[str], None] = lambda _msg: None,
    cwd: Path | None = None,
    train_paths: Sequence[Path] = (),
) -> Path:
    """Parse predictor specs (`SEED=kind:value` for candidates), predict, write the trial. Eval
    rows found in `train_paths` (the training data) are refused before any predictor runs."""
    parse_gate_config(config_path, default_model=Path(out).name)
    rows = read_eval_sets(eval_paths)
    check_not_in_training(rows, train_paths)
    seeds: dict[str, PredictorSpec] = {}
    for text in candidates:
        seed, sep, spec = text.partition("=")
        if not sep or not seed:
            raise EvalError(f"--candidate {text!r}: expected SEED=adapter:DIR (or command:/predictions:)")
        if seed in seeds:
            raise EvalError(f"--candidate: seed {seed!r} given twice. Fix: one predictor per seed")
        candidate_file(seed)
        seeds[seed] = parse_spec(spec, what=f"candidate seed {seed}")
    base_spec = parse_spec(baseline, what="baseline")
    inc_spec = parse_spec(incumbent, what="incumbent") if incumbent is not None else None

    def run_one(what: str, spec: PredictorSpec) -> dict[str, str]:
        progress(f"evaluating {what}: {spec.describe()}")
        return predict(spec, rows, what=what, base_model=base_model, python=python, timeout_s=timeout_s, cwd=cwd)

    baseline_preds = run_one("baseline", base_spec)
    incumbent_preds = run_one("incumbent", inc_spec) if inc_spec is not None else None
    cand_preds = {seed: run_one(f"candidate seed {seed}", spec) for seed, spec in seeds.items()}
    return write_trial(
        out,
        config_path=config_path,
        rows=rows,
        baseline=baseline_preds,
        candidates=cand_preds,
        incumbent=incumbent_preds,
    )
