"""The loop's reward block: asks each weighted source for its scores (verifier worker, reward-model actor, judge,
and the cheap text-only sources in the driver), composes the total with rewards/compose.py, and returns every
component so each is logged as reward/<name>. The gold score (built-in tasks only) is computed when asked, logged,
and never added to the reward."""

from __future__ import annotations

from dataclasses import dataclass

from posttrain.rewards.compose import compose, ensemble_mean, ensemble_spread, format_component, length_component
from posttrain.rewards.gold import gold_function
from posttrain.tasks.base import prompt_text


@dataclass
class ScoredBatch:
    rewards: list[float]                 # the composed reward per sample
    components: dict[str, list[float]]   # source -> score per sample (also 'gold' and 'rm_disagreement' when logged)
    errors: list[str | None]             # why a sample's verifier (or judge) scoring failed; None = scored
    verifier: list[float] | None         # verifier scores (for accuracy), None when not computed
    function_errors: list[dict] | None = None  # per sample: reward function name -> why it failed (failed ones only)

    @property
    def failures(self) -> int:
        return sum(e is not None for e in self.errors)


def score_batch(cfg, roles, items: list[tuple[str, str, str, str]], completion_tokens: list[int],
                judge=None, *, completion_ids: list[list[int]] | None = None, sample_ids: list[str] | None = None,
                step: int | str = "?", columns: list[dict] | None = None,
                extra: dict[str, list] | None = None) -> ScoredBatch:
    """items: (problem_id, prompt, answer, completion_text) per sample; completion_tokens: their lengths.
    completion_ids, sample_ids, the dataset row's other columns (one dict per sample) and step are what reward
    functions (reward.functions) are given and name in errors. `extra`: scores computed elsewhere, by source
    (a multi-turn environment's: 'environment', weight 1 unless reward.weights sets one)."""
    from posttrain.remote.watchdog import watched_get

    w = dict(cfg.reward.weights)
    if extra and "environment" in extra:
        w.setdefault("environment", 1.0)
    texts = [it[3] for it in items]
    calls = {"verifier": (roles.reward.score.remote(items), "reward", "reward")}
    if cfg.reward.functions:  # in the reward worker, each in its own child process, while the verifier scores
        w.update({f.name: f.weight for f in cfg.reward.functions})
        ids = sample_ids or [f"{step}/{it[0]}/{i}" for i, it in enumerate(items)]
        rows = [{"prompt": it[1], "completion": it[3], "answer": it[2], "sample_id": sid,
                 "completion_ids": completion_ids[i] if completion_ids is not None else None,
                 "columns": columns[i] if columns is not None else {}}
                for i, (it, sid) in enumerate(zip(items, ids))]
        calls["functions"] = (roles.reward.score_functions.remote(rows, step), "reward_functions", "reward")
    if w.get("rm"):
        calls["rm"] = (roles.reward_model.member_scores.remote([(it[1], it[3]) for it in items]), "reward",
                       "reward_model")
    components: dict[str, list[float]] = dict(extra or {})
    errors: list[str | None] = [None] * len(items)
    if w.get("judge"):  # HTTP from the driver while the actors score
        judged = judge.results([(prompt_text(it[1]), it[3]) for it in items])
        components["judge"] = [r.reward for r in judged]
        errors = [None if r.error is None else f"judge: {r.error}" for r in judged]
    got = dict(zip(calls, watched_get(roles.watchdog, list(calls.values()))))
    scored = got["verifier"]
    components["verifier"] = [r for r, _ in scored]
    errors = [v_err or j_err for (_, v_err), j_err in zip(scored, errors)]
    if "rm" in got:  # one list per ensemble member (reward.rm_path, then reward.rm_ensemble)
        components["rm"] = ensemble_mean(got["rm"])
        if len(got["rm"]) > 1:  # logged, never added: how much the members disagree on each sample
            components["rm_disagreement"] = ensemble_spread(got["rm"])
    function_errors = None
    if "functions" in got:
        function_errors = [{} for _ in items]
        for name, (scores, errs) in got["functions"].items():
            components[name] = scores
            for i, e in enumerate(errs):
                if e is not None:
                    function_errors[i][name] = e
                    errors[i] = errors[i] or e  # the sample's first failure counts it once in the budget
    components["length"] = length_component(completion_tokens, cfg.rollout.max_new_tokens)
    components["format"] = format_component(texts, cfg.reward.format_regex)
    total = compose(components, w)
    gold = gold_function(cfg.task.name) if cfg.reward.log_gold else None
    if gold is not None:
        components["gold"] = [gold(it[2], it[3]) for it in items]
    return ScoredBatch(total, components, errors, components["verifier"], function_errors)


def component_means(components: dict[str, list[float | None]]) -> dict[str, float]:
    """reward/<source> -> the batch mean of that source, for metrics.jsonl; None scores (a reward function that
    does not apply to a sample) are left out, and a source with no score at all is not logged."""
    out = {}
    for k, v in components.items():
        scored = [x for x in v if x is not None]
        if scored:
            out[f"reward/{k}"] = sum(scored) / len(scored)
    return out
