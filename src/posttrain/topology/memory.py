"""Per-role memory in bytes: weights, training states, activations, KV cache. Pure arithmetic.

Sources (see /work/shared/reference/cost-and-memory-facts.md): mixed-precision Adam keeps 16 bytes per parameter
(2 weights + 2 gradients + 12 fp32 master, momentum, variance), divided across N ranks under ZeRO-3 / FSDP
(Rajbhandari et al., arXiv:1910.02054); activations per layer s*b*h*(34 + 5*a*s/h) bytes at 16 bits, 2*s*b*h with
full recomputation (Korthikanti et al., arXiv:2205.05198); KV cache 2*layers*kv_heads*head_dim*bytes per token."""

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


def activation_bytes(shape: ModelShape, seq_len: int, micro_batch: int, dtype: str, checkpointing: bool) -> float:
    """Activations kept for the backward pass of one micro-batch: per layer s*b*h*(34 + 5*a*s/h) bytes at 16 bits
    (2*s*b*h with full recomputation), scaled by bytes per element / 2, plus the fp32 logits s*b*vocab*4 which the
    loss keeps (large for big vocabularies)."""
    s, b, h, a = seq_len, micro_batch, shape.hidden, shape.heads
    per_layer_16bit = 2 * s * b * h if checkpointing else s * b * h * (34 + 5 * a * s / h)
    scale = BYTES_PER_ELEMENT[dtype] / 2
    return shape.layers * per_layer_16bit * scale + s * b * shape.vocab * 4


def forward_activation_bytes(shape: ModelShape, seq_len: int, micro_batch: int, dtype: str) -> float:
    """Forward-only working set (no graph kept): one layer's activations at a time plus the fp32 logits."""
    s, b, h, a = seq_len, micro_batch, shape.hidden, shape.heads
    return s * b * h * (34 + 5 * a * s / h) * BYTES_PER_ELEMENT[dtype] / 2 + s * b * shape.vocab * 4


def kv_bytes_per_token(shape: ModelShape, dtype: str) -> float:
    """2 (K and V) * layers * kv_heads * head_dim * bytes. Llama-3.1-8B bf16: 2*32*8*128*2 = 131,072."""
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * BYTES_PER_ELEMENT[dtype]


def kv_cache_bytes(shape: ModelShape, dtype: str, concurrent_tokens: int) -> float:
    return kv_bytes_per_token(shape, dtype) * concurrent_tokens
