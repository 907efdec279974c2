"""Packing prompt + completion token ids into padded tensors, and per-token logprobs of the completions."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from posttrain.algorithms.common import token_entropy, token_logprobs
from posttrain.training.packing import at_packed_completion_positions, pack_rows


@dataclass
class PackedBatch:
    input_ids: torch.Tensor       # [B, L] prompt + completion, right-padded with pad_id
    attention_mask: torch.Tensor  # [B, L]
    targets: torch.Tensor         # [B, T] completion tokens, right-padded
    completion_mask: torch.Tensor  # [B, T] 1 on the completion tokens trained on (all real ones, or the loss mask's)
    starts: torch.Tensor          # [B] index in input_ids of each completion's first token
    # The model runs over the sequences packed end to end (training/packing.py) instead of these padded rows.
    packed_rows: bool = False

    def select(self, idx: torch.Tensor) -> "PackedBatch":
        """The rows `idx` of this batch (a minibatch or a rank's share)."""
        return PackedBatch(
            self.input_ids[idx], self.attention_mask[idx], self.targets[idx], self.completion_mask[idx],
            self.starts[idx], self.packed_rows,
        )


def pack(prompts: list[list[int]], completions: list[list[int]], pad_id: int,
         loss_masks: list[list[int]] | None = None, packed_rows: bool = False) -> PackedBatch:
    """Right-pads each prompt+completion to the longest; position ids then start at 0 for every row.
    `loss_masks` (multi-turn episodes: one 0/1 per completion token, 1 = sampled by the engine) becomes the
    completion mask, so logprobs, entropy and every loss count sampled tokens only; the forward still runs over all
    tokens (environment and tool tokens are context). None: every completion token is trained. `packed_rows`: the
    forwards below run over the sequences packed end to end without padding (same outputs within float error)."""
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    if loss_masks is not None and [len(m) for m in loss_masks] != [len(c) for c in completions]:
        raise ValueError(f"loss masks of {[len(m) for m in loss_masks]} tokens for completions of "
                         f"{[len(c) for c in completions]} tokens: one mask entry per completion token")
    seqs = [p + c for p, c in zip(prompts, completions)]
    L = max(len(s) for s in seqs)
    T = max(1, max(len(c) for c in completions))
    B = len(seqs)
    input_ids = torch.full((B, L), pad_id, dtype=torch.long)
    attention = torch.zeros((B, L), dtype=torch.long)
    targets = torch.full((B, T), pad_id, dtype=torch.long)
    cmask = torch.zeros((B, T), dtype=torch.float32)
    for i, (p, c) in enumerate(zip(prompts, completions)):
        input_ids[i, : len(p) + len(c)] = torch.tensor(p + c, dtype=torch.long)
        attention[i, : len(p) + len(c)] = 1
        if c:
            targets[i, : len(c)] = torch.tensor(c, dtype=torch.long)
            cmask[i, : len(c)] = torch.tensor(loss_masks[i], dtype=torch.float32) if loss_masks is not None else 1.0
    starts = torch.tensor([len(p) for p in prompts], dtype=torch.long)
    return PackedBatch(input_ids, attention, targets, cmask, starts, packed_rows)


# Config fields of HF causal LMs that change the logits after the head (Gemma2/3 tanh softcapping, Cohere and Granite
# scaling, Falcon-H1's multiplier, Inkling's vocabulary trim; from every *ForCausalLM in transformers 5.19): when one
# is set, head(hidden) is not the model's logits.
LOGIT_POSTPROCESSING_FIELDS = (
    "final_logit_softcapping", "logits_soft_cap", "logit_scale", "logits_scaling", "lm_head_multiplier",
    "unpadded_vocab_size",
)


def split_head(model):
    """(body, head) such that model's logits are head(body(...).last_hidden_state), or None when the model cannot be
    split that way and its full forward must run. body: the transformer (`get_decoder()`); head: the nn.Linear LM
    head (`get_output_embeddings()`)."""
    if torch.distributed.is_available():
        from torch.distributed.fsdp import FSDPModule

        if isinstance(model, FSDPModule):
            return None  # FSDP gathers the root's weights (embeddings, head) in the root's forward: the body skips it
    configs = (model.config, model.config.get_text_config())
    if any(getattr(c, f, None) is not None for c in configs for f in LOGIT_POSTPROCESSING_FIELDS):
        return None
    body, head = model.get_decoder(), model.get_output_embeddings()
    # Only the plain `logits = self.lm_head(hidden)` layout: a head that is not lm_head (ModernBERT's decoder) or
    # not a bare Linear may hide more layers.
    if type(head) is not torch.nn.Linear or getattr(model, "lm_head", None) is not head or body is model:
        return None
    return body, head


def completion_logits(model, batch: PackedBatch, temperature: float = 1.0,
                      where: torch.Tensor | None = None) -> torch.Tensor:
    """Logits that predict each completion token: [B, T, V]. Position start+j-1 predicts completion token j.
    The transformer runs over all L positions but the LM head only over the B*T that predict completion tokens
    (the head is a [hidden, V] matmul per position, large against the body at vocabularies of tens of thousands);
    models that `split_head` cannot split run whole and have their logits gathered. `where` ([B, T] bool): the
    head at those positions only, [N, V] in row-major order."""
    split = split_head(model)
    if split is None:
        picked = full_forward_completion_logits(model, batch, where)
    else:
        body, head = split
        picked = head(forward_at_completion_positions(lambda **kw: body(**kw).last_hidden_state, batch, where))
    if temperature > 0 and temperature != 1.0:
        picked = picked / temperature
    return picked


def full_forward_completion_logits(model, batch: PackedBatch, where: torch.Tensor | None = None) -> torch.Tensor:
    """[B, T, V] logits, temperature 1, the slow way: the head over every position of prompt + completion (padded or
    packed rows), then the completion positions gathered. For models `split_head` cannot split, and the reference
    in tests and benchmarks."""
    return forward_at_completion_positions(lambda **kw: model(**kw).logits, batch, where)


def forward_at_completion_positions(forward, batch: PackedBatch, where: torch.Tensor | None = None) -> torch.Tensor:
    """`forward(**inputs)` -> [rows, columns, D] per-position outputs (hidden states, logits, values), returned at
    the positions that predict each completion token: [B, T, D]. Padded: over the batch's [B, L] rows with their
    attention mask. Packed (`batch.packed_rows`): over the sequences end to end with position ids restarting per
    sequence and no attention mask, which transformers turns into a block-diagonal causal mask (training/packing.py).
    No KV cache either way: with one, transformers skips the packed-sequence mask. `where` ([B, T] bool): only
    those positions, [N, D] in row-major order."""
    if not batch.packed_rows:
        out = forward(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
        picked = at_completion_positions(out, batch)
        return picked if where is None else picked[where]
    rows = pack_rows(batch.input_ids, batch.attention_mask.sum(1))
    out = forward(input_ids=rows.input_ids, position_ids=rows.position_ids, use_cache=False)
    return at_packed_completion_positions(out, rows, batch.starts, batch.targets.shape[1], where)


def at_completion_positions(per_position: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
    """[B, L, D] outputs over prompt+completion -> [B, T, D] at the positions that predict each completion token
    (start+j-1 for token j): the hidden state or logits that predict the token, or the value of the state before it."""
    T = batch.targets.shape[1]
    idx = (batch.starts.unsqueeze(1) - 1 + torch.arange(T).unsqueeze(0)).clamp(max=per_position.shape[1] - 1)
    return per_position.gather(1, idx.unsqueeze(-1).expand(-1, -1, per_position.shape[-1]))


def completion_logprobs(model, batch: PackedBatch, temperature: float = 1.0, with_entropy: bool = False):
    """Per-token logprobs [B, T] of the completion tokens (0 where masked), and optionally entropy [B, T]. Through
    the head in chunks (`head_logprobs`) wherever the model's head splits off; else the whole [B, T, V] logits."""
    if batch.packed_rows or split_head(model) is not None:
        return trained_token_logprobs(model, batch, temperature, with_entropy)
    logits = completion_logits(model, batch, temperature)
    lp = token_logprobs(logits, batch.targets) * batch.completion_mask
    if with_entropy:
        return lp, token_entropy(logits.detach()) * batch.completion_mask
    return lp


def trained_token_logprobs(model, batch: PackedBatch, temperature: float = 1.0, with_entropy: bool = False):
    """`completion_logprobs` with the head and the softmax over the N trained tokens only ([N, V], not [B, T, V]
    with the completion padding and the masked tokens, whose values the mask zeroes anyway), scattered back to
    [B, T]. What packed rows run; padded rows can too (benchmarks/packing.py measures the two levers apart)."""
    where = batch.completion_mask != 0
    mask = batch.completion_mask[where]
    split = split_head(model)
    if split is None:
        logits = completion_logits(model, batch, temperature, where)
        trained = token_logprobs(logits, batch.targets[where])
        entropy = token_entropy(logits.detach()) if with_entropy else None
    else:
        body, head = split
        hidden = forward_at_completion_positions(lambda **kw: body(**kw).last_hidden_state, batch, where)
        trained, entropy = head_logprobs(head, hidden, batch.targets[where], temperature, with_entropy)
    trained = trained * mask
    zeros = torch.zeros(where.shape, dtype=trained.dtype)  # float32, or float64 under model.dtype=float64
    lp = zeros.masked_scatter(where, trained)
    if with_entropy:
        return lp, zeros.masked_scatter(where, entropy * mask)
    return lp


# Tokens whose [tokens, vocabulary] logits exist at once in `head_logprobs`: 512 x 49,152 (SmolLM2's vocabulary) x
# 4 bytes = 0.1 GB a tensor, where a step's 64 completions of 60 tokens would hold 0.75 GB in each of the logits,
# their log-softmax and the gradient, kept for the backward.
HEAD_CHUNK_TOKENS = 512


def _chunk_logprobs(head, hidden: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool):
    logits = head(hidden)
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    entropy = token_entropy(logits.detach()) if with_entropy else torch.zeros(0, dtype=logits.dtype)
    return token_logprobs(logits, targets), entropy


def head_logprobs(head, hidden: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                  with_entropy: bool = False, chunk: int | None = None):
    """The LM head, log-softmax and the target's logprob over [N, D] hidden states in chunks of `chunk` tokens
    (default HEAD_CHUNK_TOKENS):
    ([N] logprobs, [N] entropies or None). With gradients on, each chunk is checkpointed: the backward recomputes
    its logits from the chunk's hidden states instead of keeping [N, V] logits and log-softmax from the forward, so
    at most one chunk's [chunk, V] tensors exist at a time (the recompute costs one more head matmul per chunk).
    The gradients are the unchunked path's (tested in float64)."""
    from torch.utils.checkpoint import checkpoint

    chunk = chunk or HEAD_CHUNK_TOKENS  # read at call time: the tests set a small one
    grads = torch.is_grad_enabled() and (hidden.requires_grad or any(p.requires_grad for p in head.parameters()))
    parts = []
    for s in range(0, hidden.shape[0], chunk):
        args = (head, hidden[s:s + chunk], targets[s:s + chunk], temperature, with_entropy)
        parts.append(checkpoint(_chunk_logprobs, *args, use_reentrant=False) if grads else _chunk_logprobs(*args))
    if not parts:
        empty = hidden.new_zeros(0)
        return empty, (empty if with_entropy else None)
    lp = torch.cat([p[0] for p in parts])
    return lp, (torch.cat([p[1] for p in parts]) if with_entropy else None)
