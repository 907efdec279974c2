"""Packed training (training/packing.py): rows assigned, built and read back by hand; then the packed forward
against the padded one (the reference) on Llama- and Qwen2-style models with attention biases and grouped KV heads,
sdpa and eager attention: logprobs, entropies, gradients, critic values, a Trainer step, reference logprobs;
attention that stays within each sequence of a row; and eight more architectures of the installed transformers."""

from __future__ import annotations

import pytest
import torch

from posttrain.config import load_config
from posttrain.training.batch import (
    at_completion_positions, completion_logits, completion_logprobs, forward_at_completion_positions, pack,
    trained_token_logprobs,
)
from posttrain.training.packing import assign_rows, at_packed_completion_positions, pack_rows
from numerics_bounds import assert_same

# Packed rows are [rows, columns] matmuls of other shapes than padded ones, so the two sum in other orders: the
# comparisons run in float64 (models built in it, model.dtype=float64 for the roles), where they agree to F64_TOL on
# any CPU's kernels (tests/numerics_bounds.py). In float32 they differed by up to 3.8e-6 (gradients) and 1.1e-5
# (weights after AdamW, which magnifies rounding on gradients that are 0 in exact arithmetic) on one Xeon.
TEMPERATURE = 0.7


@pytest.fixture(autouse=True)
def softmax_keeps_float64(monkeypatch):
    """transformers' eager attention takes its softmax with dtype=torch.float32 whatever the model's dtype (to raise
    half precision), which puts a float32 sum, in an order that depends on where a sequence sits in its row, into the
    float64 checks: measured 5e-8 apart packed vs padded with ATEN_CPU_CAPABILITY=default. Here float64 stays."""
    softmax = torch.nn.functional.softmax

    def float64_softmax(x, dim=None, _stacklevel=3, dtype=None):
        keep = dtype is torch.float32 and x.dtype is torch.float64
        return softmax(x, dim=dim, _stacklevel=_stacklevel, dtype=None if keep else dtype)

    monkeypatch.setattr(torch.nn.functional, "softmax", float64_softmax)

# ------------------------------------------------------------------ (a) rows, by hand


def test_first_fit_decreasing_by_hand():
    # Longest first: 0 (5), 2 (4), 4 (3), 1 (2), 3 (1).
    # capacity 5: 0 -> new row A (0 left); 2 -> new row B (1 left); 4 -> new row C (2 left); 1 -> C (0 left); 3 -> B.
    assert assign_rows([5, 2, 4, 1, 3], capacity=5) == [[0], [2, 3], [4, 1]]
    # capacity 8: 0 -> A (3 left); 2 -> B (4 left); 4 -> A (0 left); 1 -> B (2 left); 3 -> B (1 left).
    assert assign_rows([5, 2, 4, 1, 3], capacity=8) == [[0, 4], [2, 1, 3]]
    # Ties keep index order; one row per sequence when nothing fits beside the longest.
    assert assign_rows([2, 2, 2], capacity=2) == [[0], [1], [2]]
    assert assign_rows([], capacity=4) == []


def test_assign_rows_rejects_what_cannot_be_packed():
    with pytest.raises(ValueError, match="below the longest sequence"):
        assign_rows([3, 6], capacity=5)
    with pytest.raises(ValueError, match="at least one token"):
        assign_rows([3, 0], capacity=5)


# ------------------------------------------------------------------ (b) row tensors, by hand


