"""A model's shape read from its HF config (a model directory or a config.json) without loading weights, and its
parameter count worked out from the shape (decoder-only transformers: Llama, Qwen2, Mistral and kin)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from posttrain.errors import PosttrainError

# Architectures whose q/k/v projections carry a bias even when the config has no `attention_bias` key.
_QKV_BIAS_TYPES = {"qwen2"}


@dataclass(frozen=True)
class ModelShape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool = False
    qkv_bias: bool = False
    gated_mlp: bool = True  # SwiGLU: gate, up and down projections
    name: str = "model"

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def params(self) -> int:
        """Parameter count. Per layer: q and o are h*h each, k and v are h*kv_heads*head_dim each (+ biases), the
        MLP 3*h*i (gated) or 2*h*i, two RMSNorm weights of h. Plus embeddings v*h, a final norm h, and an output
        head v*h unless tied."""
        h, kv = self.hidden, self.kv_heads * self.head_dim
        attn = 2 * h * h + 2 * h * kv + ((h + 2 * kv) if self.qkv_bias else 0)
        mlp = (3 if self.gated_mlp else 2) * h * self.intermediate
        per_layer = attn + mlp + 2 * h
        return self.vocab * h + self.layers * per_layer + h + (0 if self.tied else self.vocab * h)


def shape_from_config(cfg: dict, name: str = "model") -> ModelShape:
    """ModelShape from an HF config dict (keys as in LlamaConfig / Qwen2Config)."""
    try:
        heads = int(cfg["num_attention_heads"])
        return ModelShape(
            hidden=int(cfg["hidden_size"]),
            layers=int(cfg["num_hidden_layers"]),
            heads=heads,
            kv_heads=int(cfg.get("num_key_value_heads") or heads),
            intermediate=int(cfg["intermediate_size"]),
            vocab=int(cfg["vocab_size"]),
            tied=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=bool(cfg.get("attention_bias", cfg.get("model_type") in _QKV_BIAS_TYPES)),
            name=name,
        )
    except KeyError as e:
        raise PosttrainError(
            f"model config {name}: missing key {e.args[0]!r}",
            hint="give a decoder-only HF config.json with hidden_size, num_hidden_layers, num_attention_heads, "
            "intermediate_size and vocab_size",
        ) from None


def read_model_shape(path: str | Path) -> ModelShape:
    """Reads <dir>/config.json or a config.json path; no weights are needed."""
    p = Path(path)
    file = p / "config.json" if p.is_dir() else p
    if not file.is_file():
        raise PosttrainError(f"model config {file} does not exist", hint="pass a model directory or its config.json")
    try:
        data = json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise PosttrainError(f"model config {file} is not valid JSON at line {e.lineno}: {e.msg}") from None
    if "text_config" in data and "hidden_size" not in data:  # multimodal wrappers keep the LM under text_config
        data = {**data["text_config"], "model_type": data["text_config"].get("model_type")}
    return shape_from_config(data, name=str(path))
