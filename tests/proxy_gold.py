"""Proxy reward beside gold on fixed problems: greedy completions of a policy directory, scored by a reward model
(normalized, as the loop sees it) and by the task's hidden gold function. Comparing a run's first and last
policy on the same problems takes the prompt-to-prompt noise out of the per-step `reward/rm` curve. A helper of
tests/test_rlhf_integration.py."""

from __future__ import annotations

from pathlib import Path

from posttrain.rewards.gold import gold_function


def greedy_proxy_and_gold(policy_dir: str | Path, rm_dir: str | Path, task, problems, *, chat_template: str = "auto",
                          max_new_tokens: int = 8) -> dict[str, float]:
    """{"proxy": mean normalized RM score, "gold": mean gold score, "exact": exact-match share, "n": problems}
    of the policy's greedy completions of `problems`."""
    from posttrain.training.heldout import greedy_accuracy
    from posttrain.models.loading import PromptEncoder, load_causal_lm
    from posttrain.rewards.reward_model import RewardModel

    model, tok = load_causal_lm(policy_dir)
    exact, texts = greedy_accuracy(model, PromptEncoder(tok, chat_template), task, problems, max_new_tokens)
    proxy = RewardModel(str(rm_dir), chat_template=chat_template).score([(p.prompt, t) for p, t in zip(problems, texts)])
    gold = gold_function(task.name)
    golds = [gold(p.answer, t) for p, t in zip(problems, texts)] if gold else []
    return {"proxy": sum(proxy) / len(proxy), "gold": sum(golds) / len(golds) if golds else float("nan"),
            "exact": exact, "n": len(problems)}
