"""Gradient accumulation over micro-batches (train.micro_batch): each minibatch's step computed from micro-batches whose
losses are weighted by their share of the minibatch's loss takes the whole minibatch's step. Compared in float64
against F64_TOL (tests/numerics_bounds.py): the weights after two steps and every step metric, for each
algorithm.loss_agg, in the single gradient pass (minibatches=1) and with separate old logprobs (2 minibatches x 2
updates, a KL term); across 2 FSDP ranks; and with activation checkpointing on. Planted once (then reverted): each
micro-batch's loss weighted 1/k in the backward instead of by its share: 7 of 8 equality tests failed (grad_norm gaps
0.015 .. 0.073 in the single pass, loss gaps 1.9e-4 .. 0.018 at the second step of two minibatches)."""

from __future__ import annotations

import random

import pytest
import torch
from numerics_bounds import assert_same

from posttrain.config import load_config
from posttrain.training.accumulation import micro_batches
from posttrain.training.trainer import TrainBatch, Trainer

METRICS = ("loss", "policy_loss", "kl", "clip_fraction", "ratio_mean", "grad_norm", "entropy", "logprob_gap_mean",
           "trained_tokens")
SINGLE_PASS = ("algorithm.minibatches=1", "algorithm.updates_per_batch=1")
TWO_MINIBATCHES = ("algorithm.minibatches=2", "algorithm.updates_per_batch=2", "algorithm.kl_coef=0.05")


def test_micro_batches_split_a_minibatch_in_order():
    idx = torch.tensor([4, 0, 3, 1, 2])
    assert [m.tolist() for m in micro_batches(idx, 2)] == [[4, 0], [3, 1], [2]]
    assert [m.tolist() for m in micro_batches(idx, None)] == [[4, 0, 3, 1, 2]]
    assert [m.tolist() for m in micro_batches(idx, 8)] == [[4, 0, 3, 1, 2]]


def _batches(steps: int, rows: int = 8) -> list[TrainBatch]:
    """Completions of 1..6 tokens: micro-batches hold unequal token shares, so a share by rows differs from one by
    tokens."""
    rng = random.Random(0)
    out = []
    for step in range(steps):
        prompts = [[rng.randrange(3, 40) for _ in range(rng.randrange(2, 7))] for _ in range(rows)]
        comps = [[rng.randrange(3, 40) for _ in range(rng.randrange(1, 7))] for _ in range(rows)]
        out.append(TrainBatch(prompts=prompts, completions=comps, advantages=[rng.uniform(-1, 1) for _ in comps],
                              engine_logprobs=[[-3.5] * len(c) for c in comps],
                              ref_logprobs=[[rng.uniform(-4, -3) for _ in c] for c in comps], step=step))
    return out


