"""`tuneharness triage train-specialist` with no flags trains the shipped recipe."""

from __future__ import annotations

import dataclasses
import inspect
import json
from pathlib import Path

from app.cli.triage_cmd import train_specialist
from app.triage import training
from app.triage.training import TrainingPlan


def test_cli_defaults_are_the_training_plan_defaults() -> None:
    cli = {name: p.default for name, p in inspect.signature(train_specialist).parameters.items()}
    plan = {f.name: f.default for f in dataclasses.fields(TrainingPlan)}
    shared = sorted(set(cli) & set(plan) - {"seeds", "out_dir"})
    assert shared == [
        "corpus_seed",
        "learning_rate",
        "max_seq_len",
        "max_steps",
        "quantization",
        "real_batches",
        "real_dev_weight",
        "reuse",
    ]
    assert {k: cli[k] for k in shared} == {k: plan[k] for k in shared}
    assert cli["seeds"] == ",".join(str(s) for s in plan["seeds"])


def test_the_defaults_are_the_shipped_adapters_recipe() -> None:
    shipped = json.loads((Path(training.__file__).parent / "log_doctor" / "metrics.json").read_text())["job"]
    plan = TrainingPlan(out_dir=Path("unused"))
    assert (plan.max_steps, plan.max_seq_len, plan.learning_rate, plan.batch_size, plan.lora_r) == (
        shipped["max_steps"],
        shipped["max_seq_len"],
        shipped["learning_rate"],
        shipped["batch_size"],
        shipped["lora"]["r"],
    )
    assert plan.real_dev_weight == 3  # the data card's --real-dev-weight (not recorded in the job)
