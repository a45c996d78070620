"""`python -m trainer run`: one slice of training: resume, train, checkpoint, exit.

Exit codes: 0 finished (adapter written), 3 slice cap reached and resumable, 2 job.json or
resume refused, 4 refused on a serving box, 5 no space left on device, 1 any other failure.
The reason of every failure is the last line of train.log.
"""

from __future__ import annotations

import errno
import json
import math
import os
import random
import signal
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from trainer import checkpoint as ckpt
from trainer.data import RowError, batch_indices, collate, encode_rows, label_set, read_rows, split_rows
from trainer.exitcodes import (
    EXIT_BAD_JOB,
    EXIT_CAP,
    EXIT_DISK_FULL,
    EXIT_FAILED,
    EXIT_FINISHED,
    EXIT_REFUSED,
)
from trainer.fsutil import write_bytes
from trainer.guard import serving_refusal
from trainer.jobspec import JobError, JobSpec, load_job, shape_of
from trainer.models import META_FILE, LoadedModel, load_base, wrap_for_training
from trainer.push import Pusher, PushError, load_pusher
from trainer.reporting import StatusFile, TrainLog
from trainer.simhost import hang_forever, load_hang, load_pace

__all__ = [
    "EXIT_BAD_JOB",
    "EXIT_CAP",
    "EXIT_DISK_FULL",
    "EXIT_FAILED",
    "EXIT_FINISHED",
    "EXIT_REFUSED",
    "ResumeRefused",
    "lr_factor",
    "run_job",
]


class ResumeRefused(Exception):
    """The newest checkpoint was written for a model of a different shape."""


