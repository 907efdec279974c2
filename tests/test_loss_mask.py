"""The multi-turn loss mask (1 = token sampled by the engine, 0 = environment/tool token) through every trainer path:
the clipped loss, entropy and token counts count sampled tokens only; GAE and REINFORCE++'s KL-in-reward run over
the sampled tokens; no mask gives bit-for-bit the numbers of an all-ones mask; the single Trainer, the critic and
the sharded trainer (one rank, in-process) take the mask. Hand arithmetic in the comments; ln 2 = 0.693147,
ln 4 = 1.386294, ln 6 = 1.791759."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from posttrain.algorithms.advantages import sampled_token_budget
from posttrain.algorithms.grpo import clipped_policy_loss
from posttrain.algorithms.ppo import _gae_contiguous, gae
from posttrain.config import load_config
from posttrain.rollout.samples import StepSamples
from posttrain.training.batch import completion_logprobs, pack
from posttrain.training.trainer import TrainBatch, Trainer
from numerics_bounds import assert_same

TOL = 1e-5  # hand numbers carry 6 digits; what they are compared with is float64, or float32 sums of <= 12 terms


# ------------------------------------------------------------------ (a) the clipped loss over a masked middle span

# Two rows, old logprobs -1 everywhere, clip_eps 0.2. Row 0 (A = +1): mask [1, 1, 0, 0, 1], ratios [1, 1.5, 3, 3, 0.5];
# row 1 (A = -0.5): 3 tokens then padding, ratios [1, 0.7, 1.3].
# float64: the cut batch below sums in another order than the whole one (tests/numerics_bounds.py).
F64 = torch.float64
MASK = torch.tensor([[1.0, 1, 0, 0, 1], [1, 1, 1, 0, 0]], dtype=F64)
RATIOS = torch.tensor([[1.0, 1.5, 3.0, 3.0, 0.5], [1.0, 0.7, 1.3, 1.0, 1.0]], dtype=F64)
ADV = torch.tensor([1.0, -0.5], dtype=F64)


def _loss(ratios, mask, adv, ref_shift=None, kl_coef=0.0, agg="token", old=-1.0):
    old_lp = torch.full_like(ratios, old)
    lp = (old_lp + ratios.log()).requires_grad_(True)
    ref = None if ref_shift is None else lp.detach() + ref_shift
    out = clipped_policy_loss(lp, old_lp, adv, mask, clip_eps=0.2, ref_logprobs=ref, kl_coef=kl_coef, agg=agg,
                              agg_constant=4)
    out.loss.backward()
    out.loss = out.loss.detach()
    return out, lp.grad


def test_clipped_loss_counts_sampled_tokens_only_by_hand():
    # per token -min(r*A, clip(r, 0.8, 1.2)*A):
    #   row 0: r=1 -> -1; r=1.5 -> -min(1.5, 1.2) = -1.2 (clipped); masked x2; r=0.5 -> -min(0.5, 0.8) = -0.5
    #   row 1: r=1 -> +0.5; r=0.7 -> -min(-0.35, -0.4) = +0.4 (clipped); r=1.3 -> -min(-0.65, -0.6) = +0.65
    # token mean over the 6 sampled tokens: (-1 - 1.2 - 0.5 + 0.5 + 0.4 + 0.65) / 6 = -1.15 / 6 = -0.191667
    # clip fraction 2/6; ratio mean (1 + 1.5 + 0.5 + 1 + 0.7 + 1.3) / 6 = 1.0
    # k3 KL: ref - lp = ln 2 on row 1 token 2 -> 2 - ln 2 - 1 = 0.306853; 3 on the masked tokens (e^3 - 4 = 16.09,
    # excluded); mean 0.306853 / 6 = 0.051142; loss with kl_coef 0.1: -0.191667 + 0.0051142 = -0.186552
    shift = torch.zeros_like(MASK)
    shift[1, 2] = math.log(2.0)
    shift[0, 2:4] = 3.0
    out, _ = _loss(RATIOS, MASK, ADV, ref_shift=shift, kl_coef=0.1)
    assert float(out.policy_loss) == pytest.approx(-0.191667, abs=TOL)
    assert float(out.kl) == pytest.approx(0.051142, abs=TOL)
    assert float(out.loss) == pytest.approx(-0.186552, abs=TOL)
    assert float(out.clip_fraction) == pytest.approx(2 / 6, abs=TOL)
    assert float(out.ratio_mean) == pytest.approx(1.0, abs=TOL)
    # sequence mean: row 0 (-1 - 1.2 - 0.5) / 3 = -0.9, row 1 1.55 / 3 = 0.516667 -> -0.191667;
    # constant 4: row 0 -2.7 / 4 = -0.675, row 1 1.55 / 4 = 0.3875 -> mean -0.14375
    assert float(_loss(RATIOS, MASK, ADV, agg="sequence")[0].loss) == pytest.approx(-0.191667, abs=TOL)
    assert float(_loss(RATIOS, MASK, ADV, agg="constant")[0].loss) == pytest.approx(-0.14375, abs=TOL)

    # The same batch with the masked span's two tokens removed from row 0: the same numbers.
    short = torch.tensor([[1.0, 1.5, 0.5, 1.0, 1.0], [1.0, 0.7, 1.3, 1.0, 1.0]], dtype=F64)
    short_mask = torch.tensor([[1.0, 1, 1, 0, 0], [1, 1, 1, 0, 0]], dtype=F64)
    short_shift = torch.zeros_like(short_mask)
    short_shift[1, 2] = math.log(2.0)
    cut, _ = _loss(short, short_mask, ADV, ref_shift=short_shift, kl_coef=0.1)
    for key in ("loss", "policy_loss", "kl", "clip_fraction", "ratio_mean"):
        assert_same(getattr(cut, key), getattr(out, key), key)


def test_values_at_masked_positions_change_neither_loss_nor_gradient():
    # Per-token advantages; the gradient wrt each logprob, by hand (d/d lp of -r*A is -r*A; 0 where the clipped,
    # constant branch is taken), over 6 tokens: row 0 [-1/6, 0, 0, 0, -0.5/6], row 1 [0.5/6, 0, 0.65/6, 0, 0].
    adv = torch.tensor([[1.0, 1, 1, 1, 1], [-0.5, -0.5, -0.5, 0, 0]], dtype=F64)
    out, grad = _loss(RATIOS, MASK, adv)
    assert grad.flatten().tolist() == pytest.approx([-1 / 6, 0, 0, 0, -0.5 / 6, 0.5 / 6, 0, 0.65 / 6, 0, 0], abs=1e-6)
    other_adv, other_ratios = adv.clone(), RATIOS.clone()
    other_adv[0, 2:4] = torch.tensor([-7.0, 40.0], dtype=F64)
    other_ratios[0, 2:4] = torch.tensor([0.01, 9.0], dtype=F64)
    other, other_grad = _loss(other_ratios, MASK, other_adv, ref_shift=None)
    assert torch.equal(other.loss, out.loss) and torch.equal(other_grad, grad)


class BigramLM(torch.nn.Module):
    """logits at a position = table[token there]: logprobs and entropies a reader can work out. Its decoder is
    itself, so `split_head` sends it down the full-forward path."""

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.table = torch.nn.Parameter(table.clone())
        self.config = SimpleNamespace(get_text_config=lambda: SimpleNamespace())

    def get_decoder(self):
        return self

    def get_output_embeddings(self):
        return None

    def forward(self, input_ids, attention_mask=None, use_cache=False, position_ids=None):  # position-free: packs
        return SimpleNamespace(logits=self.table[input_ids])


# Vocabulary 0..3 (0 = pad). Rows of 0 and 2: uniform (p 1/4 each, entropy ln 4 = 1.386294). Row of 1: logits
# [ln 3, 0, 0, 0] -> p (1/2, 1/6, 1/6, 1/6); row of 3: [0, 0, 0, ln 3] -> (1/6, 1/6, 1/6, 1/2); both have entropy
# 1/2 ln 2 + 3 * 1/6 ln 6 = 1/2 ln 12 = 1.242453.
BIGRAM = torch.zeros(4, 4)
BIGRAM[1, 0] = BIGRAM[3, 3] = math.log(3.0)
# Row 0: prompt [3, 1], completion [2, 2, 3, 1], mask [1, 0, 0, 1]; row 1: prompt [1], completion [3, 3], mask [1, 1].
# The token predicting each completion token, and its logprob:
#   row 0: 1 -> 2: -ln 6 (sampled) | 2 -> 2: -ln 4 (tool) | 2 -> 3: -ln 4 (tool) | 3 -> 1: -ln 6 (sampled)
#   row 1: 1 -> 3: -ln 6 | 3 -> 3: -ln 2
BIGRAM_BATCH = dict(prompts=[[3, 1], [1]], completions=[[2, 2, 3, 1], [3, 3]], loss_masks=[[1, 0, 0, 1], [1, 1]])


@pytest.fixture(scope="module")
def cfg_dict(tiny_model_dir):
    return load_config(None, [f"model.path={tiny_model_dir}", "topology.torch_threads=1", "algorithm.kl_coef=0",
                              "algorithm.group_size=2", "algorithm.prompts_per_step=2"]).to_dict()


def _float64(cfg_dict: dict) -> dict:
    """The config with model.dtype=float64 (and the hf engine, which takes it): for comparing two paths."""
    return _override(cfg_dict, model={"dtype": "float64"}, rollout={"engine": "hf"})


def _override(cfg_dict: dict, **sections) -> dict:
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in cfg_dict.items()}
    for section, values in sections.items():
        out[section].update(values)
    return out


def test_trainer_loss_entropy_and_tokens_by_hand(cfg_dict, tiny_model_dir):
    # The single Trainer, one update (its gradient pass gives the old logprobs: ratio 1), on the bigram model.
    # policy loss, token mean: -(A0 * 2 sampled tokens + A1 * 2) / 4 = -(2 - 1) / 4 = -0.25
    # entropy: every sampled token is predicted by row 1 or 3 -> 1.242453 (over all 6 tokens it would be
    #   (4 * 1.242453 + 2 * 1.386294) / 6 = 1.290400)
    # trained tokens 3 + ... = 4 (not 6)
    # logprob gap: engine [-1.8, -9, -9, -1.8], [-1.8, -0.7] against [-ln 6, ., ., -ln 6], [-ln 6, -ln 2]:
    #   (3 * 0.008241 + 0.006853) / 4 = 0.007894, max 0.008241 (the -9s on tool tokens are masked out)
    # gradient wrt the table (d lp(k | row r) / d table[r] = e_k - p_r; loss = -(1/4) sum A lp):
    #   table[1]: -(1/4) [(e2 - p1) - 0.5 (e3 - p1)] = (0.0625, 0.020833, -0.229167, 0.145833)
    #   table[3]: -(1/4) [(e1 - p3) - 0.5 (e3 - p3)] = (0.020833, -0.229167, 0.020833, 0.1875)
    #   norm^2 = 0.0625^2 + 3 * 0.020833^2 + 2 * 0.229167^2 + 0.145833^2 + 0.1875^2 = 1/6 -> norm 0.408248
    #   (rows 0 and 2 only predict tool tokens: no gradient)
    trainer = Trainer(cfg_dict, tiny_model_dir)
    trainer.model = BigramLM(BIGRAM)
    trainer.optimizer = torch.optim.AdamW(trainer.model.parameters(), lr=1e-3)
    trainer.pad_id = 0
    batch = TrainBatch(advantages=[1.0, -0.5], engine_logprobs=[[-1.8, -9.0, -9.0, -1.8], [-1.8, -0.7]],
                       **BIGRAM_BATCH)
    m = trainer.train_step(batch)
    assert m["policy_loss"] == pytest.approx(-0.25, abs=TOL) and m["loss"] == pytest.approx(-0.25, abs=TOL)
    assert m["entropy"] == pytest.approx(1.242453, abs=TOL)
    assert m["trained_tokens"] == 4.0
    assert m["logprob_gap_mean"] == pytest.approx(0.007894, abs=TOL)
    assert m["logprob_gap_max"] == pytest.approx(0.008241, abs=TOL)
    assert m["grad_norm"] == pytest.approx(0.408248, abs=TOL)

    # pack: the loss mask is the completion mask; logprobs are 0 on tool tokens.
    packed = pack(BIGRAM_BATCH["prompts"], BIGRAM_BATCH["completions"], 0, BIGRAM_BATCH["loss_masks"])
    assert packed.completion_mask.tolist() == [[1, 0, 0, 1], [1, 1, 0, 0]]
    lp = completion_logprobs(BigramLM(BIGRAM), packed)
    ln2, ln6 = math.log(2), math.log(6)
    assert lp.flatten().tolist() == pytest.approx([-ln6, 0, 0, -ln6, -ln6, -ln2, 0, 0], abs=1e-6)
    with pytest.raises(ValueError, match="one mask entry per completion token"):
        pack([[1]], [[2, 3]], 0, [[1]])


# ------------------------------------------------------------------ (b) GAE over a masked sequence


def test_gae_runs_over_sampled_tokens_by_hand():
    # Row 0: 5 tokens, mask [1, 1, 0, 0, 1] (an assistant turn of 2, a tool turn of 2, an assistant turn of 1);
    # rewards and values at the tool tokens are garbage (9, 7) and must not count. gamma 0.9, lambda 0.5.
    # Over the sampled tokens: r = [0.1, 0, 1], V = [0.5, 0.6, 0.8]; V after the last is 0.
    #   delta_2 = 1 + 0 - 0.8 = 0.2                  A_2 = 0.2
    #   delta_1 = 0 + 0.9 * 0.8 - 0.6 = 0.12         A_1 = 0.12 + 0.45 * 0.2 = 0.21
    #   delta_0 = 0.1 + 0.9 * 0.6 - 0.5 = 0.14       A_0 = 0.14 + 0.45 * 0.21 = 0.2345
    #   returns A + V = [0.7345, 0.81, 1.0]; scattered back with 0 on the tool tokens.
    # (Stepping through the tool tokens instead would discount by 0.9^3 from token 1 to token 4.)
    # Row 1: mask [1, 0, 1] then padding: r = [0, 0.5], V = [0.2, 0.4]
    #   delta_1 = 0.5 - 0.4 = 0.1, A_1 = 0.1; delta_0 = 0 + 0.36 - 0.2 = 0.16, A_0 = 0.16 + 0.045 = 0.205
    #   returns [0.405, 0.5]
    rewards = torch.tensor([[0.1, 0.0, 9.0, 9.0, 1.0], [0.0, 5.0, 0.5, 0.0, 0.0]])
    values = torch.tensor([[0.5, 0.6, 7.0, 7.0, 0.8], [0.2, 5.0, 0.4, 3.0, 3.0]])
    mask = torch.tensor([[1.0, 1, 0, 0, 1], [1, 0, 1, 0, 0]])
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.5)
    assert adv.flatten().tolist() == pytest.approx([0.2345, 0.21, 0, 0, 0.2, 0.205, 0, 0.1, 0, 0], abs=1e-6)
    assert ret.flatten().tolist() == pytest.approx([0.7345, 0.81, 0, 0, 1.0, 0.405, 0, 0.5, 0, 0], abs=1e-6)


def test_gae_without_holes_is_the_old_loop_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    rewards, values = torch.randn(3, 6, generator=g), torch.randn(3, 6, generator=g)
    mask = torch.tensor([[1.0] * 6, [1.0] * 4 + [0.0] * 2, [1.0] + [0.0] * 5])
    for new, old in zip(gae(rewards, values, mask, 0.97, 0.9), _gae_contiguous(rewards, values, mask, 0.97, 0.9)):
        assert torch.equal(new, old)


class _Now:
    """A Ray actor method stand-in: `.remote(...)` runs it here and returns its value as the 'ref'."""

    def __init__(self, fn):
        self.remote = fn


def _roles(critic_values=None, seen=None):
    def values(prompts, completions, loss_masks=None):
        seen.append(loss_masks)
        return critic_values

    critic = SimpleNamespace(values=_Now(values)) if critic_values is not None else None
    return SimpleNamespace(critic=critic, watchdog=SimpleNamespace(get=lambda calls, *a: [r for r, _, _ in calls],
                                                                   hangs=0))


def test_ppo_step_advantages_run_gae_over_sampled_tokens_by_hand():
    from posttrain.step import step_advantages

    # One episode, mask [1, 1, 0, 0, 1], reward 1, critic values [0.5, 0.6, 0, 0, 0.8] (0 on tool tokens, as the
    # critic returns them with the mask), gamma 0.9, lambda 0.5, no KL: GAE over r = [0, 0, 1], V = [0.5, 0.6, 0.8]:
    #   A_2 = 0.2, A_1 = 0.12 + 0.09 = 0.21, A_0 = (0.54 - 0.5) + 0.45 * 0.21 = 0.1345; returns [0.6345, 0.81, 1.0]
    # whitened over the 3 sampled tokens: mean 0.5445 / 3 = 0.1815, deviations [-0.047, 0.0285, 0.0185],
    #   variance (0.002209 + 0.00081225 + 0.00034225) / 3 = 0.00112117, std 0.0334839
    #   -> [-1.403660, 0.851155, 0.552504]
    cfg = load_config(None, ["algorithm.name=ppo", "algorithm.kl_coef=0", "algorithm.gamma=0.9",
                             "algorithm.gae_lambda=0.5", "algorithm.group_size=1", "algorithm.prompts_per_step=1"])
    samples = StepSamples(prompts=[[5]], completions=[[6, 7, 8, 9, 10]], engine_logprobs=[[-1.0, -1.0, 0.0, 0.0, -1.0]],
                          rewards=[1.0], loss_masks=[[1, 1, 0, 0, 1]])
    seen: list = []
    adv, stats = step_advantages(cfg, _roles([[0.5, 0.6, 0.0, 0.0, 0.8]], seen), samples, None)
    assert seen == [[[1, 1, 0, 0, 1]]]  # the critic was given the mask
    assert stats["returns"][0] == pytest.approx([0.6345, 0.81, 0, 0, 1.0], abs=1e-6)
    assert adv[0] == pytest.approx([-1.403660, 0.851155, 0, 0, 0.552504], abs=TOL)


def test_finish_step_hands_the_masks_to_the_trainer_and_the_critic():
    from posttrain.step import finish_step

    # PPO through the step's own code, with the roles' methods run in-process: the trainer's batch and both critic
    # calls carry the episodes' loss masks.
    cfg = load_config(None, ["algorithm.name=ppo", "algorithm.kl_coef=0", "algorithm.group_size=1",
                             "algorithm.prompts_per_step=2"])
    masks = [[1, 0, 1], [1, 1]]
    s = StepSamples(sample_ids=["0/a/0", "0/b/0"], prompts=[[5], [5]], completions=[[6, 7, 8], [9, 10]],
                    engine_logprobs=[[-1.0, 0.0, -1.0], [-1.0, -1.0]],
                    items=[("a", "p", "1", "x"), ("b", "p", "2", "y")],
                    rewards=[1.0, 0.0], errors=[None, None], verifier=[1.0, 0.0], components=[{}, {}],
                    function_errors=[{}, {}], loss_masks=masks)
    seen: list = []
    batches: list = []
    roles = _roles([[0.5, 0.0, 0.5], [0.1, 0.2]], seen)
    roles.critic.train_step = _Now(lambda p, c, returns, values, loss_masks=None: seen.append(loss_masks) or {})
    roles.trainer = SimpleNamespace(train_step=_Now(lambda batch: batches.append(batch) or {}))
    roles.reference = None
    finish_step(cfg, 0, roles, s, s, 1, dict.fromkeys(("generate", "reward", "reference", "train", "sync"), 0.0), 0.0,
                sync=lambda roles: None)
    assert seen == [masks, masks] and batches[0].loss_masks == masks
    assert batches[0].advantages[0][1] == 0.0  # the tool token's advantage


# ------------------------------------------------------------------ (c) REINFORCE++'s KL in the reward


def test_reinforce_pp_kl_in_reward_with_a_mask_by_hand():
    from posttrain.step import step_advantages

    # Row 0: mask [1, 1, 0, 1, 0] (the episode ends on a tool turn: its last sampled token is 3, not sum - 1 = 2),
    # reward 1; engine logprobs [-1, -0.5, 0, -2, 0], reference [-1.5, -0.5, -3, -1, -4], kl_coef 0.1.
    #   KL (logp - ref) on sampled tokens [0.5, 0, ., -1, .] -> token rewards [-0.05, 0, 0, 0.1 + 1, 0]
    #   returns to go [1.05, 1.1, 0, 1.1, 0]
    # Row 1: 3 tokens, all sampled, reward 0, logp = ref -> returns [0, 0, 0].
    # Normalised over the 6 sampled tokens: mean 3.25 / 6 = 0.541667; deviations 0.508333, 0.558333 x2, -0.541667 x3;
    #   variance (0.258403 + 2 * 0.311736 + 3 * 0.293403) / 6 = 0.293681, std 0.541923
    #   -> row 0 [0.938018, 1.030282, 0, 1.030282, 0], row 1 [-0.999527] x3
    # Logged KL: (0.5 + 0 - 1) / 6 = -0.083333
    cfg = load_config(None, ["algorithm.name=reinforce_pp", "algorithm.kl_coef=0.1", "algorithm.group_size=2",
                             "algorithm.prompts_per_step=1"])
    samples = StepSamples(prompts=[[5], [5]], completions=[[6, 7, 8, 9, 10], [6, 7, 8]],
                          engine_logprobs=[[-1.0, -0.5, 0.0, -2.0, 0.0], [-1.0, -1.0, -1.0]], rewards=[1.0, 0.0],
                          loss_masks=[[1, 1, 0, 1, 0], [1, 1, 1]])
    ref = [[-1.5, -0.5, -3.0, -1.0, -4.0], [-1.0, -1.0, -1.0]]
    adv, stats = step_advantages(cfg, _roles(), samples, ref)
    assert adv[0] == pytest.approx([0.938018, 1.030282, 0, 1.030282, 0], abs=TOL)
    assert adv[1] == pytest.approx([-0.999527] * 3, abs=TOL)
    assert stats["kl"] == pytest.approx(-0.083333, abs=TOL)


def test_multi_turn_budget_is_max_new_tokens_times_max_turns():
    from posttrain.step import shaped_rewards

    # DAPO overlong shaping, budget 8 * 3 = 24 sampled tokens, buffer round(0.2 * 24) = 5: no penalty up to 19.
    # The episode holds 30 tokens, 21 of them sampled: penalty -(21 - 19) / 5 = -0.4 (single-turn counting would
    # take 30 tokens against a budget of 8: -1).
    cfg = load_config(None, ["algorithm.name=dapo", "rollout.environment=pkg.env:Env", "rollout.max_turns=3",
                             "rollout.max_new_tokens=8"])
    assert sampled_token_budget(cfg.rollout) == 24
    assert sampled_token_budget(load_config(None, ["rollout.max_new_tokens=8"]).rollout) == 8
    samples = StepSamples(completions=[[5] * 30], rewards=[1.0], loss_masks=[[1] * 12 + [0] * 9 + [1] * 9])
    assert shaped_rewards(cfg, samples).tolist() == pytest.approx([0.6], abs=1e-6)


def test_dr_grpo_divides_an_episode_by_the_multi_turn_budget(cfg_dict, tiny_model_dir):
    # loss_agg=constant, one update (ratio 1): -mean_i(A_i * sampled_i) / C. Sampled tokens [4, 3, 2, 2], A [1, -0.5,
    # 0.3, -0.2]: mean (4 - 1.5 + 0.6 - 0.4) / 4 = 0.675. Multi-turn C = 8 * 3 = 24 -> -0.028125 (C = 8: -0.084375).
    cfg = _override(cfg_dict, algorithm={"name": "dr_grpo", "loss_agg": "constant"},
                    rollout={"environment": "pkg.env:Env", "max_turns": 3, "max_new_tokens": 8})
    m = Trainer(cfg, tiny_model_dir).train_step(_masked_batch(advantages=[1.0, -0.5, 0.3, -0.2], ref_logprobs=None))
    assert m["policy_loss"] == pytest.approx(-0.028125, abs=TOL)


# ------------------------------------------------------------------ (d) no mask: the old numbers, bit for bit


def test_step_advantages_without_a_mask_equal_an_all_ones_mask_bit_for_bit():
    from posttrain.step import step_advantages

    g = torch.Generator().manual_seed(1)
    comps = [[6] * k for k in (5, 3, 4, 1)]
    lps = [torch.randn(len(c), generator=g).tolist() for c in comps]
    ref = [torch.randn(len(c), generator=g).tolist() for c in comps]
    values = [torch.randn(len(c), generator=g).tolist() for c in comps]
    for name, critic in (("reinforce_pp", None), ("ppo", values)):
        cfg = load_config(None, [f"algorithm.name={name}", "algorithm.kl_coef=0.05", "algorithm.group_size=2",
                                 "algorithm.prompts_per_step=2", "algorithm.gamma=0.9", "algorithm.gae_lambda=0.8"])
        runs = []
        for masks in ([], [[1] * len(c) for c in comps]):
            s = StepSamples(prompts=[[5]] * 4, completions=comps, engine_logprobs=lps, rewards=[1.0, 0.0, 0.5, 0.2],
                            loss_masks=masks)
            runs.append(step_advantages(cfg, _roles(critic, []), s, ref))
        (adv0, stats0), (adv1, stats1) = runs
        assert adv0 == adv1 and stats0 == stats1, name


def _masked_batch(**changes) -> TrainBatch:
    """Four samples, two of them episodes with a tool turn inside (tokens from the tiny model's vocabulary)."""
    b = dict(prompts=[[5, 6, 7], [8, 9], [5, 6, 7], [10, 11, 12, 13]],
             completions=[[14, 15, 16, 17, 18, 19], [20, 21, 22], [23, 24, 25, 26], [27, 28]],
             loss_masks=[[1, 1, 0, 0, 1, 1], [1, 1, 1], [1, 0, 0, 1], [1, 1]],
             advantages=[[1.0] * 6, [-0.5] * 3, [0.3] * 4, [-0.2] * 2],
             engine_logprobs=[[-3.4, -3.5, 0.0, 0.0, -3.3, -3.6], [-3.5] * 3, [-3.2, 0.0, 0.0, -3.7], [-3.5] * 2],
             ref_logprobs=[[-3.3, -3.4, -3.5, -3.6, -3.2, -3.5], [-3.6] * 3, [-3.3, -3.1, -3.2, -3.8], [-3.4] * 2])
    b.update(changes)
    return TrainBatch(**b)


def _train(cfg: dict, model_dir: str, batch: TrainBatch) -> tuple[dict, dict]:
    trainer = Trainer(cfg, model_dir)
    metrics = trainer.train_step(batch)
    metrics.pop("train_compute_s")
    return metrics, {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def _same(a: tuple[dict, dict], b: tuple[dict, dict]) -> None:
    assert a[0] == b[0]
    assert a[1].keys() == b[1].keys() and all(torch.equal(a[1][k], b[1][k]) for k in a[1])


# Two updates of two minibatches each, one-step-off (the ratio against the engine's logprobs) and a KL term: every
# branch of Trainer.train_step that reads the mask.
MULTI = dict(algorithm={"updates_per_batch": 2, "minibatches": 2, "kl_coef": 0.05, "lr": 3e-3},
             rollout={"async_one_step_off": True})


def test_trainer_without_a_mask_equals_an_all_ones_mask_bit_for_bit(cfg_dict, tiny_model_dir):
    cfg = _override(cfg_dict, **MULTI)
    plain = _masked_batch(loss_masks=None)
    ones = _masked_batch(loss_masks=[[1] * len(c) for c in plain.completions])
    _same(_train(cfg, tiny_model_dir, plain), _train(cfg, tiny_model_dir, ones))


# ------------------------------------------------------------------ (e) the Trainer with a mask, in-process


def test_trainer_ignores_values_at_masked_positions(cfg_dict, tiny_model_dir):
    # Advantages, engine logprobs (the one-step-off ratio's old logprobs) and reference logprobs on tool tokens
    # changed: the same metrics and the same weights after 4 updates, bit for bit.
    cfg = _override(cfg_dict, **MULTI)
    base = _masked_batch()
    other = _masked_batch(
        advantages=[[1.0, 1.0, 50.0, -50.0, 1.0, 1.0], [-0.5] * 3, [0.3, 9.0, -9.0, 0.3], [-0.2] * 2],
        engine_logprobs=[[-3.4, -3.5, -0.1, -20.0, -3.3, -3.6], [-3.5] * 3, [-3.2, -5.0, -1.0, -3.7], [-3.5] * 2],
        ref_logprobs=[[-3.3, -3.4, -0.5, -9.0, -3.2, -3.5], [-3.6] * 3, [-3.3, -7.0, -0.2, -3.8], [-3.4] * 2])
    first = _train(cfg, tiny_model_dir, base)
    _same(first, _train(cfg, tiny_model_dir, other))
    assert first[0]["trained_tokens"] == 4 + 3 + 2 + 2


def test_trainer_step_with_a_mask_counts_sampled_tokens(cfg_dict, tiny_model_dir):
    # One update (ratio 1): policy loss = -(sum_i A_i * sampled_i) / sampled tokens
    #   = -(1.0 * 4 - 0.5 * 3 + 0.3 * 2 - 0.2 * 2) / 11 = -2.7 / 11 = -0.245455
    batch = _masked_batch(advantages=[1.0, -0.5, 0.3, -0.2], ref_logprobs=None)
    trainer = Trainer(_float64(cfg_dict), tiny_model_dir)  # float64: the entropy below is computed another way
    with torch.no_grad():  # entropy per token over every completion token, before the update
        unmasked = pack(batch.prompts, batch.completions, trainer.pad_id)
        _, entropy = completion_logprobs(trainer.model, unmasked, with_entropy=True)
    m = trainer.train_step(batch)
    mask = pack(batch.prompts, batch.completions, trainer.pad_id, batch.loss_masks).completion_mask
    assert m["trained_tokens"] == float(mask.sum()) == 11.0
    assert m["policy_loss"] == pytest.approx(-2.7 / 11, abs=TOL)
    # The step's entropy is the mean over the sampled tokens only.
    # (The random tiny model is near-uniform everywhere, so the bigram test above is where the 4-vs-15-token
    # difference shows.)
    assert_same(m["entropy"], (entropy * mask).sum() / 11, "entropy")


def test_critic_values_and_value_loss_on_sampled_tokens(tiny_model_dir):
    from posttrain.training.critic import Critic

    cfg = load_config(None, ["algorithm.name=ppo", f"model.path={tiny_model_dir}", "algorithm.group_size=2",
                             "algorithm.prompts_per_step=2", "topology.torch_threads=1",
                             "algorithm.value_clip=null"]).to_dict()
    b = _masked_batch()
    critic = Critic(cfg, tiny_model_dir)
    values = critic.values(b.prompts, b.completions, b.loss_masks)
    assert [[v != 0 for v in row] for row in values] == [[bool(x) for x in m] for m in b.loss_masks]
    # Returns at tool tokens are garbage; the value loss (its first minibatch is before any update) must not see them.
    returns = [[1.0 if x else 1e3 for x in m] for m in b.loss_masks]
    first = Critic(cfg, tiny_model_dir).train_step(b.prompts, b.completions, returns, values, b.loss_masks)
    clean = [[1.0] * len(m) for m in b.loss_masks]
    again = Critic(cfg, tiny_model_dir).train_step(b.prompts, b.completions, clean, values, b.loss_masks)
    assert first == again


# ------------------------------------------------------------------ (f) the sharded trainer, one rank in-process


def test_sharded_trainer_takes_the_mask(cfg_dict, tiny_model_dir):
    from posttrain.training.accumulation import loss_share
    from posttrain.training.distributed import ShardedTrainer, free_port

    # The token share of a rank counts sampled tokens: rows with 2 + 3 sampled tokens of a minibatch's 5 + 1.
    mask = torch.tensor([[1.0, 0, 0, 1], [1, 1, 0, 1], [0, 1, 0, 0]])
    assert loss_share(mask[:2], mask, "token") == pytest.approx(5 / 6)

    batch = _masked_batch(advantages=[1.0, -0.5, 0.3, -0.2], ref_logprobs=None)
    cfg = _float64(cfg_dict)  # FSDP runs the full forward, the single Trainer the head at completion positions only
    single = Trainer(cfg, tiny_model_dir).train_step(batch)
    rank = ShardedTrainer(cfg, tiny_model_dir, 0, 1)
    rank.join("127.0.0.1", free_port())
    try:
        sharded = rank.train_step(batch)
    finally:
        rank.leave()
    assert sharded["trained_tokens"] == 11.0
    assert sharded["policy_loss"] == pytest.approx(-2.7 / 11, abs=TOL)
    for key in ("loss", "entropy", "logprob_gap_mean", "logprob_gap_max", "grad_norm"):
        assert_same(sharded[key], single[key], key)
