"""Logprobs and entropies through the LM head in chunks (training/batch.py::head_logprobs): equal to the whole
[tokens, vocabulary] computation in value and in gradient (float64, F64_TOL: tests/numerics_bounds.py), for padded
and packed rows, tied and untied heads; and with gradients on, no tensor of [tokens, vocabulary] is kept for the
backward, only one chunk's at a time while it is recomputed."""

from __future__ import annotations

import pytest
import torch
from numerics_bounds import assert_same

from posttrain.algorithms.common import token_entropy, token_logprobs
from posttrain.models.loading import load_causal_lm
from posttrain.models.tiny import build_tiny_model
from posttrain.training.batch import completion_logits, completion_logprobs, head_logprobs, pack, split_head

PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14]]
COMPLETIONS = [[20, 21, 22, 23, 24], [25, 26], [27, 28, 29], [30, 31, 32, 33, 34, 35]]
TEMPERATURE = 0.7


@pytest.fixture(scope="module", params=[("qwen2", False), ("llama", True)], ids=["qwen2-untied", "llama-tied"])
def model(request, tmp_path_factory):
    arch, tied = request.param
    path = build_tiny_model(tmp_path_factory.mktemp("m") / arch, "1m", arch=arch, tie_word_embeddings=tied)
    model, tok = load_causal_lm(path, "float64")
    return model, tok.pad_token_id


def _whole(model, batch):
    """The unchunked reference: [B, T, V] logits at the completion positions, log-softmax over all of them."""
    logits = completion_logits(model, batch, TEMPERATURE)
    return token_logprobs(logits, batch.targets) * batch.completion_mask, token_entropy(logits.detach()) * batch.completion_mask


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_chunks_give_the_whole_computations_values_and_gradients(model, packed):
    model, pad = model
    batch = pack(PROMPTS, COMPLETIONS, pad)
    batch.packed_rows = packed
    weights = torch.linspace(-1.0, 2.0, batch.targets.numel(), dtype=torch.float64).view_as(batch.targets)

    def run(fn):
        model.zero_grad(set_to_none=True)
        lp, ent = fn()
        (lp * weights).sum().backward()
        return lp.detach(), ent, {n: p.grad.clone() for n, p in model.named_parameters()}

    model.train()
    try:
        import posttrain.training.batch as batch_module

        chunk = batch_module.HEAD_CHUNK_TOKENS
        batch_module.HEAD_CHUNK_TOKENS = 3  # 16 tokens in chunks of 3: five full chunks and a last of 1
        try:
            chunked = run(lambda: completion_logprobs(model, batch, TEMPERATURE, with_entropy=True))
        finally:
            batch_module.HEAD_CHUNK_TOKENS = chunk
        whole = run(lambda: _whole(model, batch))
    finally:
        model.eval()
        model.zero_grad(set_to_none=True)
    for got, want, what in zip(chunked, whole, ("logprobs", "entropies", "gradients")):
        assert_same(got, want, what)
    assert max(float(g.abs().max()) for g in chunked[2].values()) > 1e-3  # the loss does reach the weights


def test_no_tokens_by_vocabulary_tensor_is_kept_for_the_backward(model):
    model, pad = model
    body, head = split_head(model)
    hidden = torch.randn(40, head.in_features, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, head.out_features, (40,))
    saved = []

    def keep(t):
        saved.append(tuple(t.shape))
        return t

    def rows_of_logits() -> int:
        """The most token rows of any [rows, V] tensor kept for the backward (logits, log-softmax)."""
        return max([shape[0] for shape in saved if len(shape) == 2 and shape[1] == head.out_features
                    and shape[0] != head.in_features] or [0])  # [D, V]: the head's weight, transposed

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        lp, _ = head_logprobs(head, hidden, targets, chunk=8)
    assert rows_of_logits() == 0  # checkpointed: the chunks keep their hidden states only
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        whole = token_logprobs(head(hidden), targets)
    assert rows_of_logits() == 40  # the same hook sees the unchunked path keep all 40 tokens' logits
    assert_same(lp, whole, "logprobs")


def test_sft_loss_through_the_chunked_head_equals_the_whole_logits_loss(model, monkeypatch):
    """SFT's loss (training/sft.py::sft_batch_loss) over right-padded rows with prompt and padding masked out: the
    chunked head gives the whole [B, T, V] computation's loss and gradients."""
    import posttrain.training.batch as batch_module
    import posttrain.training.sft as sft_module
    from posttrain.training.sft import pack_examples, sft_batch_loss, sft_loss

    model, pad = model
    examples = [(p + c, [0] * len(p) + [1] * len(c)) for p, c in zip(PROMPTS, COMPLETIONS)]
    ids, mask = pack_examples(examples, pad)
    lengths = torch.tensor([len(x) for x, _ in examples])
    attention = (torch.arange(ids.shape[1])[None, :] < lengths[:, None]).long()

    def run(loss_fn):
        model.zero_grad(set_to_none=True)
        loss = loss_fn()
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    calls = []
    real = batch_module.head_logprobs
    monkeypatch.setattr(sft_module, "head_logprobs", lambda *a, **k: calls.append(1) or real(*a, **k))
    run(lambda: sft_batch_loss(model, ids, attention, mask))
    assert not calls  # a tiny vocabulary's logits are far under WHOLE_LOGITS_MAX_BYTES: taken whole, as before
    monkeypatch.setattr(sft_module, "WHOLE_LOGITS_MAX_BYTES", 0)  # every batch through the chunked head
    monkeypatch.setattr(batch_module, "HEAD_CHUNK_TOKENS", 3)  # 16 target tokens in chunks of 3: five of 3 and one of 1
    chunked = run(lambda: sft_batch_loss(model, ids, attention, mask))
    assert calls
    whole = run(lambda: sft_loss(model(input_ids=ids, attention_mask=attention).logits, ids, mask))
    model.zero_grad(set_to_none=True)
    assert_same(chunked[0], whole[0], "loss")
    assert_same(chunked[1], whole[1], "gradients")
    assert max(float(g.abs().max()) for g in chunked[1].values()) > 1e-3