def test_pack_rows_by_hand():
    ids = torch.tensor([[1, 2, 3, 0, 0], [4, 5, 0, 0, 0], [6, 7, 8, 9, 0]])
    # capacity 6: 2 (4 tokens) -> row 0 (2 left); 0 (3) -> row 1 (3 left); 1 (2) -> row 0 (0 left).
    rows = pack_rows(ids, torch.tensor([3, 2, 4]), capacity=6, filler_id=99)
    assert rows.input_ids.tolist() == [[6, 7, 8, 9, 4, 5], [1, 2, 3, 99, 99, 99]]
    # Positions restart per sequence; row 1's tail continues its only sequence (3, 4, 5), so it opens no new one.
    assert rows.position_ids.tolist() == [[0, 1, 2, 3, 0, 1], [0, 1, 2, 3, 4, 5]]
    assert rows.row.tolist() == [1, 0, 0]
    assert rows.offset.tolist() == [0, 4, 0]
    assert rows.lengths.tolist() == [3, 2, 4]
    # Default capacity = the longest sequence (4): 2 -> row 0; 0 -> row 1 (1 left); 1 (2) -> row 2: nothing packs.
    assert pack_rows(ids, torch.tensor([3, 2, 4])).input_ids.shape == (3, 4)
    # Three short sequences beside a long one: [4, 1, 1, 2] -> rows [0], [3, 1, 2] of width 4.
    rows = pack_rows(torch.tensor([[1, 2, 3, 4], [5, 0, 0, 0], [6, 0, 0, 0], [7, 8, 0, 0]]), torch.tensor([4, 1, 1, 2]))
    assert rows.input_ids.tolist() == [[1, 2, 3, 4], [7, 8, 5, 6]]
    assert rows.position_ids.tolist() == [[0, 1, 2, 3], [0, 1, 0, 0]]


def test_pack_rows_rejects_bad_lengths():
    ids = torch.tensor([[1, 2, 0], [3, 0, 0]])
    with pytest.raises(ValueError, match="2 sequences"):
        pack_rows(ids, torch.tensor([2]))
    with pytest.raises(ValueError, match="width 3"):
        pack_rows(ids, torch.tensor([4, 1]))


# ------------------------------------------------------------------ (c) back to the [B, T] layout, by hand


def test_completion_positions_in_packed_rows_by_hand():
    ids = torch.tensor([[1, 2, 3, 0, 0], [4, 5, 0, 0, 0], [6, 7, 8, 9, 0]])
    rows = pack_rows(ids, torch.tensor([3, 2, 4]), capacity=6)  # layout as above: row 0 = seq 2 | seq 1, row 1 = seq 0
    per_position = (10 * torch.arange(2).view(2, 1) + torch.arange(6).view(1, 6)).float().unsqueeze(-1)  # 10 r + c
    starts = torch.tensor([2, 1, 3])  # prompts of 2, 1 and 3 tokens
    got = at_packed_completion_positions(per_position, rows, starts, completion_width=3).squeeze(-1)
    # seq 0 (row 1, offset 0, 3 tokens, start 2): columns 1, 2, then 3 is past its end -> its last token, 2.
    # seq 1 (row 0, offset 4, 2 tokens, start 1): columns 4, 5, then past the end -> 5 (never row 0's filler).
    # seq 2 (row 0, offset 0, 4 tokens, start 3): columns 2, 3, then past the end -> 3 (never seq 1's first token).
    assert got.tolist() == [[11, 12, 12], [4, 5, 5], [2, 3, 3]]
    # Only the positions of trained tokens (completions of 2, 1 and 2 tokens, the second token of seq 0 masked):
    where = torch.tensor([[True, False, False], [True, False, False], [True, True, False]])
    picked = at_packed_completion_positions(per_position, rows, starts, completion_width=3, where=where)
    assert picked.squeeze(-1).tolist() == [11, 4, 2, 3]
    with pytest.raises(ValueError, match="at least one prompt token"):
        at_packed_completion_positions(per_position, rows, torch.tensor([0, 1, 3]), completion_width=3)


def test_completion_positions_agree_with_the_padded_layout():
    # Same per-token outputs laid out padded and packed: the same [B, T] values wherever a completion token is.
    prompts, completions = [[1, 2], [3], [4, 5, 6], [7]], [[8, 9, 10], [11], [], [12, 13]]
    batch = pack(prompts, completions, pad_id=0)
    rows = pack_rows(batch.input_ids, batch.attention_mask.sum(1))
    padded = at_completion_positions(batch.input_ids.unsqueeze(-1).float(), batch).squeeze(-1)
    packed = at_packed_completion_positions(rows.input_ids.unsqueeze(-1).float(), rows, batch.starts,
                                            batch.targets.shape[1]).squeeze(-1)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 0, 0], [1, 1, 0]], dtype=torch.bool)  # + the predicting position
    assert torch.equal(padded[mask], packed[mask])
    assert rows.input_ids.shape[0] < len(prompts)  # something did pack


# ------------------------------------------------------------------ the packed forward against the padded one

