"""What each algorithm name means as knob defaults, and which parts of the loop it needs. Plain data (no torch), so
the config can fill a preset before validation: a key the user sets explicitly always wins over the preset."""

from __future__ import annotations

ALGORITHMS = ("grpo", "dr_grpo", "dapo", "rloo", "reinforce_pp", "ppo", "dpo", "opd")

# Algorithms whose baseline comes from the other samples of the same prompt: they need group_size >= 2, and a group
# whose rewards are all equal carries no signal (its advantages are all 0), so it may be dropped.
GROUP_ALGORITHMS = ("grpo", "dr_grpo", "dapo", "rloo")

# Algorithms that put the KL to the reference into the per-token reward (k1 estimate, log pi_old - log pi_ref) instead
# of adding a k3 KL term to the loss: PPO as in Ouyang et al. 2022 / OpenRLHF, and REINFORCE++ (Hu 2025, eq. 1).
KL_IN_REWARD = ("reinforce_pp", "ppo")

PRESETS: dict[str, dict] = {
    "grpo": {},
    # Liu et al. 2025 ("Understanding R1-Zero-Like Training"): drop the group-std division and the 1/|o_i| length
    # normalisation; the per-sequence token sum is divided by a constant (their code: the generation budget).
    "dr_grpo": {"scale_rewards": False, "loss_agg": "constant"},
    # Yu et al. 2025 (DAPO): clip-higher eps_high=0.28, token-level loss, dynamic sampling, overlong reward shaping
    # (L_cache/L_max = 4096/20480 = 0.2 of the budget), and no KL term.
    "dapo": {"clip_eps_high": 0.28, "loss_agg": "token", "kl_coef": 0.0, "dynamic_sampling_rounds": 3,
             "overlong_buffer_fraction": 0.2},
    "rloo": {},
    "reinforce_pp": {"skip_zero_variance_groups": False},
    "ppo": {"skip_zero_variance_groups": False},
    "dpo": {},
    # On-policy distillation (algorithms/distill.py): the teacher's per-token reverse KL is the advantage, so no
    # reference KL on top (the teacher plays that part) and every group trains (the signal is per token, not a spread).
    "opd": {"skip_zero_variance_groups": False, "kl_coef": 0.0},
}


def apply_preset(data: dict) -> dict:
    """Fills the named algorithm's preset into a raw `algorithm` mapping, leaving explicitly set keys alone."""
    name = data.get("name", "grpo")
    out = dict(PRESETS.get(name, {}))
    out.update(data)
    return out
