"""The labelled corpus of train.log tails: a seeded generator plus hand-written excerpts.

`build(seed)` returns rows `{"id", "log", "idle_seconds", "state", "framework", "split"}`:

- `train` / `eval`: tails in the formats of HF Trainer, accelerate, DeepSpeed, torchrun/DDP,
  axolotl, unsloth, LLaMA-Factory, nanoGPT, plain scripts and this project's own trainer;
- `ood`: formats never seen in train (Megatron-LM and PyTorch Lightning progress, completion and
  wrapper lines), so a model that memorised framework chrome is caught;
- `handwritten`: excerpts in `data/triage/handwritten.txt`, modelled on how real failures print.

Numbers, paths, model names, ranks and warnings vary per row; progress bars are written with
carriage returns and ANSI colours in a share of rows, as real logs are. Stdlib only.

The labelled data (the committed corpus, the hand-written excerpts, the real excerpts and the
specialist's gate trial) lives in the repository under `DATA_DIR` (`<repo>/data/triage/`), not in
the installed package: `data_file` raises `TriageDataMissing` (one line: what is missing, the fix)
where it is absent.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from app.errors import UserError
from app.triage.rules import STATES

__all__ = [
    "DATA_DIR",
    "FRAMEWORKS_OOD",
    "FRAMEWORKS_TRAIN",
    "REAL_BATCHES",
    "REAL_SPLITS",
    "TriageDataMissing",
    "build",
    "data_file",
    "handwritten",
    "real_rows",
    "write_corpus",
]

# The one place the labelled triage data is found: `data/triage/` at the repository's root
# (real/, corpus/, handwritten.txt, log_doctor_trial/; data/triage/README.md describes each).
DATA_DIR = Path(__file__).resolve().parents[2] / "data" / "triage"


class TriageDataMissing(UserError):
    """The labelled triage data is not on this machine (an installed package without the repository)."""


def data_file(*parts: str) -> Path:
    """`DATA_DIR / parts`, which must exist; otherwise `TriageDataMissing` names it and the fix."""
    path = DATA_DIR.joinpath(*parts)
    if not path.exists():
        raise TriageDataMissing(
            f"triage data missing: {path} (the real excerpts, the corpus and the gate trial live in the "
            "repository's data/triage/, not in the installed package). "
            "Fix: run this from a clone of the repository (pip install -e .)"
        )
    return path


FRAMEWORKS_TRAIN = (
    "hf",
    "accelerate",
    "deepspeed",
    "torchrun",
    "axolotl",
    "unsloth",
    "llamafactory",
    "nanogpt",
    "plain",
    "tuneharness",
)
FRAMEWORKS_OOD = ("megatron", "lightning")  # plus "custom": scripts' own words, see _CUSTOM

Rng = random.Random
Lines = list[str]

_MODELS = (
    "meta-llama/Llama-3.1-8B-Instruct",
    "Qwen/Qwen2.5-7B-Instruct",
    "mistralai/Mistral-7B-v0.3",
    "google/gemma-2-9b-it",
    "microsoft/Phi-3.5-mini-instruct",
    "Qwen/Qwen3-4B",
    "unsloth/llama-3-8b-bnb-4bit",
    "TinyLlama/TinyLlama-1.1B-Chat-v1.0",
    "EleutherAI/pythia-1.4b",
)
_DIRS = ("/workspace", "/root", "/home/ubuntu/ft", "/mnt/data/run", "/app", "/opt/train", "/data/jobs/j-8f2a")
_PY = (
    "/usr/local/lib/python3.10/dist-packages",
    "/opt/conda/lib/python3.11/site-packages",
    "/root/.venv/lib/python3.12/site-packages",
    "/usr/lib/python3/dist-packages",
)
_GPUS = (
    "NVIDIA GeForce RTX 3090",
    "NVIDIA GeForce RTX 4090",
    "NVIDIA A100-SXM4-80GB",
    "NVIDIA H100 80GB HBM3",
    "NVIDIA RTX A6000",
    "NVIDIA L40S",
    "Tesla V100-SXM2-32GB",
)


def _ts(r: Rng) -> str:
    return f"2024-{r.randint(1, 12):02d}-{r.randint(1, 28):02d} {r.randint(0, 23):02d}:{r.randint(0, 59):02d}:{r.randint(0, 59):02d}"


def _py(r: Rng) -> str:
    return r.choice(_PY)


def _script(r: Rng) -> str:
    return f"{r.choice(_DIRS)}/{r.choice(('train.py', 'finetune.py', 'sft.py', 'run_clm.py', 'train_lora.py'))}"


def _frames(r: Rng, n: int | None = None) -> Lines:
    py = _py(r)
    pool = [
        (f"{py}/transformers/trainer.py", "train", "return inner_training_loop("),
        (f"{py}/transformers/trainer.py", "_inner_training_loop", "tr_loss_step = self.training_step(model, inputs)"),
        (f"{py}/accelerate/accelerator.py", "backward", "loss.backward(**kwargs)"),
        (f"{py}/torch/_tensor.py", "backward", "torch.autograd.backward("),
        (f"{py}/torch/nn/modules/module.py", "_call_impl", "return forward_call(*args, **kwargs)"),
        (f"{py}/peft/peft_model.py", "forward", "return self.base_model("),
        (f"{py}/deepspeed/runtime/engine.py", "step", "self._take_model_step(lr_kwargs)"),
        (f"{py}/datasets/arrow_dataset.py", "map", "for rank, done, content in Dataset._map_single(**dataset_kwargs):"),
    ]
    out = [
        "Traceback (most recent call last):",
        f'  File "{_script(r)}", line {r.randint(20, 400)}, in <module>',
        "    main()",
    ]
    for f, fn, code in r.sample(pool, n if n is not None else r.randint(1, 4)):
        out += [f'  File "{f}", line {r.randint(100, 3000)}, in {fn}', f"    {code}"]
    return out


# ------------------------------------------------------------------ noise and progress


def _warnings(r: Rng) -> Lines:
    py = _py(r)
    pool = [
        f"{py}/torch/utils/checkpoint.py:{r.randint(60, 500)}: UserWarning: torch.utils.checkpoint: the use_reentrant parameter should be passed explicitly.",
        "`use_cache=True` is incompatible with gradient checkpointing. Setting `use_cache=False`.",
        f"Token indices sequence length is longer than the specified maximum sequence length for this model ({r.randint(2049, 9000)} > 2048). Running this sequence through the model will result in indexing errors",
        "huggingface/tokenizers: The current process just got forked, after parallelism has already been used. Disabling parallelism to avoid deadlocks...",
        "NCCL INFO NET/IB : No device found.",
        f"[W{r.randint(100, 999)} {_ts(r)[11:]} ProcessGroupNCCL.cpp:{r.randint(1000, 5000)}] Warning: TORCH_NCCL_AVOID_RECORD_STREAMS=1 has no effect for point-to-point collectives.",
        f"{py}/bitsandbytes/nn/modules.py:{r.randint(300, 500)}: UserWarning: Input type into Linear4bit is torch.float16, but bnb_4bit_compute_dtype=torch.float32 (default). This will lead to slow inference or training speed.",
        "Some weights of the model checkpoint were not used when initializing the model. You should probably TRAIN this model on a down-stream task.",
        f"{py}/torch/amp/grad_scaler.py:132: FutureWarning: `torch.cuda.amp.GradScaler(args...)` is deprecated.",
        "wandb: WARNING Serializing object of type dict that is 1212 bytes",
        f"[WARNING] [stage3.py:{r.randint(1900, 2200)}:step] {r.randint(1, 9)} pytorch allocator cache flushes since last step. this happens when there is high memory pressure and is detrimental to performance.",
        "Could not estimate the number of tokens of the input, floating-point operations will not be computed",
        "Detected kernel version 5.4.0, which is below the recommended minimum of 5.5.0; this can cause the process to hang. It is recommended to upgrade the kernel to the minimum version or higher.",
        "max_steps is given, it will override any value given in num_train_epochs",
        f"Loading checkpoint shards: 100%|██████████| {r.randint(2, 8)}/{r.randint(2, 8)} [00:{r.randint(10, 59)}<00:00,  {r.uniform(1, 9):.2f}s/it]",
    ]
    return r.sample(pool, r.randint(0, 4))


def _bar(r: Rng, step: int, total: int, *, prefix: str = "", unit: str = "it") -> str:
    pct = int(100 * step / max(total, 1))
    filled = pct // 10
    bar = "█" * filled + (r.choice("▏▎▍▌▋▊▉") if filled < 10 else "") + " " * max(0, 9 - filled)
    rate = f"{r.uniform(0.3, 9.9):.2f}s/{unit}" if r.random() < 0.6 else f"{r.uniform(1, 30):.2f}{unit}/s"
    return f"{prefix}{pct:3d}%|{bar}| {step}/{total} [{r.randint(0, 59):02d}:{r.randint(0, 59):02d}<{r.randint(0, 59):02d}:{r.randint(0, 59):02d}, {rate}]"


def _loss_curve(r: Rng, n: int) -> list[float]:
    v = r.uniform(1.0, 3.5)
    out = []
    for _ in range(n):
        v = max(0.05, v * r.uniform(0.94, 1.02))
        out.append(v)
    return out


class _Fmt:
    """A framework's chrome: preamble, one progress line, completion lines, post-crash wrapper."""

    name = "base"

    def preamble(self, r: Rng) -> Lines:
        return []

    def progress(self, r: Rng, step: int, total: int, loss: float) -> Lines:
        return [_bar(r, step, total)]

    def completed(self, r: Rng, total: int) -> Lines:
        return ["Training complete."]

    def wrapper(self, r: Rng) -> Lines:
        return []


