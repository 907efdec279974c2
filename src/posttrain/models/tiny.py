"""The built-in tiny-model factory: a Qwen2- or Llama-style causal LM from a config, randomly initialised, with a
locally built tokenizer, written as a real HF directory (config.json, model.safetensors, tokenizer files) that
transformers and vLLM both load. Embeddings are untied by default (tied ones are supported for tests of the
weight-sync trap)."""

from __future__ import annotations

from pathlib import Path

from posttrain.models.tokenizer import EOS, PAD, VOCAB, save_char_tokenizer

# name -> (hidden, layers, heads, kv_heads, intermediate); the vocabulary is the tokenizer's (46 characters by default).
TINY_SIZES: dict[str, tuple[int, int, int, int, int]] = {
    "1m": (128, 4, 4, 4, 512),      # ~0.8M: the demo model (measured to learn addition in minutes on 2 cores)
    "4m": (256, 4, 4, 4, 1024),     # ~4.2M
    "80m": (768, 10, 12, 12, 3072),  # ~78M: the size TRL's CPU step time was measured on
}


def build_tiny_model(
    out_dir: str | Path,
    size: str = "1m",
    *,
    arch: str = "qwen2",
    tie_word_embeddings: bool = False,
    seed: int = 0,
    max_position_embeddings: int = 128,
    tokenizer=None,
    attention_bias: bool = False,
) -> Path:
    """Writes a randomly initialised model directory and returns its path. `tokenizer` (a transformers tokenizer,
    e.g. from models/bpe.py) replaces the character tokenizer: its length sets the vocabulary, its pad and eos the
    model's ids, and it is saved beside the weights. `attention_bias` (llama only; qwen2 always has q/k/v biases)
    adds biases to the attention projections."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, LlamaConfig, Qwen2Config

    if size not in TINY_SIZES:
        raise ValueError(f"unknown tiny size {size!r}; choose one of {sorted(TINY_SIZES)}")
    hidden, layers, heads, kv_heads, inter = TINY_SIZES[size]
    if tokenizer is None:
        vocab, pad_id, eos_id = len(VOCAB), VOCAB.index(PAD), VOCAB.index(EOS)
    else:
        vocab, pad_id, eos_id = len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id
    common = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=inter,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        bos_token_id=eos_id,
        rms_norm_eps=1e-6,
        dtype="float32",
    )
    if arch == "qwen2":
        config = Qwen2Config(**common, rope_theta=10000.0)
    elif arch == "llama":
        config = LlamaConfig(**common, attention_bias=attention_bias)
    else:
        raise ValueError(f"unknown arch {arch!r}; choose 'qwen2' or 'llama'")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    GenerationConfig(eos_token_id=common["eos_token_id"], pad_token_id=common["pad_token_id"]).save_pretrained(str(out))
    if tokenizer is None:
        save_char_tokenizer(out)
    else:
        tokenizer.save_pretrained(str(out))
    return out
