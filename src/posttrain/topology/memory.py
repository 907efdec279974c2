"""Per-role memory in bytes: weights, training states, activations, KV cache. Pure arithmetic.

Sources (see /work/shared/reference/cost-and-memory-facts.md): mixed-precision Adam keeps 16 bytes per parameter
(2 weights + 2 gradients + 12 fp32 master, momentum, variance), divided across N ranks under ZeRO-3 / FSDP
(Rajbhandari et al., arXiv:1910.02054); activations counted per saved tensor of a Llama-style layer (Korthikanti et
al., arXiv:2205.05198 give the GPT/Megatron count, kept here for comparison); KV cache 2*layers*kv_heads*head_dim*bytes per token."""

from __future__ import annotations

from posttrain.topology.model_shape import ModelShape

BYTES_PER_ELEMENT = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}
# Training states per parameter: weights + gradients + Adam moments (+ fp32 master copy for 16-bit weights).
# float32: 4 + 4 + 4 + 4 = 16; bf16/fp16 mixed precision: 2 + 2 + (4 master + 4 + 4) = 16.
TRAIN_STATE_BYTES = {"float32": 16, "bfloat16": 16, "float16": 16, "float64": 32}  # float64: numerics checks


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
    return body_activation_bytes(shape, tokens, dtype, checkpointing) + tokens * shape.vocab * 4


def body_activation_bytes(shape: ModelShape, tokens: int, dtype: str, checkpointing: bool) -> float:
    """What the decoder layers keep for the backward over `tokens` tokens: activation_elements_per_token per layer
    and token (the layer input, h, with full recomputation). Measured on SmolLM2-135M in float32 (saved-tensor
    hooks, sdpa attention): 11,198 elements a layer and token against 11,136 here; the rest is the embeddings' and
    the final norm's."""
    per_token = shape.hidden if checkpointing else activation_elements_per_token(shape)
    return shape.layers * tokens * per_token * BYTES_PER_ELEMENT[dtype]


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


# The CPU trainer's process before its model: Python, torch, transformers and Ray's worker (resident bytes).
TRAINER_PROCESS_BYTES = 0.6e9


def head_chunk_bytes(shape: ModelShape, chunk_tokens: int) -> float:
    """The chunked LM head's working set (training/batch.py::head_logprobs): one chunk's float32 [chunk, vocab]
    logits, log-softmax and their gradient at a time, instead of the whole batch's logits."""
    return 3 * chunk_tokens * shape.vocab * 4


def cpu_trainer_peak_bytes(shape: ModelShape, micro_batch_tokens: int, dtype: str, checkpointing: bool,
                           chunk_tokens: int) -> dict[str, float]:
    """The single CPU trainer's peak resident bytes in a step of a run (from its second step on, when AdamW's
    states exist), by part: the process, weights + gradients + AdamW states, the activations one micro-batch of
    `micro_batch_tokens` tokens keeps for its backward (with checkpointing, plus one layer's recomputed ones), and
    the chunked head's working set. Sum them for the peak."""
    body = body_activation_bytes(shape, micro_batch_tokens, dtype, checkpointing)
    if checkpointing:
        body += body_activation_bytes(shape, micro_batch_tokens, dtype, False) / shape.layers
    return {"process": TRAINER_PROCESS_BYTES, "train_states": train_state_bytes(shape, dtype),
            "activations": body, "head": head_chunk_bytes(shape, min(chunk_tokens, micro_batch_tokens))}