class _HF(_Fmt):
    name = "hf"

    def preamble(self, r: Rng) -> Lines:
        n = r.randint(1000, 200000)
        return [
            "***** Running training *****",
            f"  Num examples = {n:,}",
            f"  Num Epochs = {r.randint(1, 5)}",
            f"  Instantaneous batch size per device = {r.choice((1, 2, 4, 8, 16))}",
            f"  Total optimization steps = {r.randint(100, 20000):,}",
            f"  Number of trainable parameters = {r.randint(1, 90) * 1048576:,}",
        ]

    def progress(self, r: Rng, step: int, total: int, loss: float) -> Lines:
        out = []
        if r.random() < 0.6:
            out.append(
                f"{{'loss': {loss:.4f}, 'grad_norm': {r.uniform(0.1, 4):.4f}, 'learning_rate': {r.uniform(1e-6, 3e-4):.3e}, 'epoch': {step / total * 3:.2f}}}"
            )
        out.append(_bar(r, step, total))
        return out

    def completed(self, r: Rng, total: int) -> Lines:
        out = ["", "", "Training completed. Do not forget to share your model on huggingface.co/models =)", "", ""]
        out.append(
            f"{{'train_runtime': {r.uniform(100, 90000):.4f}, 'train_samples_per_second': {r.uniform(0.5, 90):.3f}, 'train_steps_per_second': {r.uniform(0.01, 5):.3f}, 'train_loss': {r.uniform(0.2, 2):.4f}, 'epoch': {r.randint(1, 5)}.0}}"
        )
        out.append(_bar(r, total, total))
        if r.random() < 0.5:
            out.append(f"Saving model checkpoint to {r.choice(_DIRS)}/outputs")
        return out


class _Accelerate(_HF):
    name = "accelerate"

    def preamble(self, r: Rng) -> Lines:
        return [
            "The following values were not passed to `accelerate launch` and had defaults used instead:",
            f"\t`--num_processes` was set to a value of `{r.choice((1, 2, 4, 8))}`",
            "\t`--mixed_precision` was set to a value of `'no'`",
            "To avoid this warning pass in values for each of the problematic parameters or run `accelerate config`.",
            *super().preamble(r),
        ]

    def progress(self, r: Rng, step: int, total: int, loss: float) -> Lines:
        if r.random() < 0.5:
            return [f"epoch {step * 3 // total}: step {step}/{total} loss={loss:.4f} lr={r.uniform(1e-6, 3e-4):.2e}"]
        return super().progress(r, step, total, loss)

    def wrapper(self, r: Rng) -> Lines:
        return [
            "Traceback (most recent call last):",
            '  File "/usr/local/bin/accelerate", line 8, in <module>',
            "    sys.exit(main())",
            f'  File "{_py(r)}/accelerate/commands/launch.py", line {r.randint(1000, 1200)}, in simple_launcher',
            "    raise subprocess.CalledProcessError(returncode=process.returncode, cmd=cmd)",
            f"subprocess.CalledProcessError: Command '['/usr/bin/python', '{_script(r)}']' returned non-zero exit status 1.",
        ]


class _DeepSpeed(_Fmt):
    name = "deepspeed"

    def preamble(self, r: Rng) -> Lines:
        ts = _ts(r)
        return [
            f"[{ts},{r.randint(100, 999)}] [INFO] [real_accelerator.py:191:get_accelerator] Setting ds_accelerator to cuda (auto detect)",
            f"[{ts},{r.randint(100, 999)}] [INFO] [comm.py:637:init_distributed] cdb=None",
            f"[{ts},{r.randint(100, 999)}] [INFO] [config.py:1000:print] zero_optimization ............ stage={r.choice((1, 2, 3))}",
        ]

    def progress(self, r: Rng, step: int, total: int, loss: float) -> Lines:
        ts = _ts(r)
        out = [
            f"[{ts},{r.randint(100, 999)}] [INFO] [logging.py:96:log_dist] [Rank 0] step={step}, skipped={r.randint(0, 5)}, lr=[{r.uniform(1e-6, 3e-4):.6e}], mom=[(0.9, 0.999)]",
            f"[{ts},{r.randint(100, 999)}] [INFO] [timer.py:260:stop] epoch=0/micro_step={step * 4}/global_step={step}, RunningAvgSamplesPerSec={r.uniform(5, 90):.3f}, CurrSamplesPerSec={r.uniform(5, 90):.3f}, MemAllocated={r.uniform(2, 70):.2f}GB, MaxMemAllocated={r.uniform(2, 79):.2f}GB",
        ]
        if r.random() < 0.3:
            out.insert(
                0,
                f"[{ts},{r.randint(100, 999)}] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: {2 ** r.randint(12, 17)}, reducing to {2 ** r.randint(8, 11)}",
            )
        if r.random() < 0.5:
            out.append(
                f"{{'loss': {loss:.4f}, 'learning_rate': {r.uniform(1e-6, 3e-4):.3e}, 'epoch': {step / total:.2f}}}"
            )
        return out

    def completed(self, r: Rng, total: int) -> Lines:
        return _HF().completed(r, total)

    def wrapper(self, r: Rng) -> Lines:
        ts = _ts(r)
        return [
            f"[{ts},{r.randint(100, 999)}] [INFO] [launch.py:315:sigkill_handler] Killing subprocess {r.randint(1000, 99999)}",
            f"[{ts},{r.randint(100, 999)}] [ERROR] [launch.py:321:sigkill_handler] ['/usr/bin/python3', '-u', '{_script(r)}', '--local_rank=0', '--deepspeed', 'ds_config.json'] exits with return code = 1",
        ]


class _Torchrun(_HF):
    name = "torchrun"

    def preamble(self, r: Rng) -> Lines:
        return [
            "WARNING:torch.distributed.run:",
            "*****************************************",
            "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your system being overloaded, please further tune the variable for optimal performance in your application as needed.",
            "*****************************************",
        ]

    def progress(self, r: Rng, step: int, total: int, loss: float) -> Lines:
        if r.random() < 0.5:
            return [
                f"[rank0]: epoch {step * 2 // total} | step {step:>6d}/{total} | loss {loss:.4f} | lr {r.uniform(1e-6, 3e-4):.2e} | {r.uniform(100, 9000):.0f} tok/s"
            ]
        return super().progress(r, step, total, loss)

    def wrapper(self, r: Rng) -> Lines:
        pid = r.randint(1000, 99999)
        rank = r.randint(0, 7)
        return [
            f"[{_ts(r)},{r.randint(100, 999)}] torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: 1) local_rank: {rank} (pid: {pid}) of binary: /usr/bin/python3",
            "Traceback (most recent call last):",
            '  File "/usr/local/bin/torchrun", line 8, in <module>',
            "    sys.exit(main())",
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
            "============================================================",
            f"{_script(r).rsplit('/', 1)[1]} FAILED",
            "------------------------------------------------------------",
            "Root Cause (first observed failure):",
            "[0]:",
            f"  time      : {_ts(r).replace(' ', '_')}",
            f"  host      : gpu-{r.randint(1, 99)}",
            f"  rank      : {rank} (local_rank: {rank})",
            f"  exitcode  : 1 (pid: {pid})",
            "  error_file: <N/A>",
            "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
            "============================================================",
        ]


