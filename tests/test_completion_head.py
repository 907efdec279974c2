"""The LM head at completion positions only (`training/batch.py::completion_logits`): logprobs, entropies and
gradients equal those of the full forward (every position through the head, then gathered), and models whose head
cannot be split off (logit softcapping, FSDP-wrapped) take the full forward."""

from __future__ import annotations

import pytest
import torch

from posttrain.algorithms.common import token_entropy, token_logprobs
from posttrain.models.loading import load_causal_lm
from posttrain.models.tiny import build_tiny_model
from posttrain.training.batch import (
    at_completion_positions, completion_logits, completion_logprobs, full_forward_completion_logits, pack, split_head,
)
from numerics_bounds import assert_same

# The head over B*T rows is a matmul of another shape than over B*L, which a BLAS may block differently: the models
# run in float64, where the two paths agree to F64_TOL on any CPU (tests/numerics_bounds.py).
TEMPERATURE = 0.7

# Prompts of 3, 6 and 1 tokens; completions of 4, 1, 0 and 2 tokens (a zero-length one packs to a fully masked row).
PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12, 13], [14], [15, 16, 17]]
COMPLETIONS = [[18, 19, 20, 21], [22], [], [23, 24]]


def full_forward_logits(model, batch, temperature=1.0) -> torch.Tensor:
    """The old path, with completion_logits's signature."""
    return full_forward_completion_logits(model, batch) / temperature


@pytest.fixture(scope="module", params=[("qwen2", False), ("llama", True)], ids=["qwen2-untied", "llama-tied"])
def model_and_batch(request, tmp_path_factory):
    arch, tied = request.param
    path = build_tiny_model(tmp_path_factory.mktemp("m") / arch, "1m", arch=arch, tie_word_embeddings=tied)
    model, tok = load_causal_lm(path, "float64")
    return model, pack(PROMPTS, COMPLETIONS, tok.pad_token_id)


def test_head_at_completion_positions_gives_the_full_forwards_logprobs(model_and_batch):
    model, batch = model_and_batch
    assert split_head(model) is not None
    assert batch.completion_mask[2].sum() == 0  # the zero-length completion
    with torch.no_grad():
        lp, ent = completion_logprobs(model, batch, TEMPERATURE, with_entropy=True)
        full = full_forward_logits(model, batch, TEMPERATURE)
    mask = batch.completion_mask
    assert_same(lp, token_logprobs(full, batch.targets) * mask, "logprobs")
    assert_same(ent, token_entropy(full) * mask, "entropies")
    assert completion_logits(model, batch).shape == full.shape


def test_head_at_completion_positions_gives_the_full_forwards_gradients(model_and_batch):
    model, batch = model_and_batch
    weights = torch.linspace(-1.0, 2.0, batch.targets.numel()).view_as(batch.targets)  # every token its own weight

    def grads(logits_fn):
        model.zero_grad(set_to_none=True)
        lp = token_logprobs(logits_fn(model, batch, TEMPERATURE), batch.targets) * batch.completion_mask
        (lp * weights).sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    model.train()
    try:
        new, old = grads(completion_logits), grads(full_forward_logits)
    finally:
        model.eval()
        model.zero_grad(set_to_none=True)
    assert new.keys() == old.keys()
    assert_same(new, old, "gradients")
    assert max(float(g.abs().max()) for g in new.values()) > 1e-3  # the loss does reach the weights


def test_softcapped_model_takes_the_full_forward():
    from transformers import AutoModelForCausalLM, Gemma2Config

    # Gemma2 applies tanh(logits / cap) * cap after the head, so head(hidden) is not its logits. The random model's
    # logits reach ~0.3: a cap of 0.1 bends them visibly.
    config = Gemma2Config(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                          num_key_value_heads=2, head_dim=16, intermediate_size=64, final_logit_softcapping=0.1)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    batch = pack(PROMPTS, COMPLETIONS, pad_id=0)
    assert split_head(model) is None
    with torch.no_grad():
        # The same function on the same tensors in one process: bitwise equal on any CPU.
        assert torch.equal(completion_logits(model, batch, TEMPERATURE), full_forward_logits(model, batch, TEMPERATURE))
        # What the split would have given: uncapped logits, far from the model's (so the fallback matters).
        hidden = model.get_decoder()(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
        uncapped = model.get_output_embeddings()(at_completion_positions(hidden, batch))
        assert (uncapped - full_forward_logits(model, batch)).abs().max() > 0.05


def test_fsdp_wrapped_model_takes_the_full_forward(tmp_path):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model, tok = load_causal_lm(build_tiny_model(tmp_path / "m", "1m"), "float64")
    batch = pack(PROMPTS, COMPLETIONS, tok.pad_token_id)
    with torch.no_grad():
        before = completion_logprobs(model, batch, TEMPERATURE)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        # The root's weights (embeddings, head) are gathered in the root's forward: the body alone would fail on them.
        assert split_head(model) is None
        with torch.no_grad():
            assert_same(completion_logprobs(model, batch, TEMPERATURE), before, "FSDP-wrapped")
    finally:
        dist.destroy_process_group()
