"""Multi-turn rollout, the peer of rollout/single_turn.py: `group_size` episodes per prompt (rollout/episodes.py),
scored on their final answer, kept as exact token ids with a loss mask that is 1 on sampled tokens only."""

from __future__ import annotations

from posttrain.config import RunConfig
from posttrain.models.loading import PromptEncoder
from posttrain.rollout.fleet import rollout_resync
from posttrain.rollout.sampler import sample_seed
from posttrain.rollout.samples import StepSamples
from posttrain.rollout.single_turn import sampling_spec, score_samples
from posttrain.tasks import Problem


def rollout_multi_turn(cfg: RunConfig, step: int, roles, encoder: PromptEncoder, problems: list[Problem],
                       first_index: int, times: dict) -> StepSamples:
    """Like `rollout_single_turn`, with episodes: sample j of problem i is an episode whose first turn has that
    sample's seed. The verifier and reward functions score the last assistant turn's text; the environment's reward
    (if it gives one) is the `environment` component. Adds times["generate"/"reward"/"tools"/"environment"] and
    times["generate_turns"] (seconds per turn)."""
    n = cfg.algorithm.group_size
    runner = roles.episodes
    expanded = [p for p in problems for _ in range(n)]
    sample_ids = [f"{step}/{p.id}/{j}" for p in problems for j in range(n)]
    seeds = [sample_seed(cfg.seed, step, first_index + i) + j for i in range(len(problems)) for j in range(n)]
    episodes, spent = runner.run(roles.rollout, expanded, sample_ids, seeds, sampling_spec(cfg, 1),
                                 resync=rollout_resync(roles), watchdog=roles.watchdog)
    times["generate"] += sum(spent.generate_turns)
    times["tools"] = times.get("tools", 0.0) + spent.tools
    times["environment"] = times.get("environment", 0.0) + spent.environment
    turns = times.setdefault("generate_turns", [])
    for k, s in enumerate(spent.generate_turns):
        if k < len(turns):
            turns[k] += s
        else:
            turns.append(s)

    out = StepSamples()
    for p, sid, ep in zip(expanded, sample_ids, episodes):
        out.sample_ids.append(sid)
        out.prompts.append(ep.prompt_ids)
        out.completions.append(ep.completion_ids())
        out.engine_logprobs.append(ep.engine_logprobs())
        out.loss_masks.append(ep.loss_mask())
        out.items.append((p.id, p.prompt, p.answer, ep.final_text()))
        out.episodes.append(ep.record())
    env_rewards = [ep.env_reward() for ep in episodes]
    extra = {"environment": env_rewards} if any(r is not None for r in env_rewards) else None
    score_samples(cfg, roles, out, problems, step, times, completion_tokens=[ep.sampled_tokens() for ep in episodes],
                  extra=extra)
    return out