class _Axolotl(_HF):
    name = "axolotl"

    def _p(self, r: Rng, where: str) -> str:
        return f"[{_ts(r)},{r.randint(100, 999)}] [INFO] [axolotl.{where}] [PID:{r.randint(100, 9999)}] [RANK:0]"

    def preamble(self, r: Rng) -> Lines:
        return [
            f"{self._p(r, 'utils.data.sft.load_tokenized_prepared_datasets:189')} Unable to find prepared dataset in last_run_prepared/{r.getrandbits(64):016x}",
            f"{self._p(r, 'utils.data.sft.load_tokenized_prepared_datasets:190')} Loading raw datasets...",
            f"{self._p(r, 'normalize_config:182')} GPU memory usage baseline: 0.000GB (+{r.uniform(0.1, 0.9):.3f}GB misc)",
            f"{self._p(r, 'train.train:136')} Starting trainer...",
        ]

    def completed(self, r: Rng, total: int) -> Lines:
        return [
            *_HF().completed(r, total)[:6],
            f"{self._p(r, 'train.train:190')} Training Completed!!! Saving pre-trained model to ./outputs/{r.choice(('lora-out', 'qlora-out', 'out'))}",
        ]


class _Unsloth(_HF):
    name = "unsloth"

    def preamble(self, r: Rng) -> Lines:
        return [
            f"==((====))==  Unsloth 2024.{r.randint(1, 12)}: Fast Llama patching. Transformers = 4.{r.randint(38, 46)}.0.",
            f"   \\\\   /|    GPU: {r.choice(_GPUS)}. Max memory: {r.uniform(10, 80):.3f} GB. Platform = Linux.",
            f"O^O/ \\_/ \\    Pytorch: 2.{r.randint(1, 5)}.0+cu121. CUDA = 8.{r.randint(0, 9)}. CUDA Toolkit = 12.1.",
            "\\        /    Bfloat16 = TRUE. FA [Xformers = 0.0.27. FA2 = False]",
            ' "-____-"     Free Apache license: http://github.com/unslothai/unsloth',
            "==((====))==  Unsloth - 2x faster free finetuning | Num GPUs = 1",
            f"   \\\\   /|    Num examples = {r.randint(1000, 90000):,} | Num Epochs = {r.randint(1, 3)}",
        ]

    def progress(self, r: Rng, step: int, total: int, loss: float) -> Lines:
        if r.random() < 0.4:
            return [f"| {step} | {loss:.6f} |"]
        return super().progress(r, step, total, loss)


class _LlamaFactory(_HF):
    name = "llamafactory"

    def progress(self, r: Rng, step: int, total: int, loss: float) -> Lines:
        if r.random() < 0.6:
            return [
                f"{{'loss': {loss:.4f}, 'grad_norm': {r.uniform(0.1, 4):.4f}, 'learning_rate': {r.uniform(1e-6, 3e-4):.4e}, 'epoch': {step / total * 3:.2f}, 'num_input_tokens_seen': {step * 4096}}}",
                _bar(r, step, total),
            ]
        return [
            f"[INFO|trainer.py:{r.randint(2000, 4000)}] {_ts(r)},{r.randint(100, 999)} >> Saving model checkpoint to saves/{r.choice(('llama3-8b', 'qwen2-7b'))}/lora/sft/checkpoint-{step}"
        ]

    def completed(self, r: Rng, total: int) -> Lines:
        return [
            "***** train metrics *****",
            f"  epoch                    = {r.randint(1, 5)}.0",
            f"  total_flos               = {r.randint(1000, 99999999)}GF",
            f"  train_loss               = {r.uniform(0.2, 2):.4f}",
            f"  train_runtime            = {r.randint(0, 9)}:{r.randint(0, 59):02d}:{r.randint(0, 59):02d}.{r.randint(0, 99):02d}",
            f"  train_samples_per_second = {r.uniform(0.5, 50):.3f}",
            "Figure saved at: saves/llama3-8b/lora/sft/training_loss.png",
        ]


class _NanoGPT(_Fmt):
    name = "nanogpt"

    def preamble(self, r: Rng) -> Lines:
        return [
            f"tokens per iteration will be: {r.choice((491520, 65536, 16384)):,}",
            "Initializing a new model from scratch",
            f"number of parameters: {r.uniform(10, 130):.2f}M",
            "compiling the model... (takes a ~minute)",
        ]

    def progress(self, r: Rng, step: int, total: int, loss: float) -> Lines:
        out = [f"iter {step}: loss {loss:.4f}, time {r.uniform(20, 900):.2f}ms, mfu {r.uniform(5, 50):.2f}%"]
        if r.random() < 0.15:
            out = [
                f"step {step}: train loss {loss:.4f}, val loss {loss * r.uniform(1, 1.1):.4f}",
                "saving checkpoint to out",
                *out,
            ]
        return out

    def completed(self, r: Rng, total: int) -> Lines:
        return [
            f"step {total}: train loss {r.uniform(0.8, 2):.4f}, val loss {r.uniform(0.9, 2.2):.4f}",
            "saving checkpoint to out",
            "training finished",
        ]


class _Plain(_Fmt):
    name = "plain"

    def progress(self, r: Rng, step: int, total: int, loss: float) -> Lines:
        return [
            r.choice(
                (
                    f"Epoch {step * 5 // total + 1}/5 - step {step} - loss: {loss:.4f}",
                    f"[{_ts(r)}] step={step} loss={loss:.4f} lr={r.uniform(1e-6, 3e-4):.2e}",
                    f"epoch={step * 5 // total} batch={step} loss={loss:.4f} acc={r.uniform(0.3, 0.99):.3f}",
                )
            )
        ]

    def completed(self, r: Rng, total: int) -> Lines:
        return [r.choice(("Training finished.", "Done training.", f"Training complete in {r.randint(5, 300)} min"))]


class _Tuneharness(_Fmt):
    name = "tuneharness"

    def _t(self, r: Rng) -> str:
        return f"2026-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}T{r.randint(0, 23):02d}:{r.randint(0, 59):02d}:{r.randint(0, 59):02d}.{r.randint(0, 999):03d}Z"

    def preamble(self, r: Rng) -> Lines:
        return [f"{self._t(r)} start pid={r.randint(100, 99999)} task=causal_lm quantization=nf4"]

    def progress(self, r: Rng, step: int, total: int, loss: float) -> Lines:
        return [
            f"{self._t(r)} step step={step} max_steps={total} loss={loss:.6g} lr={r.uniform(1e-6, 3e-4):.3e} tokens_per_s={r.uniform(100, 9000):.1f}"
        ]

    def completed(self, r: Rng, total: int) -> Lines:
        return [
            f"{self._t(r)} checkpoint step={total} dir=step-{total:08d} save_s={r.uniform(0.1, 9):.4f}",
            f"{self._t(r)} adapter step={total} dir=adapter",
            f"{self._t(r)} finished step={total} max_steps={total} elapsed_s={r.uniform(10, 9000):.3f}",
        ]


class _Megatron(_Fmt):
    name = "megatron"

    def preamble(self, r: Rng) -> Lines:
        return [
            "> building train, validation, and test datasets ...",
            "> finished creating GPT datasets ...",
            f"[after dataloaders are built] datetime: {_ts(r)}",
            "done with setup ...",
            "training ...",
        ]

    def progress(self, r: Rng, step: int, total: int, loss: float) -> Lines:
        return [
            f" [{_ts(r)}] iteration {step:>8d}/{total:>8d} | consumed samples: {step * 512:>12d} | elapsed time per iteration (ms): {r.uniform(300, 9000):.1f} | learning rate: {r.uniform(1e-6, 3e-4):.3E} | global batch size: {512:>5d} | lm loss: {loss:.6E} | loss scale: {r.choice(('1.0', '65536.0', '32768.0'))} | grad norm: {r.uniform(0.1, 3):.3f} | number of skipped iterations: {0:>3d} | number of nan iterations: {0:>3d} |"
        ]

    def completed(self, r: Rng, total: int) -> Lines:
        return [
            f"saving checkpoint at iteration {total:>7d} to checkpoints/gpt",
            f"  successfully saved checkpoint from iteration {total:>7d} to checkpoints/gpt",
            f"[after training is done] datetime: {_ts(r)}",
            f" validation loss at the end of training for val data | lm loss value: {r.uniform(1, 3):.6E} | lm loss PPL: {r.uniform(3, 20):.6E} |",
        ]

    def wrapper(self, r: Rng) -> Lines:
        return [f"[rank{r.randint(0, 63)}]: Exception raised in pretrain_gpt.py, see above"] if r.random() < 0.3 else []


