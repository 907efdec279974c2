"""PPO's critic in-process (the same class the driver makes a Ray actor): per-token values shaped like the
completions, value regression that moves toward the returns, and a save/load round trip that restores the values
and the optimizer (what a resumed PPO run relies on)."""

from __future__ import annotations

import pytest
import torch

from posttrain.config import load_config
from posttrain.training.critic import CRITIC_DIR, CRITIC_STATE, Critic

PROMPTS = [[5, 6, 7], [5, 6, 7], [8, 9], [8, 9]]
COMPLETIONS = [[10, 11, 1], [12, 1], [13], [14, 15, 16]]


@pytest.fixture(scope="module")
def cfg_dict(tiny_model_dir):
    return load_config(None, ["algorithm.name=ppo", f"model.path={tiny_model_dir}", "algorithm.group_size=2",
                              "algorithm.prompts_per_step=2", "algorithm.minibatches=2", "algorithm.updates_per_batch=2",
                              "topology.torch_threads=1", "algorithm.value_clip=null"]).to_dict()


def test_values_train_toward_returns_and_survive_a_checkpoint(cfg_dict, tiny_model_dir, tmp_path):
    critic = Critic(cfg_dict, tiny_model_dir)
    values = critic.values(PROMPTS, COMPLETIONS)
    assert [len(v) for v in values] == [3, 2, 1, 3]
    returns = [[1.0] * len(c) for c in COMPLETIONS]
    first = critic.train_step(PROMPTS, COMPLETIONS, returns, values)
    for _ in range(10):
        last = critic.train_step(PROMPTS, COMPLETIONS, returns, critic.values(PROMPTS, COMPLETIONS))
    assert last["value_loss"] < 0.5 * first["value_loss"], (first, last)  # 2 epochs x 2 minibatches per call

    critic.save(str(tmp_path))
    assert (tmp_path / CRITIC_DIR / "model.safetensors").is_file() and (tmp_path / CRITIC_DIR / CRITIC_STATE).is_file()
    restored = Critic(cfg_dict, tiny_model_dir)
    restored.load(str(tmp_path))
    a, b = critic.values(PROMPTS, COMPLETIONS), restored.values(PROMPTS, COMPLETIONS)
    assert max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb)) < 1e-6
    sa, sb = critic.optimizer.state_dict()["state"], restored.optimizer.state_dict()["state"]
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k]["exp_avg"], sb[k]["exp_avg"]) for k in sa)


def test_load_without_a_critic_says_so(cfg_dict, tiny_model_dir, tmp_path):
    with pytest.raises(RuntimeError, match="no critic/"):
        Critic(cfg_dict, tiny_model_dir).load(str(tmp_path))
