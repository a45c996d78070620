"""The job-file text the tests share: one tiny causal-LM training section, so each test's job file
spells out only what it is about (its needs, budget, gate)."""

from __future__ import annotations

__all__ = ["sim_needs_section", "train_section"]


def train_section(quantization: str = "none") -> str:
    """The `train:` block of a 20-step LoRA job on the tiny model in `model/` and `train.jsonl`."""
    return f"""\
train:
  base_model: model
  task: causal_lm
  train_file: train.jsonl
  max_steps: 20
  checkpoint_every: 10
  seed: 1
  learning_rate: 2.0e-4
  batch_size: 4
  max_seq_len: 64
  lora: {{r: 8, alpha: 16, target_modules: [q_proj, v_proj]}}
  quantization: {quantization}
"""


def sim_needs_section(*, standby_hosts: int | None = None) -> str:
    """The `needs:` block and budget of a job on the simulated marketplace's RTX 3090 hosts."""
    standby = f"  standby_hosts: {standby_hosts}\n" if standby_hosts is not None else ""
    return f"""\
needs:
  gpu: [RTX 3090]
  providers: [sim]
  disk_gb: 20
  download_gb: 3
  train_hours: 0.05
{standby}budget_usd: 5.0
"""
