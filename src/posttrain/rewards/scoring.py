"""The loop's reward block: asks each weighted source for its scores (verifier worker, reward-model actor, judge,
and the cheap text-only sources in the driver), composes the total with rewards/compose.py, and returns every
component so each is logged as reward/<name>. The gold score (built-in tasks only) is computed when asked, logged,
and never added to the reward."""

from __future__ import annotations

from dataclasses import dataclass

from posttrain.rewards.compose import compose, ensemble_mean, ensemble_spread, format_component, length_component
from posttrain.rewards.gold import gold_function


@dataclass
class ScoredBatch:
    rewards: list[float]                 # the composed reward per sample
    components: dict[str, list[float]]   # source -> score per sample (also 'gold' and 'rm_disagreement' when logged)
    errors: list[str | None]             # why a sample's verifier (or judge) scoring failed; None = scored
    verifier: list[float] | None         # verifier scores (for accuracy), None when not computed

    @property
    def failures(self) -> int:
        return sum(e is not None for e in self.errors)


def score_batch(cfg, roles, items: list[tuple[str, str, str, str]], completion_tokens: list[int],
                judge=None) -> ScoredBatch:
    """items: (problem_id, prompt, answer, completion_text) per sample; completion_tokens: their lengths."""
    import ray

    w = cfg.reward.weights
    texts = [it[3] for it in items]
    refs = {"verifier": roles.reward.score.remote(items)}
    if w.get("rm"):
        refs["rm"] = roles.reward_model.member_scores.remote([(it[1], it[3]) for it in items])
    components: dict[str, list[float]] = {}
    errors: list[str | None] = [None] * len(items)
    if w.get("judge"):  # HTTP from the driver while the actors score
        judged = judge.results([(it[1], it[3]) for it in items])
        components["judge"] = [r.reward for r in judged]
        errors = [None if r.error is None else f"judge: {r.error}" for r in judged]
    got = dict(zip(refs, ray.get(list(refs.values()))))
    scored = got["verifier"]
    components["verifier"] = [r for r, _ in scored]
    errors = [v_err or j_err for (_, v_err), j_err in zip(scored, errors)]
    if "rm" in got:  # one list per ensemble member (reward.rm_path, then reward.rm_ensemble)
        components["rm"] = ensemble_mean(got["rm"])
        if len(got["rm"]) > 1:  # logged, never added: how much the members disagree on each sample
            components["rm_disagreement"] = ensemble_spread(got["rm"])
    components["length"] = length_component(completion_tokens, cfg.rollout.max_new_tokens)
    components["format"] = format_component(texts, cfg.reward.format_regex)
    total = compose(components, w)
    gold = gold_function(cfg.task.name) if cfg.reward.log_gold else None
    if gold is not None:
        components["gold"] = [gold(it[2], it[3]) for it in items]
    return ScoredBatch(total, components, errors, components["verifier"])


def component_means(components: dict[str, list[float]]) -> dict[str, float]:
    """reward/<source> -> the batch mean of that source, for metrics.jsonl."""
    return {f"reward/{k}": sum(v) / len(v) for k, v in components.items() if v}
