"""A plain `transformers.Trainer` LoRA fine-tune, written as anyone would, with nothing of tuneharness
in it: run as a `command` job (docs/byo-training.md), it is sliced, checkpointed and resumed.

    python hf_trainer_sft.py --model MODEL_DIR --data train.jsonl --out out --max-steps 40
"""

from __future__ import annotations

import argparse
import json

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments, set_seed


class Rows(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Prompt + completion rows, tokenized and padded; only completion tokens carry loss."""

    def __init__(self, path: str, tokenizer: object, max_len: int) -> None:
        self.items = []
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0  # type: ignore[attr-defined]
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
        for line in lines:
            row = json.loads(line)
            prompt = tokenizer(row["prompt"])["input_ids"]  # type: ignore[operator]
            completion = tokenizer(row["completion"])["input_ids"]  # type: ignore[operator]
            ids = (prompt + completion)[:max_len]
            labels = ([-100] * len(prompt) + completion)[:max_len]
            n = len(ids)
            self.items.append(
                {
                    "input_ids": torch.tensor(ids + [pad] * (max_len - n)),
                    "attention_mask": torch.tensor([1] * n + [0] * (max_len - n)),
                    "labels": torch.tensor(labels + [-100] * (max_len - n)),
                }
            )

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.items[i]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--out", default="out")
    p.add_argument("--max-steps", type=int, default=40)
    p.add_argument("--save-steps", type=int, default=8)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    set_seed(a.seed)  # before the adapter's random init: two runs of the script start alike
    tokenizer = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1, target_modules=["q_proj", "v_proj"]))
    args = TrainingArguments(
        output_dir=a.out,
        max_steps=a.max_steps,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        learning_rate=1e-2,
        lr_scheduler_type="cosine",
        warmup_steps=2,
        save_steps=a.save_steps,
        save_total_limit=2,
        logging_steps=1,
        seed=a.seed,
        report_to="none",
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=Rows(a.data, tokenizer, 64))
    trainer.train()
    trainer.save_model(a.out + "/final")


if __name__ == "__main__":
    main()