class _Lightning(_Fmt):
    name = "lightning"

    def preamble(self, r: Rng) -> Lines:
        return [
            "GPU available: True (cuda), used: True",
            "TPU available: False, using: 0 TPU cores",
            "LOCAL_RANK: 0 - CUDA_VISIBLE_DEVICES: [0]",
            "  | Name  | Type             | Params",
            "0 | model | LlamaForCausalLM | 6.7 B",
            f"{r.randint(1, 90)}.{r.randint(0, 9)} M    Trainable params",
        ]

    def progress(self, r: Rng, step: int, total: int, loss: float) -> Lines:
        return [
            _bar(r, step, total, prefix=f"Epoch {step * 3 // total}: ")
            + f", v_num={r.randint(0, 40)}, train_loss={loss:.3f}]"[:-1]
        ]

    def completed(self, r: Rng, total: int) -> Lines:
        return [
            _bar(r, total, total, prefix=f"Epoch {r.randint(1, 9)}: "),
            f"`Trainer.fit` stopped: `max_{r.choice(('epochs', 'steps'))}={r.randint(1, 5000)}` reached.",
        ]


_FORMATS: dict[str, _Fmt] = {
    f.name: f
    for f in (
        _HF(),
        _Accelerate(),
        _DeepSpeed(),
        _Torchrun(),
        _Axolotl(),
        _Unsloth(),
        _LlamaFactory(),
        _NanoGPT(),
        _Plain(),
        _Tuneharness(),
        _Megatron(),
        _Lightning(),
    )
}

# ------------------------------------------------------------------ failure blocks per state


def _gib(r: Rng) -> str:
    return f"{r.uniform(0.02, 20):.2f} {r.choice(('GiB', 'MiB'))}"


def _oom(r: Rng) -> Lines:
    total = r.choice((23.65, 79.15, 39.39, 47.54, 31.74, 11.76))
    k = r.randint(0, 8)
    if k == 0:
        return [
            *_frames(r),
            f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {_gib(r)}. GPU {r.randint(0, 7)} has a total capacity of {total} GiB of which {r.uniform(0.01, 2):.2f} GiB is free. Process {r.randint(1000, 99999)} has {total - 1:.2f} GiB memory in use. Including non-PyTorch memory, this process has {total - 1.2:.2f} GiB memory in use. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
        ]
    if k == 1:
        return [
            *_frames(r),
            f"torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate {_gib(r)} (GPU {r.randint(0, 7)}; {total} GiB total capacity; {total - 1.5:.2f} GiB already allocated; {r.randint(5, 500)}.19 MiB free; {total - 1:.2f} GiB reserved in total by PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.",
        ]
    if k == 2:
        pid = r.randint(1000, 999999)
        return [
            f"[{r.randint(100000, 9999999)}.{r.randint(100000, 999999)}] python invoked oom-killer: gfp_mask=0x100cca(GFP_HIGHUSER_MOVABLE), order=0, oom_score_adj=0",
            f"[{r.randint(100000, 9999999)}.{r.randint(100000, 999999)}] Out of memory: Killed process {pid} (python) total-vm:{r.randint(10**7, 10**8)}kB, anon-rss:{r.randint(10**7, 10**8)}kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:{r.randint(10**4, 10**6)}kB oom_score_adj:0",
        ]
    if k == 3:
        return [
            f"{r.choice(_DIRS)}/run.sh: line {r.randint(3, 60)}: {r.randint(100, 99999)} Killed                  python -u {_script(r)}"
        ]
    if k == 4:
        pid = r.randint(1000, 99999)
        return [
            f"[{_ts(r)},{r.randint(100, 999)}] torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: -9) local_rank: 0 (pid: {pid}) of binary: /usr/bin/python3",
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
            f"  exitcode  : -9 (pid: {pid})",
            f"  traceback : Signal 9 (SIGKILL) received by PID {pid}",
        ]
    if k == 5:
        return [
            *_frames(r, 1),
            f"RuntimeError: [enforce fail at alloc_cpu.cpp:{r.randint(80, 120)}] data. DefaultCPUAllocator: not enough memory: you tried to allocate {r.randint(10**9, 10**11)} bytes.",
        ]
    if k == 6:
        return [
            *_frames(r),
            "RuntimeError: CUDA error: out of memory",
            "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.",
            "For debugging consider passing CUDA_LAUNCH_BLOCKING=1.",
        ]
    if k == 7:
        return [
            f"torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:{r.randint(1000, 3000)}, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.{r.randint(14, 21)}.{r.randint(1, 5)}",
            "ncclUnhandledCudaError: Call to CUDA function failed.",
            "Last error:",
            "Cuda failure 'out of memory'",
        ]
    return [*_frames(r), "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"]


def _diverged(r: Rng, fmt: _Fmt, step: int, total: int) -> Lines:
    k = r.randint(0, 6)
    if k <= 2:
        out: Lines = []
        for i in range(r.randint(2, 4)):
            if fmt.name in ("nanogpt",):
                out.append(
                    f"iter {step + i * 10}: loss nan, time {r.uniform(20, 900):.2f}ms, mfu {r.uniform(5, 50):.2f}%"
                )
            elif fmt.name == "megatron":
                out.append(
                    f" [{_ts(r)}] iteration {step + i:>8d}/{total:>8d} | consumed samples: {step * 512:>12d} | learning rate: 3.000E-04 | global batch size:   512 | loss scale: 1.0 | number of skipped iterations:   1 | number of nan iterations:   {i + 1} |"
                )
            elif fmt.name == "lightning":
                out.append(
                    _bar(r, step + i, total, prefix=f"Epoch {step * 3 // total}: ") + ", v_num=3, train_loss=nan]"
                )
            elif fmt.name in ("tuneharness",):
                out.append(
                    f"2026-05-0{r.randint(1, 9)}T10:00:{10 + i}.000Z step step={step + i} max_steps={total} loss=nan lr=2.000e-04"
                )
            elif fmt.name in ("plain",):
                out.append(f"[{_ts(r)}] step={step + i} loss=nan lr={r.uniform(1e-6, 3e-4):.2e}")
            else:
                out.append(
                    f"{{'loss': {r.choice(('nan', '0.0'))}, 'grad_norm': nan, 'learning_rate': {r.uniform(1e-6, 3e-4):.3e}, 'epoch': {step / total * 3:.2f}}}"
                )
                out.append(_bar(r, step + i, total))
        return out
    if k == 3:
        return [
            f"[{_ts(r)},{r.randint(100, 999)}] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: {2 ** r.randint(0, 2)}, reducing to 1",
            *_frames(r, 1),
            "Exception: Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.",
        ]
    if k == 4:
        return [
            *_frames(r, 1),
            f"FloatingPointError: Minimum loss scale reached ({r.choice(('0.0001', '1e-05'))}). Your loss is probably exploding. Try lowering the learning rate, using gradient clipping or increasing the batch size.",
        ]
    if k == 5:
        return [
            f"Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to {r.choice(('6.103515625e-05', '0.0', '1.52587890625e-05'))}",
            f"Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to {r.choice(('3.0517578125e-05', '0.0'))}",
        ]
    vals = [r.uniform(1.5, 3) * (10 ** (i * r.uniform(0.6, 1.4))) for i in range(5)]
    return [
        *[line for v in vals for line in fmt.progress(r, step, total, v)][-6:],
        r.choice(
            (
                f"ValueError: loss is nan, stopping training at step {step}",
                f"RuntimeError: Loss is {r.choice(('nan', 'inf'))}, stopping training",
                f"WARNING: non-finite loss at step {step}, ending training",
            )
        ),
    ]