def lr_factor(step: int, *, schedule: str, warmup_steps: int, max_steps: int) -> float:
    """Multiplier of the peak learning rate for the update that follows `step` completed steps."""
    if warmup_steps and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    span = max(1, max_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    if schedule == "linear":
        return max(0.0, 1.0 - progress)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def _rng_state() -> dict[str, Any]:
    import torch

    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    import torch

    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


class _Run:
    """The state of one slice; methods are the verbs of the loop."""

    def __init__(
        self,
        spec: JobSpec,
        log: TrainLog,
        status: StatusFile,
        *,
        started: float,
        max_seconds: float | None,
        slice_steps: int | None = None,
    ) -> None:
        self.spec = spec
        self.log = log
        self.status = status
        self.started = started
        self.wall_started = time.time() - (time.monotonic() - started)
        self.max_seconds = max_seconds
        self.slice_steps = slice_steps
        self.root = spec.job_dir / "checkpoints"
        self.step = 0
        self.trained_s = 0.0  # training seconds of earlier slices (from the checkpoint), for the time box
        self.train_t0: float | None = None
        self.last_checkpoint_step: int | None = None
        self.pusher: Pusher | None = None
        self.hang = load_hang()  # a simulated host's hang (docs/simulation.md); None on a real host
        self.pace = load_pace()  # a simulated host's training speed; None on a real host

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def trained_now_s(self) -> float:
        """Seconds spent training over all slices so far (what `time_box_s` caps)."""
        return self.trained_s + (0.0 if self.train_t0 is None else time.monotonic() - self.train_t0)

    # -- loading --------------------------------------------------------------------------
    def load(self) -> None:
        import torch

        spec = self.spec
        try:
            self.pusher = load_pusher(spec.job_dir)
        except PushError as e:
            self.log.event("push_disabled", reason=str(e))
        if spec.deterministic:
            # Before CUDA starts: cuBLAS reads its workspace size once. With both set, a GPU's own
            # kernels repeat themselves (memory-efficient attention's backward, for one, does not
            # by default), so a resumed run is bit-identical on the same GPU model and software.
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.use_deterministic_algorithms(True)
        torch.manual_seed(spec.seed)
        random.seed(spec.seed)
        rows = read_rows(spec.resolve(spec.train_file), task=spec.task)
        self.labels = label_set(rows) if spec.task == "classification" else None
        train_idx, val_idx = split_rows(len(rows), fraction=spec.val_fraction, seed=spec.val_seed)
        val_rows = [rows[i] for i in val_idx]
        rows = [rows[i] for i in train_idx]
        self.root.mkdir(parents=True, exist_ok=True)
        ckpt.clean_stale(self.root)

        def skipped(c: ckpt.Checkpoint, why: str) -> None:
            self.log.event("checkpoint_skipped", step=c.step, reason=why)

        latest = ckpt.find_latest(self.root, on_skip=skipped)
        if latest is not None:
            self._check_shape(latest)
        self.loaded: LoadedModel = load_base(
            spec.resolve(spec.base_model), task=spec.task, quantization=spec.quantization, labels=self.labels
        )
        wrap_for_training(
            self.loaded,
            r=spec.lora.r,
            alpha=spec.lora.alpha,
            dropout=spec.lora.dropout,
            target_modules=list(spec.lora.target_modules),
            quantization=spec.quantization,
        )
        tok = self.loaded.tokenizer
        self.encoded = encode_rows(rows, tok, task=spec.task, max_seq_len=spec.max_seq_len, labels=self.labels)
        self.val_encoded = encode_rows(val_rows, tok, task=spec.task, max_seq_len=spec.max_seq_len, labels=self.labels)
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
        model = self.loaded.model
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=spec.learning_rate, weight_decay=spec.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lambda s: lr_factor(s, schedule=spec.lr_schedule, warmup_steps=spec.warmup_steps, max_steps=spec.max_steps),
        )
        if latest is not None:
            self._restore(latest)

    def _check_shape(self, latest: ckpt.Checkpoint) -> None:
        saved_job = json.loads((latest.path / "job.json").read_text())
        labels_path = latest.path / "labels.json"
        saved_labels = json.loads(labels_path.read_text()) if labels_path.is_file() else None
        old = shape_of(saved_job, saved_labels)
        new = shape_of(self.spec.to_json(), self.labels)
        changed = [k for k in new if old.get(k) != new[k]]
        if changed:
            detail = "; ".join(f"{k}: {old.get(k)!r} -> {new[k]!r}" for k in changed)
            raise ResumeRefused(
                f"checkpoint {latest.path.name} was written for a model of another shape ({detail}). "
                "Fix: restore the job's original fields, or start a new job directory"
            )
        others = [k for k in self.spec.to_json() if k != "lora" and saved_job.get(k) != self.spec.to_json()[k]]
        if others:
            self.log.event("config_changed", fields=",".join(others))

    def _restore(self, latest: ckpt.Checkpoint) -> None:
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        t0 = time.perf_counter()
        weights = load_file(latest.path / "adapter" / "adapter_model.safetensors")
        model = self.loaded.model
        from peft import get_peft_model_state_dict

        expected = {k: tuple(v.shape) for k, v in get_peft_model_state_dict(model).items()}
        got = {k: tuple(v.shape) for k, v in weights.items()}
        if expected != got:
            raise ResumeRefused(
                f"checkpoint {latest.path.name} holds adapter tensors of other names or shapes. "
                "Fix: start a new job directory"
            )
        set_peft_model_state_dict(model, weights)
        state = ckpt.read_state(latest.path / "trainer_state.pt")
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        _set_rng_state(state["rng"])
        self.step = int(state["step"])
        self.trained_s = float(state.get("trained_s", 0.0))
        self.last_checkpoint_step = self.step
        self.log.event("resume", step=self.step, checkpoint=latest.path.name, load_s=round(time.perf_counter() - t0, 4))

    # -- training ---------------------------------------------------------------------------
    def train(self) -> int:
        import torch

        spec = self.spec
        model = self.loaded.model
        model.train()
        per_step = spec.batch_size * spec.grad_accum
        self.status.update(phase="training", step=self.step, last_checkpoint_step=self.last_checkpoint_step)
        window_t, window_tokens, window_samples = time.perf_counter(), 0, 0
        first_step = self.step
        if self.pace is not None:  # a simulated host starts up in the time the marketplace says
            self.pace.wait_start(since_wall=self.wall_started)
        paced_since = time.time()
        self.train_t0 = time.monotonic()
        boxed = False
        while self.step < spec.max_steps:
            if self.hang is not None and self.hang.hung():
                hang_forever()  # as a process stuck in a collective: alive, silent, no progress
            if spec.time_box_s is not None and self.trained_now_s() >= spec.time_box_s:
                boxed = True
                break
            if self.max_seconds is not None and self.elapsed_s() >= self.max_seconds:
                break
            if self.slice_steps is not None and self.step - first_step >= self.slice_steps:
                break
            if _STOP.is_set():
                self.log.event("stop_requested", step=self.step, signal="SIGTERM")
                break
            idx = batch_indices(seed=spec.seed, step=self.step, per_step=per_step, n_rows=len(self.encoded))
            loss_sum = 0.0
            for m in range(spec.grad_accum):
                items = [self.encoded[i] for i in idx[m * spec.batch_size : (m + 1) * spec.batch_size]]
                batch = {
                    k: v.to(self.loaded.device) for k, v in collate(items, pad_id=self.pad_id, task=spec.task).items()
                }
                out = model(**batch)
                loss = out.loss / spec.grad_accum
                loss.backward()
                loss_sum += float(loss.detach())
                window_tokens += int(batch["attention_mask"].sum())
            window_samples += per_step
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, spec.max_grad_norm))
            lr = self.optimizer.param_groups[0]["lr"]
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.step += 1
            if self.pace is not None:  # a simulated host: a step takes what the trace says it takes
                self.pace.wait(steps=self.step - first_step, since_wall=paced_since)
            if not math.isfinite(loss_sum):
                raise FloatingPointError(f"loss is {loss_sum} at step {self.step}")
            if self.step % spec.log_every == 0 or self.step == spec.max_steps:
                dt = max(time.perf_counter() - window_t, 1e-9)
                tok_s, smp_s = window_tokens / dt, window_samples / dt
                self.log.event(
                    "step",
                    step=self.step,
                    max_steps=spec.max_steps,
                    loss=round(loss_sum, 6),
                    lr=lr,
                    grad_norm=round(grad_norm, 6),
                    tokens_per_s=round(tok_s, 1),
                    samples_per_s=round(smp_s, 2),
                    elapsed_s=round(self.elapsed_s(), 3),
                    durable=False,
                )
                self.status.set(
                    step=self.step, loss=loss_sum, tokens_per_s=round(tok_s, 1), samples_per_s=round(smp_s, 2)
                )
                window_t, window_tokens, window_samples = time.perf_counter(), 0, 0
            if self.step % spec.checkpoint_every == 0 or self.step == spec.max_steps:
                self.save_checkpoint()
        if boxed:
            self.log.event(
                "time_box",
                step=self.step,
                time_box_s=spec.time_box_s,
                trained_s=round(self.trained_now_s(), 3),
                elapsed_s=round(self.elapsed_s(), 3),
            )
        elif self.step < spec.max_steps:
            if self.last_checkpoint_step != self.step:
                self.save_checkpoint()
            self.log.event("cap", step=self.step, max_steps=spec.max_steps, elapsed_s=round(self.elapsed_s(), 3))
            self.status.update(phase="training", step=self.step, exit_code=EXIT_CAP)
            return EXIT_CAP
        self.finish()
        return EXIT_FINISHED

    def save_checkpoint(self) -> None:
        spec = self.spec
        self.status.update(phase="checkpointing", step=self.step)
        t0 = time.perf_counter()
        state = {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": _rng_state(),
            "step": self.step,
            "data_position": self.step,
            "trained_s": self.trained_now_s(),
        }

        def fill(tmp: Path) -> None:
            ckpt.write_adapter(self.loaded.model, tmp / "adapter")
            ckpt.write_state(tmp / "trainer_state.pt", state)
            write_bytes(tmp / "job.json", json.dumps(spec.to_json(), indent=1, sort_keys=True).encode())
            if self.labels is not None:
                write_bytes(tmp / "labels.json", json.dumps(self.labels).encode())

        final = self.root / ckpt.checkpoint_name(self.step)
        ckpt.write_dir_atomically(final, fill, marker={"step": self.step, "kind": "checkpoint"})
        self.last_checkpoint_step = self.step
        removed = ckpt.prune(self.root, keep=spec.keep_checkpoints)
        self.log.event(
            "checkpoint",
            step=self.step,
            dir=final.name,
            save_s=round(time.perf_counter() - t0, 4),
            pruned=",".join(c.path.name for c in removed) or "-",
        )
        self.status.update(phase="training", last_checkpoint_step=self.step)
        self.push(final, f"checkpoints/{final.name}")

    def push(self, local: Path, rel: str) -> None:
        """Push mode: upload a complete directory; a failure is logged, never fatal."""
        if self.pusher is None:
            return
        t0 = time.perf_counter()
        try:
            sent = self.pusher.push_dir(local, rel)
        except (PushError, OSError) as e:
            self.log.event("push_failed", dir=rel, reason=str(e))
            return
        self.log.event("pushed", dir=rel, bytes=sent, push_s=round(time.perf_counter() - t0, 4))

    def finish(self) -> None:
        spec = self.spec
        self.status.update(phase="checkpointing", step=self.step)
        meta: dict[str, Any] = {
            "task": spec.task,
            "labels": self.labels,
            "quantization": spec.quantization,
            "base_model": spec.base_model,
            "base_model_path": str(spec.resolve(spec.base_model).resolve()),
            "max_seq_len": spec.max_seq_len,
            "steps": self.step,
            "seed": spec.seed,
        }
        if self.val_encoded:
            val = self.validate()
            meta.update(val_loss=val["val_loss"], val_rows=val["val_rows"], trained_s=round(self.trained_now_s(), 3))
            self.log.event("val", step=self.step, val_loss=val["val_loss"], val_rows=int(val["val_rows"]))
            self.status.update(val_loss=val["val_loss"], val_rows=int(val["val_rows"]))

        def fill(tmp: Path) -> None:
            ckpt.write_adapter(self.loaded.model, tmp)
            write_bytes(tmp / META_FILE, json.dumps(meta, indent=1, sort_keys=True).encode())
            if self.labels is not None:
                write_bytes(tmp / "labels.json", json.dumps(self.labels).encode())

        ckpt.write_dir_atomically(spec.job_dir / "adapter", fill, marker={"step": self.step, "kind": "adapter"})
        self.log.event("adapter", step=self.step, dir="adapter")
        self.push(spec.job_dir / "adapter", "adapter")
        result = self.evaluate() if spec.eval_file else None
        if result is not None:
            metrics: dict[str, Any] = dict(result)
            self.log.event("eval", step=self.step, **metrics)
        self.log.event("finished", step=self.step, max_steps=spec.max_steps, elapsed_s=round(self.elapsed_s(), 3))
        self.status.update(phase="finished", step=self.step, eval=result, exit_code=EXIT_FINISHED)

    def validate(self) -> dict[str, float]:
        """Loss on the held-out split (`val_fraction`), per target token (per row for classification),
        in fixed batches of 8 so that the number does not depend on the training batch size."""
        import torch

        spec = self.spec
        model = self.loaded.model
        was_training = model.training
        model.eval()
        total, weight = 0.0, 0
        with torch.no_grad():
            for i in range(0, len(self.val_encoded), 8):
                items = self.val_encoded[i : i + 8]
                batch = {
                    k: v.to(self.loaded.device) for k, v in collate(items, pad_id=self.pad_id, task=spec.task).items()
                }
                out = model(**batch)
                n = len(items) if spec.task == "classification" else int((batch["labels"][:, 1:] != -100).sum())
                total += float(out.loss) * n
                weight += n
        if was_training:
            model.train()
        return {"val_loss": round(total / max(1, weight), 6), "val_rows": float(len(self.val_encoded))}

    def evaluate(self) -> dict[str, float]:
        """Mean loss (and accuracy for classification) on eval_file; after the adapter is final."""
        import torch

        spec = self.spec
        assert spec.eval_file is not None
        rows = read_rows(spec.resolve(spec.eval_file), task=spec.task)
        if self.labels is not None:
            rows = [r for r in rows if r["label"] in self.labels]
        enc = encode_rows(rows, self.loaded.tokenizer, task=spec.task, max_seq_len=spec.max_seq_len, labels=self.labels)
        model = self.loaded.model
        model.eval()
        losses, correct = [], 0
        with torch.no_grad():
            for i in range(0, len(enc), spec.batch_size):
                items = enc[i : i + spec.batch_size]
                batch = {
                    k: v.to(self.loaded.device) for k, v in collate(items, pad_id=self.pad_id, task=spec.task).items()
                }
                out = model(**batch)
                losses.append(float(out.loss) * len(items))
                if spec.task == "classification":
                    correct += int((out.logits.argmax(-1) == batch["labels"]).sum())
        result = {"eval_loss": round(sum(losses) / max(1, len(enc)), 6), "eval_rows": float(len(enc))}
        if spec.task == "classification":
            result["eval_accuracy"] = round(correct / max(1, len(enc)), 6)
        return result


