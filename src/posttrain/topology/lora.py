"""LoRA in the planner: which of a model shape's linear layers get adapters, how many parameters the adapters train,
and what a weight sync sends. Pure arithmetic on ModelShape.

An adapter on a linear layer of weight [out, in] is A [r, in] and B [out, r]: r * (in + out) trainable parameters
(no biases; peft's default). The base weights stay frozen, so gradients and AdamW states exist only for A and B,
and the reference policy is the trainer's own base with the adapters off (no second copy of the weights)."""

from __future__ import annotations

from dataclasses import dataclass

from posttrain.errors import PosttrainError
from posttrain.topology.model_shape import ModelShape

ALL_LINEAR = "all-linear"


@dataclass(frozen=True)
class LoraShape:
    """What the planner needs of `model.lora`: rank, target modules (names or name suffixes, or 'all-linear'),
    input dropout (> 0 makes each adapter keep its own dropped-out copy of the input for backward), and what a
    sync sends ('merged': the adapted layers' merged weights; 'adapter': A and B only)."""

    r: int
    target_modules: tuple[str, ...] | str = ALL_LINEAR
    dropout: float = 0.0
    sync: str = "merged"


def linear_layers(shape: ModelShape) -> list[tuple[str, int, int]]:
    """Every linear layer of a Llama/Qwen2-style decoder as (module name, out features, in features), named as in
    transformers (`model.layers.3.self_attn.q_proj`, ..., `lm_head`)."""
    h, kv, i = shape.hidden, shape.kv_heads * shape.head_dim, shape.intermediate
    per_layer = [("self_attn.q_proj", h, h), ("self_attn.k_proj", kv, h), ("self_attn.v_proj", kv, h),
                 ("self_attn.o_proj", h, h)]
    per_layer += [("mlp.gate_proj", i, h)] if shape.gated_mlp else []
    per_layer += [("mlp.up_proj", i, h), ("mlp.down_proj", h, i)]
    out = [(f"model.layers.{n}.{name}", o, k) for n in range(shape.layers) for name, o, k in per_layer]
    return out + [("lm_head", shape.vocab, h)]


def _matches(module: str, target: str) -> bool:
    """peft's rule for a list of target names: the full name, or a suffix after a dot."""
    return module == target or module.endswith("." + target)


def adapted_layers(shape: ModelShape, target_modules: tuple[str, ...] | list[str] | str) -> list[tuple[str, int, int]]:
    """The linear layers that get adapters. 'all-linear' is every linear layer of the decoder but the LM head (as
    peft reads it); names match a module's full name or a suffix of it, so `q_proj` adapts every layer's query
    projection and `layers.0.self_attn.q_proj` only the first one's. A name that matches no linear layer is the
    user's error, and so is the LM head of a model whose head is tied to its input embedding."""
    layers = linear_layers(shape)
    if target_modules == ALL_LINEAR:
        return [x for x in layers if x[0] != "lm_head"]
    missing = [t for t in target_modules if not any(_matches(name, t) for name, _, _ in layers)]
    if missing:
        names = sorted({name.rsplit(".", 1)[-1] for name, _, _ in layers})
        raise PosttrainError(
            f"model.lora.target_modules: {missing} match no linear layer of {shape.name}",
            hint=f"name linear layers or suffixes of their names ({', '.join(names)}), or use all-linear",
        )
    chosen = [x for x in layers if any(_matches(x[0], t) for t in target_modules)]
    if shape.tied and any(name == "lm_head" for name, _, _ in chosen):  # refused by the trainer too (models/lora.py)
        raise PosttrainError(
            f"model.lora.target_modules adapts lm_head of {shape.name}, which is tied to the input embedding: the "
            "adapted head would untie them", hint="leave lm_head out of target_modules",
        )
    return chosen


def lora_trainable_params(shape: ModelShape, lora: LoraShape) -> int:
    """Adapter parameters: r * (in + out) per adapted [out, in] layer. Qwen2-0.5B, r=16, all-linear: 8,798,208."""
    return sum(lora.r * (o + i) for _, o, i in adapted_layers(shape, lora.target_modules))


def adapted_weight_params(shape: ModelShape, lora: LoraShape) -> int:
    """Base weight elements of the adapted layers (out * in each): what a merged sync sends, since merging changes
    exactly these matrices and nothing else."""
    return sum(o * i for _, o, i in adapted_layers(shape, lora.target_modules))


def lora_activation_elements_per_token(shape: ModelShape, lora: LoraShape) -> int:
    """Extra elements the adapters save for backward, per token over the whole model: A's output (r) for B's weight
    gradient at every adapted layer, and with dropout > 0 A's dropped-out input (in). A's undropped input is the
    base layer's input, already counted in memory.activation_elements_per_token."""
    return sum(lora.r + (i if lora.dropout > 0 else 0) for _, _, i in adapted_layers(shape, lora.target_modules))