def _cuda(r: Rng) -> Lines:
    k = r.randint(0, 9)
    pci = f"PCI:0000:{r.randint(1, 255):02x}:00"
    if k == 0:
        xid = r.choice(
            (
                (79, "GPU has fallen off the bus."),
                (48, "An uncorrectable double bit error (DBE) has been detected on GPU"),
                (31, "Ch 00000010, intr 00000000. MMU Fault"),
                (43, "Ch 00000008"),
                (94, "Contained ECC error."),
                (95, "Uncontained ECC error."),
                (13, "Graphics SM Warp Exception"),
            )
        )
        return [
            f"[{r.randint(1000, 9999999)}.{r.randint(100000, 999999)}] NVRM: Xid ({pci}): {xid[0]}, pid={r.randint(100, 99999)}, name=python, {xid[1]}",
            "RuntimeError: CUDA error: unspecified launch failure",
        ]
    if k == 1:
        return [
            *_frames(r),
            "RuntimeError: CUDA error: an illegal memory access was encountered",
            "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.",
            "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
            "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
        ]
    if k == 2:
        return [
            *_frames(r, 1),
            f"RuntimeError: The NVIDIA driver on your system is too old (found version {r.choice((11040, 11060, 12020, 11080))}). Please update your GPU driver by downloading and installing a new version from the URL: http://www.nvidia.com/Download/index.aspx Alternatively, go to: https://pytorch.org to install a PyTorch version that has been compiled with your version of the CUDA driver.",
        ]
    if k == 3:
        return [*_frames(r, 1), "RuntimeError: No CUDA GPUs are available"]
    if k == 4:
        return [
            f"{_py(r)}/torch/cuda/__init__.py:{r.randint(100, 800)}: UserWarning: CUDA initialization: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before calling NumCudaDevices() that might have already set an error? Error {r.choice(('804: forward compatibility was attempted on non supported HW', '803: system has unsupported display driver / cuda driver combination'))} (Triggered internally at ../c10/cuda/CUDAFunctions.cpp:108.)",
            *_frames(r, 1),
            "AssertionError: Torch not compiled with CUDA enabled"
            if r.random() < 0.3
            else "RuntimeError: No CUDA GPUs are available",
        ]
    if k == 5:
        return [
            "Failed to initialize NVML: Driver/library version mismatch",
            f"NVML library version: {r.randint(525, 560)}.{r.randint(10, 99)}",
        ]
    if k == 6:
        return [
            *_frames(r, 1),
            "RuntimeError: CUDA error: uncorrectable ECC error encountered",
            "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.",
        ]
    if k == 7:
        return [
            f"gpu-{r.randint(1, 99)}:{r.randint(100, 9999)}:{r.randint(100, 9999)} [{r.randint(0, 7)}] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC",
            f"gpu-{r.randint(1, 99)}:{r.randint(100, 9999)}:{r.randint(100, 9999)} [{r.randint(0, 7)}] transport/net_ib.cc:{r.randint(900, 1400)} NCCL WARN NET/IB : Got completion from peer 10.0.{r.randint(0, 255)}.{r.randint(0, 255)}<{r.randint(10000, 60000)}> with error 12, opcode 0, len 0, vendor err 129",
            f"torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:{r.randint(1000, 3000)}, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.{r.randint(14, 21)}.{r.randint(1, 5)}",
            "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error.",
        ]
    if k == 8:
        return [
            *_frames(r, 1),
            "RuntimeError: CUDA error: no kernel image is available for execution on the device",
            f"{r.choice(_GPUS)} with CUDA capability sm_{r.choice((120, 90, 37))} is not compatible with the current PyTorch installation.",
        ]
    return [
        f"CUDA SETUP: Required library version not found: libbitsandbytes_cuda{r.choice((118, 121, 124))}.so. Maybe you need to compile it from source?",
        "RuntimeError: CUDA Setup failed despite GPU being available. Please run the following command to get more information: python -m bitsandbytes",
    ]


def _data(r: Rng) -> Lines:
    k = r.randint(0, 11)
    name = r.choice(("alpaca_cleaned", "support_tickets", "sharegpt_v3", "my_dataset", "orca_chat"))
    if k == 0:
        return [
            *_frames(r, 1),
            "ValueError: Cannot use chat template functions because tokenizer.chat_template is not set and no template argument was passed! For information about writing templates and setting the tokenizer.chat_template attribute, please see the documentation at https://huggingface.co/docs/transformers/main/en/chat_templating",
        ]
    if k == 1:
        return [
            *_frames(r, 1),
            "    raise jinja2.exceptions.TemplateError(message)",
            "jinja2.exceptions.TemplateError: Conversation roles must alternate user/assistant/user/assistant/...",
        ]
    if k == 2:
        return [
            *_frames(r, 1),
            "ValueError: Asking to pad but the tokenizer does not have a padding token. Please select a token to use as `pad_token` `(tokenizer.pad_token = tokenizer.eos_token e.g.)` or add a new pad token via `tokenizer.add_special_tokens({'pad_token': '[PAD]'})`.",
        ]
    if k == 3:
        row = r.randint(0, 90000)
        return [
            f"Failed to read file '{r.choice(_DIRS)}/data/{name}.jsonl' with error <class 'pyarrow.lib.ArrowInvalid'>: JSON parse error: Missing a closing quotation mark in string. in row {row}",
            *_frames(r, 1),
            f"pyarrow.lib.ArrowInvalid: JSON parse error: {r.choice(('Missing a closing quotation mark in string.', 'Invalid value.', 'Missing a name for object member.'))} in row {row}",
            "The above exception was the direct cause of the following exception:",
            "datasets.exceptions.DatasetGenerationError: An error occurred while generating the dataset",
        ]
    if k == 4:
        return [
            f"../aten/src/ATen/native/cuda/Indexing.cu:{r.randint(1000, 1400)}: indexSelectLargeIndex: block: [{r.randint(0, 999)},0,0], thread: [{r.randint(0, 127)},0,0] Assertion `srcIndex < srcSelectDimSize` failed.",
            *_frames(r, 1),
            "RuntimeError: CUDA error: device-side assert triggered",
        ]
    if k == 5:
        return [
            *_frames(r, 1),
            f"KeyError: '{r.choice(('text', 'instruction', 'messages', 'conversations', 'output'))}'",
        ]
    if k == 6:
        return [
            *_frames(r, 1),
            "ValueError: Unable to create tensor, you should probably activate truncation and/or padding with 'padding=True' 'truncation=True' to have batched tensors with the same length. Perhaps your features (`labels` in this case) have excessive nesting (inputs type `list` where type `int` is expected).",
        ]
    if k == 7:
        return [*_frames(r, 1), f"ValueError: Undefined dataset {name} in dataset_info.json."]
    if k == 8:
        return [
            *_frames(r, 1),
            "pydantic_core._pydantic_core.ValidationError: 1 validation error for AxolotlInputConfig",
            "datasets.0.type",
            f"  Value error, unhandled prompt tokenization strategy: {r.choice(('sharegpt_chat', 'alpaca_x', 'chatml.intel'))} [type=value_error, input_value='x', input_type=str]",
        ]
    if k == 9:
        return [
            *_frames(r, 1),
            f"ValueError: Target modules {{'{r.choice(('q_proj', 'query', 'c_attn'))}', 'v_proj'}} not found in the base model. Please check the target modules and try again.",
        ]
    if k == 10:
        return [
            *_frames(r, 1),
            f"json.decoder.JSONDecodeError: Expecting ',' delimiter: line 1 column {r.randint(10, 900)} (char {r.randint(10, 900)})",
        ]
    return [
        *_frames(r, 1),
        "yaml.scanner.ScannerError: mapping values are not allowed here",
        f'  in "{r.choice(_DIRS)}/config.yaml", line {r.randint(2, 60)}, column {r.randint(2, 30)}',
    ]


def _io(r: Rng) -> Lines:
    k = r.randint(0, 8)
    d = r.choice(_DIRS)
    if k == 0:
        return [
            f"Saving model checkpoint to {d}/checkpoint-{r.randint(1, 90) * 100}",
            *_frames(r, 1),
            "OSError: [Errno 28] No space left on device",
        ]
    if k == 1:
        pos = r.randint(10**8, 10**10)
        return [
            f"Saving model checkpoint to {d}/checkpoint-{r.randint(1, 90) * 100}",
            *_frames(r, 1),
            f"RuntimeError: [enforce fail at inline_container.cc:{r.randint(400, 800)}] . unexpected pos {pos} vs {pos - r.randint(10, 999)}",
        ]
    if k == 2:
        return [
            'safetensors_rust.SafetensorError: Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'
        ]
    if k == 3:
        return [
            *_frames(r, 1),
            f"requests.exceptions.ConnectionError: HTTPSConnectionPool(host='huggingface.co', port=443): Max retries exceeded with url: /{r.choice(_MODELS)}/resolve/main/config.json (Caused by NewConnectionError('<urllib3.connection.HTTPSConnection object at 0x7f{r.getrandbits(40):010x}>: Failed to establish a new connection: [Errno 111] Connection refused'))",
        ]
    if k == 4:
        return [
            *_frames(r, 1),
            f"requests.exceptions.ReadTimeout: HTTPSConnectionPool(host='cdn-lfs.huggingface.co', port=443): Read timed out. (read timeout={r.choice((10, 30))})",
        ]
    if k == 5:
        return [
            *_frames(r, 1),
            f"OSError: We couldn't connect to 'https://huggingface.co' to load this file, couldn't find it in the cached files and it looks like {r.choice(_MODELS)} is not the path to a directory containing a file named config.json.",
            "Checkout your internet connection or see how to run the library in offline mode at 'https://huggingface.co/docs/transformers/installation#offline-mode'.",
        ]
    if k == 6:
        return [
            *_frames(r, 1),
            f"huggingface_hub.errors.HfHubHTTPError: {r.choice(('500 Server Error: Internal Server Error', '502 Server Error: Bad Gateway', '504 Server Error: Gateway Time-out'))} for url: https://huggingface.co/api/models/{r.choice(_MODELS)}",
        ]
    if k == 7:
        return [*_frames(r, 1), "OSError: [Errno 122] Disk quota exceeded"]
    return [
        *_frames(r, 1),
        "urllib3.exceptions.ProtocolError: ('Connection broken: IncompleteRead(1043 bytes read, 2027 more expected)', IncompleteRead(1043 bytes read, 2027 more expected))",
    ]