# Prompts of 1..9 tokens and completions of 0..13 (one sequence of a single token: prompt 1, completion 0); two
# multi-turn episodes with tool tokens (mask 0) inside. At capacity = the longest (22 tokens), 8 sequences -> 4 rows.
PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12, 13], [14], [15, 16, 17], [18, 19], [20], [21, 22, 23, 24, 25], [26, 27],
           [28, 29, 30, 31]]
COMPLETIONS = [[32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44], [45], [46, 47, 48, 49, 50, 51], [],
               [52, 53, 54, 55, 56, 57, 58, 59], [60, 61, 62], [63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73], [74]]
LOSS_MASKS = [[1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 0, 0, 1], [1], [1, 1, 1, 1, 1, 1], [], [1, 0, 0, 1, 1, 1, 1, 1],
              [1, 1, 1], [1] * 11, [1]]
VOCAB = 80


def tiny_causal_lm(arch: str, attn: str):
    """Two layers, 4 query heads sharing 2 KV heads, biases on q/k/v (Qwen2 always, Llama by attention_bias);
    float64."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    common = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=128, max_position_embeddings=64, tie_word_embeddings=False, pad_token_id=0)
    config = Qwen2Config(**common) if arch == "qwen2" else LlamaConfig(**common, attention_bias=True)
    config._attn_implementation = attn
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float64).eval()
    assert model.config._attn_implementation == attn
    return model


@pytest.fixture(scope="module", params=[("llama", "sdpa"), ("llama", "eager"), ("qwen2", "sdpa"), ("qwen2", "eager")],
                ids=lambda p: "-".join(p))
def model(request):
    return tiny_causal_lm(*request.param)


def batches():
    padded = pack(PROMPTS, COMPLETIONS, 0, LOSS_MASKS)
    return padded, pack(PROMPTS, COMPLETIONS, 0, LOSS_MASKS, packed_rows=True)


def test_the_batch_packs_into_fewer_rows():
    padded, packed = batches()
    assert padded.input_ids.shape == (8, 22)
    rows = pack_rows(packed.input_ids, packed.attention_mask.sum(1))
    assert rows.input_ids.shape == (4, 22)
    assert (rows.position_ids == 0).sum() == 8  # one sequence start per sequence (tails continue, start nothing)


def test_packed_logprobs_and_entropy_equal_the_padded(model):
    padded, packed = batches()
    with torch.no_grad():
        lp, ent = completion_logprobs(model, padded, TEMPERATURE, with_entropy=True)
        lp_packed, ent_packed = completion_logprobs(model, packed, TEMPERATURE, with_entropy=True)
    assert_same(lp_packed, lp, "logprobs")
    assert_same(ent_packed, ent, "entropies")
    assert lp.abs().max() > 1.0 and ent.abs().max() > 1.0  # not all masked away
    assert torch.equal(lp == 0, lp_packed == 0)  # the same masked tokens
    # The head over trained tokens only (what packed rows run) on padded rows: the same numbers too.
    with torch.no_grad():
        lp_head, ent_head = trained_token_logprobs(model, padded, TEMPERATURE, with_entropy=True)
    assert_same(lp_head, lp, "logprobs, head at trained tokens")
    assert_same(ent_head, ent, "entropies, head at trained tokens")


def test_packed_gradients_equal_the_padded(model):
    padded, packed = batches()
    weights = torch.linspace(-1.0, 2.0, padded.targets.numel()).view_as(padded.targets)  # every token its own weight

    def grads(batch):
        model.zero_grad(set_to_none=True)
        (completion_logprobs(model, batch, TEMPERATURE) * weights).sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    model.train()
    try:
        a, b = grads(padded), grads(packed)
    finally:
        model.eval()
        model.zero_grad(set_to_none=True)
    assert a.keys() == b.keys()
    assert_same(b, a, "gradients")
    assert max(float(g.abs().max()) for g in a.values()) > 1e-3  # the loss does reach the weights


def test_full_forward_path_packs_too(model):
    # Models split_head cannot split (softcapping, FSDP) run whole: the packed rows go through the full forward.
    from posttrain.training.batch import full_forward_completion_logits

    padded, packed = batches()
    real = torch.arange(padded.targets.shape[1]) < torch.tensor([len(c) for c in COMPLETIONS]).unsqueeze(1)
    with torch.no_grad():
        full = full_forward_completion_logits(model, packed)[real]  # past a completion's end: masked, any value
        assert_same(full, full_forward_completion_logits(model, padded)[real], "full forward, padded")
        assert_same(full, completion_logits(model, packed)[real], "full forward vs head at completion positions")


def test_attention_stays_within_each_sequence(model):
    # Two sequences a and b in one row, a first: changing every token of a changes none of b's logprobs.
    _, packed = batches()
    rows = pack_rows(packed.input_ids, packed.attention_mask.sum(1))
    row_of = rows.row.tolist()
    trained = packed.completion_mask.sum(1) > 0
    a, b = next((i, j) for i in range(8) for j in range(8) if i != j and row_of[i] == row_of[j] and trained[i]
                and trained[j] and rows.offset[i] < rows.offset[j])  # a before b in the row: b could see a
    prompts = [list(p) for p in PROMPTS]
    completions = [list(c) for c in COMPLETIONS]
    prompts[a] = [(t + 7) % VOCAB or 1 for t in prompts[a]]
    completions[a] = [(t + 7) % VOCAB or 1 for t in completions[a]]
    changed = pack(prompts, completions, 0, LOSS_MASKS, packed_rows=True)
    with torch.no_grad():
        before, after = completion_logprobs(model, packed), completion_logprobs(model, changed)
    assert torch.equal(pack_rows(changed.input_ids, changed.attention_mask.sum(1)).row, rows.row)  # same layout
    assert_same(after[b], before[b], "b after a changed")
    assert before[b].abs().max() > 1.0
    assert (after[a] - before[a]).abs().max() > 1e-3

    # The check can fail: the same rows with plain positions 0..C-1 (one causal sequence per row) leak a into b.
    def leaky(**kw):
        kw["position_ids"] = torch.arange(kw["input_ids"].shape[1]).expand_as(kw["input_ids"])
        return model(**kw).logits

    with torch.no_grad():
        leak_before = forward_at_completion_positions(leaky, packed)
        leak_after = forward_at_completion_positions(leaky, changed)
    assert (leak_after[b] - leak_before[b]).abs().max() > 1e-3


# ------------------------------------------------------------------ the roles with train.packing on and off


def rows_seen(model) -> list[int]:
    """The number of rows of every forward the model runs from now on (a hook on its input embedding)."""
    seen: list[int] = []
    model.get_input_embeddings().register_forward_hook(lambda _m, args, _out: seen.append(args[0].shape[0]))
    return seen


# The batch above in the tiny character model's vocabulary (46 tokens).
ROLE_PROMPTS = [[3 + t % 40 for t in p] for p in PROMPTS]
ROLE_COMPLETIONS = [[3 + t % 40 for t in c] for c in COMPLETIONS]


def _cfg(model_dir: str, packing: bool, *extra: str) -> dict:
    return load_config(None, [f"model.path={model_dir}", "topology.torch_threads=1", "algorithm.group_size=2",
                              "algorithm.prompts_per_step=4", f"train.packing={packing}", "model.dtype=float64",
                              "rollout.engine=hf", *extra]).to_dict()


def test_critic_values_and_steps_equal_with_packing(tiny_model_dir):
    from posttrain.training.critic import Critic

    extra = ("algorithm.name=ppo", "algorithm.minibatches=2", "algorithm.updates_per_batch=2")
    values, steps = [], []
    for packing in (False, True):
        critic = Critic(_cfg(tiny_model_dir, packing, *extra), tiny_model_dir)
        # transformers' token-classification head has dropout 0.1 in training: its draws follow the tensor's layout
        # ([4, 22] packed, [8, 22] padded), so the steps agree only without it.
        assert critic.model.dropout.p == 0.1
        critic.model.dropout.p = 0.0
        rows = rows_seen(critic.model)
        values.append(critic.values(ROLE_PROMPTS, ROLE_COMPLETIONS, LOSS_MASKS))
        returns = [[0.5 * (k % 3) for k in range(len(c))] for c in COMPLETIONS]
        steps.append(critic.train_step(ROLE_PROMPTS, ROLE_COMPLETIONS, returns, values[-1], LOSS_MASKS))
        steps[-1]["values_after"] = critic.values(ROLE_PROMPTS, ROLE_COMPLETIONS, LOSS_MASKS)
        assert rows[0] == (4 if packing else 8)  # the packed forward ran (8 sequences in 4 rows)
    flat = [(x, y) for r0, r1 in zip(*values) for x, y in zip(r0, r1)]
    assert_same(values[1], values[0], "values")
    assert any(abs(x) > 1e-3 for x, _ in flat)
    assert_same(steps[1]["value_loss"], steps[0]["value_loss"], "value loss")
    assert_same(steps[1]["values_after"], steps[0]["values_after"], "values after the steps")


def test_trainer_step_and_reference_equal_with_packing(tiny_model_dir):
    from posttrain.training.reference import ReferenceModel
    from posttrain.training.trainer import Trainer, TrainBatch

    # Two updates of two minibatches (the no-grad old-logprob pass, then minibatch rows packed on their own), a KL
    # term against the reference's logprobs: every branch of train_step that runs the model.
    extra = ("algorithm.minibatches=2", "algorithm.updates_per_batch=2", "algorithm.kl_coef=0.05", "algorithm.lr=3e-3")
    results = []
    for packing in (False, True):
        cfg = _cfg(tiny_model_dir, packing, *extra)
        reference = ReferenceModel(cfg, tiny_model_dir)
        ref_rows = rows_seen(reference.model)
        ref = reference.logprobs(ROLE_PROMPTS, ROLE_COMPLETIONS)
        assert ref_rows == [4 if packing else 8]
        batch = TrainBatch(prompts=ROLE_PROMPTS, completions=ROLE_COMPLETIONS, loss_masks=LOSS_MASKS,
                           advantages=[1.0, -0.5, 0.3, -0.2, 0.8, -1.0, 0.1, 0.4],
                           engine_logprobs=[[-3.5] * len(c) for c in COMPLETIONS], ref_logprobs=ref)
        trainer = Trainer(cfg, tiny_model_dir)
        trainer_rows = rows_seen(trainer.model)
        metrics = trainer.train_step(batch)
        # The old-logprob pass over all 8, then 4 minibatches of 4 sequences: packed, each fewer rows than padded.
        assert len(trainer_rows) == 5 and trainer_rows[0] == (4 if packing else 8)
        assert all(r < 4 for r in trainer_rows[1:]) if packing else trainer_rows[1:] == [4] * 4
        metrics.pop("train_compute_s")
        results.append((ref, metrics, {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}))
    (ref0, m0, w0), (ref1, m1, w1) = results
    assert [len(r) for r in ref1] == [len(c) for c in COMPLETIONS]
    assert_same(ref1, ref0, "reference logprobs")
    assert m0.keys() == m1.keys()
    for k in m0:
        assert_same(m1[k], m0[k], k)
    assert_same(w1, w0, "weights")
    moved = max(float((w0[k] - v).abs().max()) for k, v in Trainer(_cfg(tiny_model_dir, False), tiny_model_dir)
                .model.state_dict().items())
    assert moved > 1e-3  # the step did change the weights


# ------------------------------------------------------------------ other architectures of the installed transformers

# Packing relies on transformers reading sequence boundaries from position ids: each family built on its masking
# utilities does. GPT-2 adds learned absolute position embeddings (from the position ids), Gemma2 softcaps its
# logits (the full-forward path), Mixtral routes tokens to experts. In float64, as above.
ARCHITECTURES = ["GPT2Config", "GPTNeoXConfig", "Phi3Config", "Gemma2Config", "MistralConfig", "Qwen3Config",
                 "Olmo2Config", "MixtralConfig"]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("config_name", ARCHITECTURES)
def test_packed_equals_padded_across_architectures(config_name, attn):
    import transformers

    if config_name == "GPT2Config":
        config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4)
    else:
        config = getattr(transformers, config_name)(
            vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, intermediate_size=128, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    config._attn_implementation = attn
    config._experts_implementation = "eager"  # Mixtral: torch._grouped_mm has no float64 kernel
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float64).eval()
    padded, packed = batches()
    with torch.no_grad():
        lp, lp_packed = completion_logprobs(model, padded), completion_logprobs(model, packed)
    assert_same(lp_packed, lp, config_name)
    assert lp.abs().max() > 1.0
