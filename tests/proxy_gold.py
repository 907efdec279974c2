"""Proxy reward beside gold on fixed problems: seeded samples of a policy directory's completions, scored by a
reward model (normalized, as the loop sees it) and by the task's hidden gold function. Comparing a run's first and
last policy on the same problems takes the prompt-to-prompt noise out of the per-step `reward/rm` curve. A helper of
tests/test_rlhf_integration.py."""

from __future__ import annotations

from pathlib import Path

from posttrain.rewards.gold import gold_function


def sampled_proxy_and_gold(policy_dir: str | Path, rm_dir: str | Path, task, problems, *, samples: int = 8,
                           seed: int = 0, chat_template: str = "auto", max_new_tokens: int = 8,
                           batch_size: int = 256) -> dict[str, float]:
    """{"proxy": mean normalized RM score, "gold": mean gold score, "exact": exact-match share, "n": completions}
    over `samples` completions of each problem drawn at temperature 1 with a seeded generator: the policy's expected
    proxy and gold scores, which is what GRPO against the proxy raises (a greedy completion can stay put while the
    distribution moves, and 64 greedy answers move in steps of 1/64)."""
    from functools import partial

    import torch

    from posttrain.models.loading import PromptEncoder, load_causal_lm
    from posttrain.rewards.reward_model import RewardModel
    from posttrain.training.heldout import completion_texts, sampled_completions

    model, tok = load_causal_lm(policy_dir)
    rows = [p for p in problems for _ in range(samples)]
    draw = partial(sampled_completions, generator=torch.Generator().manual_seed(seed))
    texts = completion_texts(model, PromptEncoder(tok, chat_template), rows, draw, max_new_tokens, batch_size)
    proxy = RewardModel(str(rm_dir), chat_template=chat_template).score([(p.prompt, t) for p, t in zip(rows, texts)])
    gold = gold_function(task.name)
    golds = [gold(p.answer, t) for p, t in zip(rows, texts)] if gold else []
    return {"proxy": sum(proxy) / len(proxy), "gold": sum(golds) / len(golds) if golds else float("nan"),
            "exact": sum(task.score(p, t) for p, t in zip(rows, texts)) / len(rows), "n": len(rows)}