def _stalled(r: Rng) -> Lines:
    k = r.randint(0, 3)
    rank = r.randint(0, 7)
    seq = r.randint(100, 99999)
    ms = r.choice((600000, 1800000))
    if k <= 1:
        return [
            f"[rank{rank}]:[E ProcessGroupNCCL.cpp:{r.randint(500, 700)}] [Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType={r.choice(('ALLREDUCE', 'ALLGATHER', '_ALLGATHER_BASE', 'BROADCAST'))}, NumelIn={r.randint(1, 10**7)}, NumelOut={r.randint(1, 10**7)}, Timeout(ms)={ms}) ran for {ms + r.randint(1, 999)} milliseconds before timing out.",
            f"[rank{rank}]:[E ProcessGroupNCCL.cpp:{r.randint(500, 700)}] [Rank {rank}] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.",
            f"[rank{rank}]:[E ProcessGroupNCCL.cpp:{r.randint(500, 700)}] [Rank {rank}] To avoid data inconsistency, we are taking the entire process down.",
            "terminate called after throwing an instance of 'c10::DistBackendError'",
        ]
    if k == 2:
        return [
            f"torch.distributed.DistStoreError: Timed out after {r.randint(300, 1900)} seconds waiting for clients. {r.randint(1, 3)}/{r.randint(4, 8)} clients joined."
        ]
    return [
        f"[rank{rank}]:[E{r.randint(100, 999)} ProcessGroupNCCL.cpp:{r.randint(1200, 1400)}] [PG 0 Rank {rank}] Heartbeat monitor timed out! Process will be terminated after dumping debug info. workMetaList_.size()={r.randint(1, 9)}"
    ]


# ------------------------------------------------------------------ assembling one tail


def _decorate(r: Rng, lines: Lines) -> str:
    """Join lines; sometimes as a terminal would capture them (CR redraws, ANSI colours)."""
    out: list[str] = []
    ansi = r.random() < 0.15
    for i, line in enumerate(lines):
        if ansi and ("Error" in line or "WARNING" in line or "INFO" in line):
            line = f"\x1b[{r.choice((31, 33, 32, 1))}m{line}\x1b[0m"
        sep = "\n"
        if "%|" in line and i + 1 < len(lines) and "%|" in lines[i + 1] and r.random() < 0.7:
            sep = "\r"
        out.append(line + sep)
    return "".join(out)


