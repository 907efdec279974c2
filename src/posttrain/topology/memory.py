"""Per-role memory in bytes: weights, training states, activations, KV cache. Pure arithmetic.

Sources (see /work/shared/reference/cost-and-memory-facts.md): mixed-precision Adam keeps 16 bytes per parameter
(2 weights + 2 gradients + 12 fp32 master, momentum, variance), divided across N ranks under ZeRO-3 / FSDP
(Rajbhandari et al., arXiv:1910.02054); activations counted per saved tensor of a Llama-style layer (Korthikanti et
al., arXiv:2205.05198 give the GPT/Megatron count, kept here for comparison); KV cache 2*layers*kv_heads*head_dim*bytes per token."""

from __future__ import annotations

from posttrain.topology.model_shape import ModelShape

BYTES_PER_ELEMENT = {"float32": 4, "bfloat16": 2, "float16": 2}
# Training states per parameter: weights + gradients + Adam moments (+ fp32 master copy for 16-bit weights).
# float32: 4 + 4 + 4 + 4 = 16; bf16/fp16 mixed precision: 2 + 2 + (4 master + 4 + 4) = 16.
TRAIN_STATE_BYTES = {"float32": 16, "bfloat16": 16, "float16": 16}


def weight_bytes(shape: ModelShape, dtype: str) -> float:
    return shape.params * BYTES_PER_ELEMENT[dtype]


def train_state_bytes(shape: ModelShape, dtype: str, shards: int = 1) -> float:
    """Weights, gradients and optimizer states per device, fully sharded over `shards` ranks (FSDP / ZeRO-3)."""
    return shape.params * TRAIN_STATE_BYTES[dtype] / shards


def adapter_state_bytes(trainable: int, dtype: str, shards: int = 1) -> float:
    """LoRA adapters' weights, gradients and AdamW states per device: TRAIN_STATE_BYTES per trainable parameter
    (peft keeps adapters in fp32 under a 16-bit base: 4 + 4 + 8 = 16). The frozen base beside them costs only
    weight_bytes: no gradients, no optimizer states, no fp32 master copy."""
    return trainable * TRAIN_STATE_BYTES[dtype] / shards


def activation_elements_per_token(shape: ModelShape) -> int:
    """Elements one decoder layer saves for backward per token, for a Llama-style layer (RMSNorm, fused
    attention that keeps no s*s scores, SwiGLU MLP, no dropout): the inputs of the two norms, of q/k/v, of o_proj
    and of gate/up (h each: 5h), rotated q and the attention output (2h), k and v (2*kv_dim), and in the MLP the
    gate and up outputs, the activation and the down_proj input (4i; 2i without a gate), plus the residual
    stream (h): 8h + 2*kv_dim + 4i."""
    kv = shape.kv_heads * shape.head_dim
    return 8 * shape.hidden + 2 * kv + (4 if shape.gated_mlp else 2) * shape.intermediate


def activation_bytes(shape: ModelShape, seq_len: int, micro_batch: int, dtype: str, checkpointing: bool) -> float:
    """Activations kept for the backward pass of one micro-batch: per layer and token
    activation_elements_per_token elements (only the layer input, h, with full recomputation), plus the fp32
    logits s*b*vocab*4 that the loss keeps. (Megatron's s*b*h*(34 + 5*a*s/h) -- megatron_activation_bytes -- counts
    unfused attention scores and dropout masks, which the models here do not have.)"""
    tokens = seq_len * micro_batch
    per_token = shape.hidden if checkpointing else activation_elements_per_token(shape)
    return shape.layers * tokens * per_token * BYTES_PER_ELEMENT[dtype] + tokens * shape.vocab * 4


def megatron_activation_bytes(shape: ModelShape, seq_len: int, micro_batch: int, checkpointing: bool) -> float:
    """Korthikanti et al. (arXiv:2205.05198), 16-bit, no parallelism: s*b*h*(34 + 5*a*s/h) per layer, 2*s*b*h with
    full recomputation (GPT layers: unfused attention, dropout)."""
    s, b, h, a = seq_len, micro_batch, shape.hidden, shape.heads
    return shape.layers * (2 * s * b * h if checkpointing else s * b * h * (34 + 5 * a * s / h))


def forward_activation_bytes(shape: ModelShape, seq_len: int, micro_batch: int, dtype: str) -> float:
    """Forward-only working set (no graph kept): one layer's activations at a time plus the fp32 logits."""
    tokens = seq_len * micro_batch
    return tokens * (activation_elements_per_token(shape) * BYTES_PER_ELEMENT[dtype] + shape.vocab * 4)


def kv_bytes_per_token(shape: ModelShape, dtype: str) -> float:
    """2 (K and V) * layers * kv_heads * head_dim * bytes. Llama-3.1-8B bf16: 2*32*8*128*2 = 131,072."""
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * BYTES_PER_ELEMENT[dtype]


def kv_cache_bytes(shape: ModelShape, dtype: str, concurrent_tokens: int) -> float:
    return kv_bytes_per_token(shape, dtype) * concurrent_tokens
