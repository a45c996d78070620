"""An axolotl LoRA config as a `command` job, on the CPU, where axolotl installs (it is heavy and pins
its own transformers, so it is not in the dev extras): the injected callback caps a slice on a
complete checkpoint, and a run resumed from that checkpoint in slices ends with the adapter of the
same run resumed without slicing."""

from __future__ import annotations

import importlib.util
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.byo import max_abs_diff, run_slice
from trainer.checkpoint import find_latest, verify
from trainer.exitcodes import EXIT_CAP, EXIT_FINISHED

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("axolotl") is None, reason="axolotl is not installed here"),
]

CONFIG = """\
base_model: ./base_model
model_type: AutoModelForCausalLM
tokenizer_type: AutoTokenizer
datasets:
  - path: train.jsonl
    ds_type: json
    type: completion
dataset_prepared_path: ./prepared
val_set_size: 0
adapter: lora
lora_r: 4
lora_alpha: 8
lora_dropout: 0.0
lora_target_modules: [q_proj, v_proj]
sequence_len: 64
sample_packing: false
micro_batch_size: 4
gradient_accumulation_steps: 2
max_steps: 12
learning_rate: 0.01
optimizer: adamw_torch
lr_scheduler: cosine
output_dir: ./out
save_steps: 4
logging_steps: 1
seed: 1
bf16: false
fp16: false
tf32: false
"""

JOB = {
    "kind": "command",
    "command": ["accelerate", "launch", "--cpu", "--num_processes", "1", "-m", "axolotl.cli.train", "cfg.yml"],
    "max_steps": 12,
    "adapter_meta": {"base_model": "base_model"},
}


def _host(root: Path, name: str, model: Path) -> Path:
    d = root / name
    d.mkdir()
    (d / "base_model").symlink_to(model)
    rows = [{"text": f"w{i} x{i % 7} -> x{i % 7} w{i}"} for i in range(64)]
    (d / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "cfg.yml").write_text(CONFIG)
    (d / "job.json").write_text(json.dumps(JOB))
    return d


def test_an_axolotl_run_resumed_in_slices_equals_the_same_run_resumed_whole(
    tmp_path: Path, tiny_model: Path, trainer_env: Callable[..., dict[str, str]]
) -> None:
    """Slice 1 caps at step 5 on a verified checkpoint; from it, one host finishes in one go and
    another in slices of 3 steps: the two adapters are equal."""
    env = trainer_env()
    first = _host(tmp_path, "first", tiny_model)
    assert run_slice(first, env, "--slice-steps", "5", timeout_s=900) == EXIT_CAP
    latest = find_latest(first / "checkpoints")
    assert latest is not None and latest.step == 5 and verify(latest.path)["kind"] == "checkpoint"
    whole, sliced = _host(tmp_path, "whole", tiny_model), _host(tmp_path, "sliced", tiny_model)
    for d in (whole, sliced):
        shutil.copytree(latest.path, d / "checkpoints" / latest.path.name)
    assert run_slice(whole, env, timeout_s=900) == EXIT_FINISHED
    codes = [run_slice(sliced, env, "--slice-steps", "3", timeout_s=900) for _ in range(3)]
    assert codes == [EXIT_CAP, EXIT_CAP, EXIT_FINISHED]
    assert max_abs_diff(whole / "adapter", sliced / "adapter") == 0.0