def _tail(r: Rng, fw: str, state: str) -> tuple[str, float]:
    fmt = _FORMATS[fw]
    total = r.choice((100, 500, 1000, 1500, 3000, 12000))
    n = r.randint(2, 9)
    step0 = r.randint(0, max(1, total - n * 10))
    curve = _loss_curve(r, n)
    lines: Lines = fmt.preamble(r) if r.random() < 0.6 else []
    lines += _warnings(r)
    for i, loss in enumerate(curve):
        lines += fmt.progress(r, min(total, step0 + i * max(1, total // 100)), total, loss)
        if r.random() < 0.15:
            lines += _warnings(r)[:1]
    step = min(total, step0 + n * max(1, total // 100))
    idle = r.uniform(0, 240)
    if state == "progressing":
        if r.random() < 0.3:
            lines += [
                r.choice(
                    (
                        "wandb: Network error (ReadTimeout), entering retry loop.",
                        "Retrying in 2s [Retry 1/5].",
                        f"[{_ts(r)},{r.randint(100, 999)}] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768",
                    )
                )
            ]
            lines += fmt.progress(r, step + 1, total, curve[-1])
        idle = r.uniform(0, 600)
    elif state == "completed":
        lines += fmt.completed(r, total)
        idle = r.uniform(0, 20000)
    elif state == "stalled":
        if r.random() < 0.45:
            idle = r.uniform(1000, 30000)
        else:
            lines += _stalled(r) + fmt.wrapper(r)
            idle = r.uniform(0, 3000)
    else:
        block = {
            "oom": lambda: _oom(r),
            "diverged": lambda: _diverged(r, fmt, step, total),
            "cuda_fault": lambda: _cuda(r),
            "data_error": lambda: _data(r),
            "io_error": lambda: _io(r),
        }[state]()
        if state in ("data_error", "cuda_fault", "io_error") and r.random() < 0.35:
            # Many of these fail before training: drop the progress lines.
            lines = (fmt.preamble(r) if r.random() < 0.5 else []) + _warnings(r)
        lines += block
        if state != "diverged" and r.random() < 0.6:
            lines += fmt.wrapper(r)
        idle = r.uniform(0, 5000)
    return _decorate(r, lines), round(idle, 1)


# ------------------------------------------------------------------ custom scripts' own words
# Failures as a home-grown training script reports them, in words no rule was written for: the
# `ood:custom` slice measures how the chain generalises to phrasing it has never seen.

_CUSTOM: dict[str, tuple[str, ...]] = {
    "progressing": (
        "[train] step {n}/{N} loss={l:.4f} lr={lr:.2e} {t} tok/s",
        "[train] step {n}/{N} loss={l:.4f} lr={lr:.2e} {t} tok/s (slow batch, {s}s)",
    ),
    "completed": (
        "[train] all {N} steps done; final loss {l:.3f}; adapter written to ./out/adapter",
        "SUCCESS: fine-tune finished after {s}s, weights exported to ./export",
    ),
    "oom": (
        "[train] FATAL: GPU memory exhausted while allocating activations (need {g} GiB, {f} GiB free)",
        "[train] FATAL: ran out of VRAM on device {d}; try a smaller batch",
        "[supervisor] child exited: memory limit exceeded, process terminated by the kernel",
    ),
    "diverged": (
        "[train] FATAL: loss jumped from {l:.2f} to {big:.1e} at step {n}; aborting",
        "[train] FATAL: weights contain NaN after update {n}; aborting",
        "[train] FATAL: gradient norm became infinite at step {n}",
    ),
    "cuda_fault": (
        "[train] FATAL: GPU {d} stopped responding (device lost)",
        "[train] FATAL: the CUDA runtime reported a hardware fault on device {d}",
        "[supervisor] nvidia driver crashed; GPU {d} unavailable",
    ),
    "data_error": (
        "[data] FATAL: sample {n} in train.jsonl is missing the 'completion' field",
        "[data] FATAL: bad record at line {n}: expected an object, got a list",
        "[data] FATAL: prompt template references an undefined variable 'system'",
    ),
    "io_error": (
        "[ckpt] FATAL: could not write checkpoint-{n}: the volume is full",
        "[ckpt] FATAL: uploading checkpoint-{n} to the bucket timed out after 3 tries",
        "[hub] FATAL: fetching model weights failed with HTTP 503",
    ),
    "stalled": (
        "[dist] FATAL: all-reduce did not complete within {s}s on rank {d}",
        "[dist] FATAL: waiting for rank {d} to join... gave up after 40 attempts",
        "[watchdog] no training step completed in the last {m} minutes; the run appears hung",
    ),
}


def _custom_tail(r: Rng, state: str) -> tuple[str, float]:
    total = r.choice((200, 1000, 5000))
    lines = [f"[train] starting run {r.getrandbits(32):08x} on {r.choice(_GPUS)}", *_warnings(r)[:2]]
    for i in range(r.randint(2, 6)):
        lines.append(
            _CUSTOM["progressing"][0].format(
                n=(i + 1) * 10,
                N=total,
                l=r.uniform(0.5, 3),
                lr=r.uniform(1e-5, 3e-4),
                t=r.randint(500, 9000),
                s=r.randint(2, 9),
            )
        )
    if state != "progressing":
        lines.append(
            r.choice(_CUSTOM[state]).format(
                n=r.randint(10, 5000),
                N=total,
                l=r.uniform(0.5, 3),
                lr=r.uniform(1e-5, 3e-4),
                t=r.randint(500, 9000),
                s=r.randint(300, 9000),
                g=round(r.uniform(0.5, 9), 2),
                f=round(r.uniform(0, 0.5), 2),
                d=r.randint(0, 7),
                big=r.uniform(1e6, 1e12),
                m=r.randint(30, 120),
            )
        )
    idle = r.uniform(0, 240) if state in ("progressing", "stalled") else r.uniform(0, 3000)
    return "\n".join(lines) + "\n", round(idle, 1)


def _generate_custom(seed: int, per_state: int) -> Iterator[dict[str, Any]]:
    r = random.Random(seed)
    n = 0
    for state in STATES:
        for _ in range(per_state):
            log, idle = _custom_tail(r, state)
            yield {
                "id": f"ood-custom-{n:04d}",
                "log": log,
                "idle_seconds": idle,
                "state": state,
                "framework": "custom",
                "split": "ood",
            }
            n += 1


# ------------------------------------------------------------------ held-out wording
# A second set of scripts' own words, in structured-logging style (timestamp, level, logger),
# another layout than `_CUSTOM`. The rules' semantic patterns were generalised from `_CUSTOM` and
# real logs, not from it, but one was widened for its misses, so `ood:wording` is tuned in part;
# `_FRESH` below is the wording no rule or model was tuned on.

_WORDING: dict[str, tuple[str, ...]] = {
    "progressing": (
        "{ts} INFO  loop: epoch {e} batch {n}/{N} | train_loss {l:.4f} | {t} samples/s",
        "{ts} WARNING loop: batch {n} took {s}s, dataloader is the bottleneck",
    ),
    "completed": (
        "{ts} INFO  loop: reached max_steps={N}, writing final weights ... ok",
        "{ts} INFO  job: fine-tuning complete in {s}s, exit code 0",
        "{ts} INFO  job: all epochs finished, best eval loss {l:.3f}, model stored",
    ),
    "oom": (
        "{ts} ERROR loop: not enough GPU memory for batch of {b} sequences ({g} GiB requested)",
        "{ts} CRITICAL job: worker was terminated by the out-of-memory killer (rss {g} GiB)",
        "{ts} ERROR loop: device {d} memory is full; cannot allocate {g} GiB for the optimizer state",
        "{ts} ERROR loop: allocation of {g} GiB failed on cuda:{d}, only {f} GiB available",
    ),
    "diverged": (
        "{ts} ERROR loop: train_loss is nan at batch {n}, stopping",
        "{ts} ERROR loop: loss blew up to {big:.2e} (was {l:.3f}), stopping early",
        "{ts} ERROR loop: non-numeric gradients detected in layer {d}; halting",
        "{ts} CRITICAL loop: loss became infinite after batch {n}",
    ),
    "cuda_fault": (
        "{ts} CRITICAL job: cuda:{d} is no longer visible to the process (hardware error)",
        "{ts} ERROR loop: GPU {d} reported an uncorrectable memory error; results are unreliable",
        "{ts} CRITICAL job: the GPU driver stopped responding on device {d}",
        "{ts} ERROR job: kernel launch failed on cuda:{d} with an unrecoverable device error",
    ),
    "data_error": (
        "{ts} ERROR data: row {n} of the training file has no 'response' key",
        "{ts} ERROR data: could not parse line {n} of train.jsonl as JSON",
        "{ts} ERROR data: the tokenizer produced an empty sequence for example {n}",
        "{ts} CRITICAL config: learning_rate must be a positive number, got '-{l:.1f}'",
    ),
    "io_error": (
        "{ts} ERROR ckpt: saving step {n} failed: no free space on /workspace",
        "{ts} ERROR hub: download of model shard {d} failed after 5 retries (connection reset)",
        "{ts} ERROR ckpt: writing the optimizer state to disk failed (I/O error)",
        "{ts} ERROR sync: upload of checkpoint-{n} to object storage failed: endpoint unreachable",
    ),
    "stalled": (
        "{ts} ERROR dist: rank {d} has not answered the barrier for {s}s; giving up",
        "{ts} CRITICAL watchdog: no batch finished in {m} minutes, the job looks frozen",
        "{ts} ERROR dist: gradient all-gather on rank {d} timed out after {s} seconds",
    ),
}


def _wording_tail(r: Rng, state: str) -> tuple[str, float]:
    total = r.choice((300, 2000, 8000))

    def ts() -> str:
        return (
            f"2025-0{r.randint(1, 9)}-{r.randint(10, 28)} {r.randint(10, 23)}:{r.randint(10, 59)}:{r.randint(10, 59)}"
        )

    lines = [f"{ts()} INFO  job: starting fine-tune on {r.choice(_GPUS)}", *_warnings(r)[:1]]
    for i in range(r.randint(2, 6)):
        lines.append(
            _WORDING["progressing"][0].format(
                ts=ts(), e=r.randint(0, 3), n=(i + 1) * 25, N=total, l=r.uniform(0.5, 3), t=r.randint(20, 900)
            )
        )
    if state == "progressing" and r.random() < 0.5:
        lines.insert(-1, _WORDING["progressing"][1].format(ts=ts(), n=r.randint(10, 500), s=r.randint(3, 40)))
    if state != "progressing":
        lines.append(
            r.choice(_WORDING[state]).format(
                ts=ts(),
                n=r.randint(10, 5000),
                N=total,
                l=r.uniform(0.5, 3),
                s=r.randint(300, 9000),
                b=r.randint(4, 64),
                g=round(r.uniform(0.5, 9), 2),
                f=round(r.uniform(0, 0.5), 2),
                d=r.randint(0, 7),
                big=r.uniform(1e6, 1e12),
                m=r.randint(30, 120),
            )
        )
    idle = r.uniform(0, 240) if state in ("progressing", "stalled") else r.uniform(0, 3000)
    return "\n".join(lines) + "\n", round(idle, 1)


def _generate_wording(seed: int, per_state: int) -> Iterator[dict[str, Any]]:
    r = random.Random(seed)
    n = 0
    for state in STATES:
        for _ in range(per_state):
            log, idle = _wording_tail(r, state)
            yield {
                "id": f"ood-wording-{n:04d}",
                "log": log,
                "idle_seconds": idle,
                "state": state,
                "framework": "wording",
                "split": "ood",
            }
            n += 1


# ------------------------------------------------------------------ paraphrases (train) and fresh wording (held-out)
# The specialist must learn failure SEMANTICS, not our templates: `_PARAPHRASE` rows (train only)
# say each failure in many ways; `_FRESH` (held-out only; no rule or model was tuned on it) is
# another, disjoint set of wordings in other log layouts. No template appears in both.

_PARAPHRASE: dict[str, tuple[str, ...]] = {
    "oom": (
        "{p} out of GPU memory at step {n} (tried {g} GiB)",
        "{p} host RAM exhausted; the process was killed",
        "{p} memory allocation of {g} GiB failed on GPU {d}",
        "{p} insufficient VRAM to hold the batch",
        "{p} the kernel OOM killer stopped the trainer (rss {g} GiB)",
        "{p} GPU {d} has no free memory left",
    ),
    "diverged": (
        "{p} loss is NaN since step {n}",
        "{p} training loss exploded to {big:.1e}",
        "{p} gradients overflowed to inf at step {n}",
        "{p} NaN found in model parameters after step {n}",
        "{p} the loss went to infinity; run diverged",
        "{p} grad norm is nan, cannot continue",
    ),
    "cuda_fault": (
        "{p} GPU {d} fell off the bus",
        "{p} CUDA device {d} is not available anymore",
        "{p} unrecoverable GPU hardware error on device {d}",
        "{p} the NVIDIA driver is not responding",
        "{p} device-level fault: GPU {d} reset itself",
        "{p} ECC errors reported on GPU {d}, aborting",
    ),
    "data_error": (
        "{p} record {n} has an invalid schema",
        "{p} could not decode line {n} of the dataset",
        "{p} missing field 'text' in example {n}",
        "{p} the chat template is malformed",
        "{p} dataset contains zero usable samples",
        "{p} config value batch_size must be an integer",
    ),
    "io_error": (
        "{p} disk full while writing checkpoint-{n}",
        "{p} checkpoint upload failed: connection refused",
        "{p} model download interrupted (HTTP 502)",
        "{p} read-only filesystem, cannot save adapter",
        "{p} network unreachable while fetching the tokenizer",
        "{p} write error on /workspace: no space",
    ),
    "stalled": (
        "{p} collective op timed out on rank {d}",
        "{p} rank {d} never reached the barrier; timeout",
        "{p} training made no progress for {m} minutes",
        "{p} the job is hung waiting for peers",
        "{p} NCCL all-reduce stuck for {s}s",
        "{p} heartbeat from rank {d} missing; giving up",
    ),
    "completed": (
        "{p} training done: {N} steps",
        "{p} fine-tune completed successfully",
        "{p} saved final adapter, run complete",
        "{p} finished all epochs; exiting normally",
    ),
    "progressing": ("{p} step {n} loss {l:.3f}",),
}
_PARAPHRASE_PREFIX = ("ERROR:", "[fatal]", "!!", "E", "FAIL:", "error |", "[job]", "abort:")

_FRESH: dict[str, tuple[str, ...]] = {
    "oom": (
        '{{"level": "error", "msg": "gpu ran out of memory", "step": {n}}}',
        "trainer| worker died: out-of-memory (oom_score_adj), rss={g}G",
        "E {n} | cannot allocate {g} GiB on cuda:{d} (free {f} GiB)",
    ),
    "diverged": (
        '{{"level": "error", "msg": "loss is not finite", "step": {n}}}',
        "trainer| halting: gradient norm inf at update {n}",
        "E {n} | loss diverged ({l:.2f} -> {big:.1e})",
    ),
    "cuda_fault": (
        '{{"level": "error", "msg": "cuda device lost", "device": {d}}}',
        "trainer| fatal: GPU {d} not detected after reset",
        "E {n} | uncorrectable ECC error on GPU {d}; replacing node",
    ),
    "data_error": (
        '{{"level": "error", "msg": "invalid training example", "line": {n}}}',
        "trainer| fatal: dataset field 'messages' missing in row {n}",
        "E {n} | template rendering failed: undefined variable 'user'",
    ),
    "io_error": (
        '{{"level": "error", "msg": "checkpoint write failed: disk full", "step": {n}}}',
        "trainer| fatal: upload to bucket timed out after 5 attempts",
        "E {n} | failed to fetch weights: connection reset by peer",
    ),
    "stalled": (
        '{{"level": "error", "msg": "allreduce timed out", "rank": {d}}}',
        "trainer| fatal: no step finished in the last {m} minutes",
        "E {n} | rank {d} did not answer the barrier; giving up",
    ),
    "completed": (
        '{{"level": "info", "msg": "training finished", "steps": {N}}}',
        "trainer| done: run completed, adapter saved",
        "I {N} | all {N} steps done; final adapter exported",
    ),
    "progressing": ('{{"level": "info", "msg": "step", "step": {n}, "loss": {l:.4f}}}',),
}


def _worded_tail(
    r: Rng, state: str, words: dict[str, tuple[str, ...]], *, prefix: tuple[str, ...] = ("",)
) -> tuple[str, float]:
    total = r.choice((300, 1000, 4000))
    lines = [r.choice(("starting run", "job start", "train begin")) + f" on {r.choice(_GPUS)}", *_warnings(r)[:2]]
    for i in range(r.randint(2, 6)):
        lines.append(
            words["progressing"][0].format(
                p=r.choice(("[train]", "INFO", "I", "step")), n=(i + 1) * 10, l=r.uniform(0.5, 3)
            )
        )
    if state != "progressing":
        lines.append(
            r.choice(words[state]).format(
                p=r.choice(prefix),
                n=r.randint(10, 5000),
                N=total,
                l=r.uniform(0.5, 3),
                s=r.randint(300, 9000),
                g=round(r.uniform(0.5, 9), 2),
                f=round(r.uniform(0, 0.5), 2),
                d=r.randint(0, 7),
                big=r.uniform(1e6, 1e12),
                m=r.randint(30, 120),
            )
        )
    idle = r.uniform(0, 240) if state in ("progressing", "stalled") else r.uniform(0, 3000)
    return "\n".join(lines) + "\n", round(idle, 1)


def _generate_worded(
    seed: int,
    per_state: int,
    words: dict[str, tuple[str, ...]],
    *,
    framework: str,
    split: str,
    prefix: tuple[str, ...] = ("",),
) -> Iterator[dict[str, Any]]:
    r = random.Random(seed)
    n = 0
    for state in STATES:
        for _ in range(per_state):
            log, idle = _worded_tail(r, state, words, prefix=prefix)
            yield {
                "id": f"{split}-{framework}-{n:04d}",
                "log": log,
                "idle_seconds": idle,
                "state": state,
                "framework": framework,
                "split": split,
            }
            n += 1


def _generate(seed: int, frameworks: tuple[str, ...], per_cell: int, split: str) -> Iterator[dict[str, Any]]:
    r = random.Random(seed)
    n = 0
    for fw in frameworks:
        for state in STATES:
            for _ in range(per_cell):
                log, idle = _tail(r, fw, state)
                yield {
                    "id": f"{split}-{n:05d}",
                    "log": log,
                    "idle_seconds": idle,
                    "state": state,
                    "framework": fw,
                    "split": split,
                }
                n += 1


def handwritten(path: Path | None = None) -> list[dict[str, Any]]:
    """The hand-written excerpts (`=== <id> <state> [idle=S] [framework=F]` blocks)."""
    text = (path or data_file("handwritten.txt")).read_text(encoding="utf-8")
    rows: list[dict[str, Any]] = []
    for block in text.split("\n=== ")[1:]:
        head, _, body = block.partition("\n")
        parts = head.split()
        kv = dict(p.split("=", 1) for p in parts[2:] if "=" in p)
        rows.append(
            {
                "id": parts[0],
                "log": body,
                "idle_seconds": float(kv.get("idle", 60)),
                "state": parts[1],
                "framework": kv.get("framework", "mixed"),
                "split": "handwritten",
            }
        )
    return rows


def build(
    seed: int = 8, *, per_cell_train: int = 18, per_cell_eval: int = 5, per_cell_ood: int = 20
) -> dict[str, list[dict[str, Any]]]:
    """All splits; the same seed always yields the same rows."""
    return {
        "train": [
            *_generate(seed, FRAMEWORKS_TRAIN, per_cell_train, "train"),
            *_generate_worded(
                seed + 5000,
                per_cell_train * 2,
                _PARAPHRASE,
                framework="paraphrase",
                split="train",
                prefix=_PARAPHRASE_PREFIX,
            ),
        ],
        "eval": [
            *_generate(seed + 1000, FRAMEWORKS_TRAIN, per_cell_eval, "eval"),
            *_generate_worded(seed + 6000, per_cell_eval * 2, _FRESH, framework="fresh", split="eval"),
        ],
        "ood": [
            *_generate(seed + 2000, FRAMEWORKS_OOD, per_cell_ood, "ood"),
            *_generate_custom(seed + 3000, max(1, per_cell_ood // 2)),
            *_generate_wording(seed + 4000, max(1, per_cell_ood // 2)),
        ],
        "handwritten": handwritten(),
    }


def write_corpus(
    out_dir: Path, *, seed: int = 8, writer: Callable[[Path, list[dict[str, Any]]], None] | None = None
) -> dict[str, int]:
    """Write `<split>.jsonl` files; returns the row count per split."""
    out_dir.mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    for split, rows in build(seed).items():
        path = out_dir / f"{split}.jsonl"
        if writer is not None:
            writer(path, rows)
        else:
            with path.open("w", encoding="utf-8") as fh:
                for row in rows:
                    fh.write(json.dumps(row, ensure_ascii=False) + "\n")
        counts[split] = len(rows)
    return counts


# The real excerpts come in batches, each split into (dev, test) before any classifier ran on it.
REAL_BATCH_COUNT = 128  # DATA_DIR/real/dev{N}.jsonl and test{N}.jsonl for N = 1..128 (the first has no number)
REAL_BATCHES: tuple[tuple[str, str], ...] = tuple(
    (f"dev{n}", f"test{n}") if n > 1 else ("dev", "test") for n in range(1, REAL_BATCH_COUNT + 1)
)
REAL_SPLITS: tuple[str, ...] = tuple(split for batch in REAL_BATCHES for split in batch)


def real_rows(split: str = "test") -> list[dict[str, Any]]:
    """The verbatim excerpts from public issue threads (`DATA_DIR/real/<split>.jsonl`: dev may be
    tuned on, test never) as corpus-shaped rows: state = the label, split "real-<split>"."""
    path = data_file("real", f"{split}.jsonl")
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [
        {
            "id": r["id"],
            "log": r["log"],
            "idle_seconds": r.get("idle_seconds"),
            "state": r["label"],
            "split": f"real-{split}",
            "framework": r.get("framework", "?"),
        }
        for r in rows
    ]
