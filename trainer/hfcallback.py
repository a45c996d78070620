"""The slice protocol inside a `transformers.Trainer` run (plain Trainer, TRL, axolotl), injected
by `trainer run` for a `command` job of `stack: trainer` without the user editing their script.

How it gets in: `trainer run` starts the user's command with a directory first on PYTHONPATH
that holds a generated `sitecustomize.py`; Python imports it at start-up (every process,
`accelerate launch` ranks included). It loads this file by path (so a user module named
`trainer` cannot shadow it), calls `install()`, then runs any other `sitecustomize` the
interpreter would have run. `install()` adds an import hook that patches `transformers.Trainer`
once `transformers.trainer` is imported:

- `Trainer.__init__` adds `SliceCallback` (once);
- `Trainer.train` resumes from `TUNEHARNESS_RESUME_FROM` (the newest complete checkpoint
  `trainer run` chose) whatever the script passes as `resume_from_checkpoint`.

`SliceCallback`:
- after each optimizer step writes `command/progress.json` (step, max steps, loss) and a `step`
  line in train.log (loss, lr and grad_norm on the steps the Trainer logs);
- at the slice's cap (`TUNEHARNESS_DEADLINE_WALL`, `TUNEHARNESS_HOOK_SLICE_STEPS`, or the file
  `command/stop` that `trainer run` writes on SIGTERM) asks the Trainer to save and stop, so the
  slice ends on a complete checkpoint; the process then ends with exit 3 in `on_train_end`;
- after every save, copies the Trainer's `checkpoint-N` into `checkpoints/step-0000000N/` with a
  `COMPLETE` manifest (the built-in trainer's format) once its `trainer_state.json` and every
  weight file are there, and keeps the newest K;
- at the end of a finished run writes the final model (`save_pretrained`: a PEFT adapter or the
  whole model) into `adapter/` the same way, with `trainer_meta.json`, and `command/outcome.json`.

Only the main process writes files. Standard library at import; transformers when the script
imports it. The manifest format is checked against `trainer.checkpoint.verify` by a test.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.util
import json
import os
import shutil
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["install", "is_complete_trainer_checkpoint"]

ENV_JOB_DIR = "TUNEHARNESS_JOB_DIR"
ENV_DEADLINE = "TUNEHARNESS_DEADLINE_WALL"
ENV_SLICE_STEPS = "TUNEHARNESS_HOOK_SLICE_STEPS"
ENV_RESUME = "TUNEHARNESS_RESUME_FROM"
ENV_KEEP = "TUNEHARNESS_KEEP_CHECKPOINTS"
ENV_META = "TUNEHARNESS_ADAPTER_META"
STOP_FILE = "command/stop"
PROGRESS_FILE = "command/progress.json"
OUTCOME_FILE = "command/outcome.json"
EXIT_CAP = 3
_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin", "model.safetensors", "pytorch_model.bin")
_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
_STARTED = time.monotonic()


# -- files -------------------------------------------------------------------------------------
def _stamp() -> str:
    dt = datetime.now(UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def _value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}" if abs(v) >= 1e-3 or v == 0 else f"{v:.3e}"
    s = str(v)
    return json.dumps(" ".join(s.split())) if not s or any(c.isspace() or c in '"=' for c in s) else s


def _log(job_dir: Path, event: str, **fields: Any) -> None:
    """One train.log line (the format of docs/trainer.md), appended whole."""
    line = " ".join([_stamp(), event] + [f"{k}={_value(v)}" for k, v in fields.items() if v is not None]) + "\n"
    with open(job_dir / "train.log", "a", encoding="utf-8") as fh:
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _publish(final: Path, fill: Any, *, marker: dict[str, Any]) -> None:
    """Build `final` in a temp sibling, fsync every file, write the COMPLETE manifest last, rename."""
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        fill(tmp)
        files: dict[str, dict[str, Any]] = {}
        for dirpath, _dirs, names in os.walk(tmp):
            for name in sorted(names):
                p = Path(dirpath) / name
                _fsync_file(p)
                files[p.relative_to(tmp).as_posix()] = {"size": p.stat().st_size, "sha256": _sha256(p)}
        body = dict(marker, format=1, files=files)
        with open(tmp / "COMPLETE", "w", encoding="utf-8") as fh:
            fh.write(json.dumps(body, sort_keys=True, indent=1) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        _fsync_dir(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(final.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def is_complete_trainer_checkpoint(path: Path) -> bool:
    """A Trainer checkpoint is complete when its state file and every weight file are there."""
    if not (path / "trainer_state.json").is_file():
        return False
    for index in _INDEXES:
        if (path / index).is_file():
            try:
                shards = set(json.loads((path / index).read_text())["weight_map"].values())
            except (OSError, ValueError, KeyError, TypeError):
                return False
            return all((path / s).is_file() for s in shards)
    return any((path / w).is_file() for w in _WEIGHTS)


def _prune(root: Path, keep: int) -> list[str]:
    done = sorted((p for p in root.glob("step-*") if (p / "COMPLETE").is_file()), reverse=True)
    removed = []
    for p in done[keep:]:
        trash = p.with_name(f".trash-{p.name}-{os.getpid()}")
        os.replace(p, trash)
        shutil.rmtree(trash, ignore_errors=True)
        removed.append(p.name)
    return removed


# -- the callback ------------------------------------------------------------------------------
def _make_callback_class(trainer_callback: type) -> type:
    class SliceCallback(trainer_callback):  # type: ignore[misc]
        """Status, the slice's cap as save-and-stop, checkpoints with manifests, the final model."""

        def __init__(self, job_dir: Path) -> None:
            self.job_dir = job_dir
            raw_deadline = os.environ.get(ENV_DEADLINE)
            self.deadline = float(raw_deadline) if raw_deadline else None
            raw_steps = os.environ.get(ENV_SLICE_STEPS)
            self.slice_steps = int(raw_steps) if raw_steps else None
            self.keep = int(os.environ.get(ENV_KEEP) or 3)
            self.first_step = 0
            self.capping = False
            self.loss: float | None = None
            self.last_checkpoint_step: int | None = None

        def _main(self, state: Any) -> bool:
            return bool(state.is_world_process_zero)

        def _progress(self, state: Any, phase: str) -> None:
            if self._main(state):
                _write_json(
                    self.job_dir / PROGRESS_FILE,
                    {
                        "step": state.global_step,
                        "max_steps": state.max_steps,
                        "loss": self.loss,
                        "phase": phase,
                        "last_checkpoint_step": self.last_checkpoint_step,
                    },
                )

        def _cap_reached(self, args: Any, state: Any) -> bool:
            local = (
                (self.deadline is not None and time.time() >= self.deadline)
                or (self.slice_steps is not None and state.global_step - self.first_step >= self.slice_steps)
                or (self.job_dir / STOP_FILE).exists()
            )
            try:
                import torch.distributed as dist

                if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
                    import torch

                    flag = torch.tensor([1.0 if local else 0.0], device=args.device)
                    dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # every rank stops at the same step
                    return bool(flag.item() > 0)
            except ImportError:
                pass
            return local

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
            self.first_step = state.global_step
            self._progress(state, "training")
            return control

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
            if not control.should_log and self._main(state):  # a logged step gets its line in on_log
                _log(
                    self.job_dir,
                    "step",
                    step=state.global_step,
                    max_steps=state.max_steps,
                    elapsed_s=round(time.monotonic() - _STARTED, 3),
                )
            if state.global_step < state.max_steps and self._cap_reached(args, state):
                control.should_save = True  # the Trainer saves this step, then on_save stops it
                self.capping = True
            self._progress(state, "training")
            return control

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any) -> Any:
            logs = logs or {}
            if "loss" in logs and self._main(state):
                self.loss = float(logs["loss"])
                _log(
                    self.job_dir,
                    "step",
                    step=state.global_step,
                    max_steps=state.max_steps,
                    loss=self.loss,
                    lr=logs.get("learning_rate"),
                    grad_norm=logs.get("grad_norm"),
                    elapsed_s=round(time.monotonic() - _STARTED, 3),
                )
                self._progress(state, "training")
            return control

        def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
            if self._main(state):
                src = Path(args.output_dir) / f"checkpoint-{state.global_step}"
                if is_complete_trainer_checkpoint(src):
                    self._snapshot(src, state.global_step)
                    self._progress(state, "training")
            if self.capping:
                control.should_training_stop = True  # after the save: the saved control never says stop
            return control

        def _snapshot(self, src: Path, step: int) -> None:
            t0 = time.monotonic()
            root = self.job_dir / "checkpoints"
            root.mkdir(parents=True, exist_ok=True)
            final = root / f"step-{step:08d}"

            def fill(tmp: Path) -> None:
                shutil.copytree(src, tmp, dirs_exist_ok=True)

            _publish(final, fill, marker={"step": step, "kind": "checkpoint", "stack": "trainer"})
            self.last_checkpoint_step = step
            pruned = _prune(root, self.keep)
            _log(
                self.job_dir,
                "checkpoint",
                step=step,
                dir=final.name,
                save_s=round(time.monotonic() - t0, 4),
                pruned=",".join(pruned) or "-",
            )

        def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
            if self.capping:
                if self._main(state):
                    _write_json(self.job_dir / OUTCOME_FILE, {"outcome": "cap", "step": state.global_step})
                for stream in (sys.stdout, sys.stderr):
                    try:
                        stream.flush()
                    except (OSError, ValueError):
                        pass
                os._exit(EXIT_CAP)  # the slice ends here: nothing after train() runs on a partial model
            if self._main(state):
                self._final(kw.get("model"), kw.get("processing_class") or kw.get("tokenizer"), state)
                _write_json(self.job_dir / OUTCOME_FILE, {"outcome": "finished", "step": state.global_step})
            return control

        def _final(self, model: Any, tokenizer: Any, state: Any) -> None:
            meta: dict[str, Any] = {"steps": state.global_step, "stack": "trainer"}
            extra = os.environ.get(ENV_META)
            if extra:
                meta.update(json.loads(extra))
            peft_config = getattr(model, "peft_config", None)
            if isinstance(peft_config, dict) and "default" in peft_config and "base_model_path" not in meta:
                base = getattr(peft_config["default"], "base_model_name_or_path", None)
                if base:
                    meta["base_model_path"] = str(Path(base).resolve()) if Path(base).is_dir() else base

            def fill(tmp: Path) -> None:
                model.save_pretrained(str(tmp))
                if tokenizer is not None and peft_config is None and hasattr(tokenizer, "save_pretrained"):
                    tokenizer.save_pretrained(str(tmp))
                (tmp / "trainer_meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True))

            _publish(self.job_dir / "adapter", fill, marker={"step": state.global_step, "kind": "adapter"})
            _log(self.job_dir, "adapter", step=state.global_step, dir="adapter")

    return SliceCallback


# -- the patch ---------------------------------------------------------------------------------
def _patch(module: Any) -> None:
    trainer_cls = module.Trainer
    if getattr(trainer_cls, "_tuneharness_patched", False):
        return
    from transformers.trainer_callback import TrainerCallback

    callback_cls = _make_callback_class(TrainerCallback)
    job_dir = Path(os.environ[ENV_JOB_DIR])
    original_init = trainer_cls.__init__
    original_train = trainer_cls.train

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        if not any(isinstance(cb, callback_cls) for cb in self.callback_handler.callbacks):
            self.add_callback(callback_cls(job_dir))

    def train(self: Any, resume_from_checkpoint: Any = None, *args: Any, **kwargs: Any) -> Any:
        chosen = os.environ.get(ENV_RESUME) or None  # what trainer run verified; the script's choice yields
        return original_train(self, chosen, *args, **kwargs)

    __init__.__doc__, train.__doc__ = original_init.__doc__, original_train.__doc__
    trainer_cls.__init__ = __init__
    trainer_cls.train = train
    trainer_cls._tuneharness_patched = True


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def create_module(self, spec: Any) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.inner.exec_module(module)
        _patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "transformers.trainer":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def install() -> None:
    """Patch `transformers.Trainer` now if imported, else as soon as it is; no-op outside a job."""
    if not os.environ.get(ENV_JOB_DIR):
        return
    if "transformers.trainer" in sys.modules:
        _patch(sys.modules["transformers.trainer"])
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