def _train(model_dir: str, *overrides: str) -> tuple[list[dict], dict[str, torch.Tensor]]:
    cfg = load_config(None, [f"model.path={model_dir}", "model.dtype=float64", "rollout.engine=hf",
                             "algorithm.group_size=2", "algorithm.prompts_per_step=4", "algorithm.lr=3e-3",
                             "train.steps=2", "topology.torch_threads=1", *overrides])
    trainer = Trainer(cfg.to_dict(), model_dir)
    metrics = [trainer.train_step(b) for b in _batches(2)]
    return metrics, {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def _assert_same_steps(got, want) -> None:
    for step_got, step_want in zip(got[0], want[0]):
        for key in METRICS:
            assert_same(step_got[key], step_want[key], key)
    assert_same(got[1], want[1], "weights")


@pytest.mark.parametrize("agg", ["token", "sequence", "constant"])
@pytest.mark.parametrize("passes", [SINGLE_PASS, TWO_MINIBATCHES], ids=["single-pass", "two-minibatches"])
def test_micro_batches_take_the_whole_minibatchs_step(tiny_model_dir, agg, passes):
    whole = _train(tiny_model_dir, f"algorithm.loss_agg={agg}", *passes)
    # 8 rows in micro-batches of 3 (3, 3, 2); two minibatches of 4: (3, 1)
    micro = _train(tiny_model_dir, f"algorithm.loss_agg={agg}", *passes, "train.micro_batch=3")
    _assert_same_steps(micro, whole)
    assert any(float((whole[1][k] - v).abs().max()) > 1e-4 for k, v in _initial(tiny_model_dir).items())  # it moved


def test_activation_checkpointing_takes_the_same_step(tiny_model_dir):
    whole = _train(tiny_model_dir, *SINGLE_PASS)
    _assert_same_steps(_train(tiny_model_dir, *SINGLE_PASS, "train.micro_batch=3",
                              "train.activation_checkpointing=true"), whole)


def _initial(model_dir: str) -> dict[str, torch.Tensor]:
    cfg = load_config(None, [f"model.path={model_dir}", "model.dtype=float64", "rollout.engine=hf"])
    return {k: v.detach().clone() for k, v in Trainer(cfg.to_dict(), model_dir).model.state_dict().items()}


def test_rank_micro_batches_give_every_rank_as_many_passes():
    from posttrain.training.distributed import rank_micro_batches

    # a minibatch of 5 rows on 2 ranks: 3 and 2 rows; micro-batches of 2 -> 2 passes on each rank
    assert [m.tolist() for m in rank_micro_batches(torch.tensor([7, 1, 4]), 3, 2)] == [[7, 1], [4]]
    assert [m.tolist() for m in rank_micro_batches(torch.tensor([0, 5]), 3, 2)] == [[0, 5], []]
    assert [m.tolist() for m in rank_micro_batches(torch.tensor([], dtype=torch.long), 1, None)] == [[]]


@pytest.mark.integration
def test_two_ranks_with_micro_batches_take_the_single_trainers_step(tiny_model_dir):
    """2 FSDP ranks, each rank's rows in micro-batches of 1 (the ranks hold 3 and 2 rows of a minibatch of 5: the
    second pads with an empty pass), against the single Trainer on whole minibatches (tests/test_scaleout.py's
    check, with accumulation inside each rank)."""
    import ray

    from posttrain.config import RayConfig
    from posttrain.orchestration.runtime import start_ray, stop_ray
    from posttrain.orchestration.trainer_group import create_trainer_group
    from safetensors.torch import load as load_bytes

    base = [f"model.path={tiny_model_dir}", "model.dtype=float64", "rollout.engine=hf", "algorithm.group_size=2",
            "algorithm.prompts_per_step=5", "algorithm.minibatches=2", "algorithm.updates_per_batch=2",
            "algorithm.kl_coef=0.05", "algorithm.lr=3e-3", "train.steps=2", "topology.torch_threads=1"]
    whole = _train_cfg(tiny_model_dir, base)
    start_ray(RayConfig(num_cpus=4), 4)
    try:
        cfg = load_config(None, [*base, "topology.trainer_ranks=2", "train.micro_batch=1"])
        group = create_trainer_group(cfg, tiny_model_dir, lambda r: {"num_cpus": 1})
        steps = [ray.get(group.train_step.remote(b)) for b in _batches(2, 10)]
        weights = load_bytes(ray.get(group.export_weights.remote()))
    finally:
        stop_ray()
    for got, want in zip(steps, whole[0]):
        for key in METRICS:
            assert_same(got[key], want[key], key)
    tied = {k: v for k, v in whole[1].items() if k in weights}
    assert_same({k: weights[k] for k in tied}, tied, "weights")


def _train_cfg(model_dir: str, overrides: list[str]):
    cfg = load_config(None, overrides)
    trainer = Trainer(cfg.to_dict(), model_dir)
    metrics = [trainer.train_step(b) for b in _batches(2, 10)]
    return metrics, {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def test_the_cpu_trainers_peak_by_hand():
    from posttrain.probe_stats import trainer_peak_text
    from posttrain.topology.memory import TRAINER_PROCESS_BYTES, cpu_trainer_peak_bytes
    from posttrain.topology.model_shape import ModelShape

    smol = ModelShape(hidden=576, layers=30, heads=9, kv_heads=3, intermediate=1536, vocab=49152, tied=True)
    assert smol.params == 134_515_008  # SmolLM2-135M
    # 8 samples of 55 tokens: 30 layers x 440 tokens x (8*576 + 2*192 + 4*1536 = 11,136) x 4 bytes = 587,980,800
    # (saved-tensor hooks counted 591,266,080 on the model); the head over 440 < 512 tokens: 3 x 440 x 49,152 x 4
    parts = cpu_trainer_peak_bytes(smol, 440, "float32", checkpointing=False, chunk_tokens=512)
    assert parts == {"process": TRAINER_PROCESS_BYTES, "train_states": 2_152_240_128, "activations": 587_980_800,
                     "head": 259_522_560}
    # checkpointing: each layer's input (576 a token) plus one layer's whole set recomputed in the backward
    ckpt = cpu_trainer_peak_bytes(smol, 440, "float32", checkpointing=True, chunk_tokens=512)["activations"]
    assert ckpt == 30 * 440 * 576 * 4 + 440 * 11_136 * 4
    assert trainer_peak_text(3.1, 2.9) == "trainer peak 3.10 GB measured, 2.90 GB predicted (-6%)"
    assert trainer_peak_text(3.1, None) == "trainer peak 3.10 GB measured"
