"""A TRL `SFTTrainer` LoRA run on prompt/completion rows, with nothing of tuneharness in it: run as a
`command` job (docs/byo-training.md), it is sliced, checkpointed and resumed.

    python trl_sft.py --model MODEL_DIR --data train.jsonl --out out --max-steps 40
"""

from __future__ import annotations

import argparse

from datasets import load_dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer, set_seed
from trl import SFTConfig, SFTTrainer


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--out", default="out")
    p.add_argument("--max-steps", type=int, default=40)
    p.add_argument("--save-steps", type=int, default=8)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    set_seed(a.seed)
    rows = load_dataset("json", data_files=a.data, split="train")
    tokenizer = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model)
    config = SFTConfig(
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
        max_length=64,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = SFTTrainer(model=model, args=config, train_dataset=rows, processing_class=tokenizer, peft_config=lora)
    trainer.train()
    trainer.save_model(a.out + "/final")


if __name__ == "__main__":
    main()