def _is_disk_full(exc: BaseException) -> bool:
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return False


_STOP = threading.Event()


def _on_sigterm(signum: int, frame: Any) -> None:
    _STOP.set()


def run_job(job_dir: Path, *, max_seconds: float | None = None, slice_steps: int | None = None) -> int:
    """Run one slice of the job in `job_dir`; return the process exit code.

    SIGTERM (what marketplaces send before stopping a container) ends the slice like the cap:
    at the next step boundary, after a checkpoint, exit 3.
    """
    started = time.monotonic()
    _STOP.clear()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)
        # `trainer slices` forks this slice with SIGTERM blocked until the handler is in place
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    job_dir = Path(job_dir)
    refusal = serving_refusal()
    if not job_dir.is_dir():
        print(f"trainer: job directory {job_dir} does not exist", flush=True)
        return EXIT_BAD_JOB
    log = TrainLog(job_dir / "train.log")
    status: StatusFile | None = None
    try:
        if refusal is not None:
            return _fail(log, None, EXIT_REFUSED, refusal)
        if _is_command_job(job_dir):  # the user's own training under the same protocol (trainer/command.py)
            from trainer.command import run_command_job

            return run_command_job(
                job_dir, log, started=started, max_seconds=max_seconds, slice_steps=slice_steps, stop=_STOP
            )
        try:
            spec = load_job(job_dir)
        except JobError as e:
            return _fail(log, None, EXIT_BAD_JOB, f"{e}. Fix: correct job.json")
        status = StatusFile(job_dir / "status.json", max_steps=spec.max_steps, every_s=spec.status_every_s)
        status.start()
        log.event(
            "start",
            pid=os.getpid(),
            task=spec.task,
            quantization=spec.quantization,
            max_steps=spec.max_steps,
            max_seconds=max_seconds if max_seconds is not None else "-",
            deterministic=str(spec.deterministic).lower(),
        )
        run = _Run(spec, log, status, started=started, max_seconds=max_seconds, slice_steps=slice_steps)
        try:
            run.load()
            return run.train()
        except ResumeRefused as e:
            return _fail(log, status, EXIT_BAD_JOB, str(e))
        except RowError as e:
            return _fail(log, status, EXIT_BAD_JOB, f"bad data: {e}")
        except Exception as e:
            log.raw(traceback.format_exc())
            code = EXIT_DISK_FULL if _is_disk_full(e) else EXIT_FAILED
            return _fail(log, status, code, f"{type(e).__name__}: {e}", step=run.step)
    finally:
        if status is not None:
            status.stop()
        log.close()


def _is_command_job(job_dir: Path) -> bool:
    """job.json says `kind: command` (an unreadable one is load_job's to refuse)."""
    try:
        raw = json.loads((job_dir / "job.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(raw, dict) and raw.get("kind") == "command"


def _fail(log: TrainLog, status: StatusFile | None, code: int, reason: str, *, step: int | None = None) -> int:
    print(f"trainer: {reason}", flush=True)
    if status is not None:
        try:
            status.update(phase="failed", error=reason, exit_code=code)
        except OSError:
            pass
    try:
        log.event("failed", exit_code=code, step=step if step is not None else "-", reason=reason)
    except OSError:
        pass
    return code
