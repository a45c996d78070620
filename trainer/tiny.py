"""A tiny random causal LM (Qwen2 architecture) with a byte-level tokenizer, written with no downloads.

For tests, the demo and the benchmark: a few hundred thousand parameters, 4-bit quantizable.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["write_tiny_causal_lm"]

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def write_tiny_causal_lm(
    path: str | Path,
    *,
    hidden_size: int = 64,
    layers: int = 2,
    seed: int = 0,
    intermediate_size: int | None = None,
    heads: int = 4,
    kv_heads: int = 2,
    max_positions: int = 512,
) -> Path:
    """Write a random Qwen2 causal LM and its tokenizer to `path`; return the path.

    The defaults are tiny; `bench/gpu.py` asks for a Qwen2.5-0.5B-shaped body (the byte-level
    vocabulary stays) to measure an NF4 slice at a size a GPU notices.
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    for special in ("<|endoftext|>", "<|pad|>"):
        vocab[special] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|pad|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)

    config = Qwen2Config(
        vocab_size=len(vocab),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size if intermediate_size is not None else 2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        eos_token_id=vocab["<|endoftext|>"],
        pad_token_id=vocab["<|pad|>"],
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    gen = torch.random.fork_rng()
    with gen:
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.save_pretrained(out)
    return out
