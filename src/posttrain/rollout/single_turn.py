"""Single-turn rollout: one prompt, `group_size` completions, each scored (the default rollout kind). Multi-turn
episodes (rollout/multi_turn.py) and one-step-off rollouts (one_step_off.py) are its peers; step.py picks
one with `rollout_and_score`."""

from __future__ import annotations

import time

from posttrain.config import RunConfig
from posttrain.models.loading import PromptEncoder
from posttrain.rewards.scoring import score_batch
from posttrain.rollout.engine import SamplingSpec
from posttrain.rollout.fleet import generate_on_workers, rollout_resync
from posttrain.rollout.partial import PartialRollout, generate_resumable
from posttrain.rollout.sampler import sample_seed
from posttrain.rollout.samples import StepSamples
from posttrain.tasks import Problem


def sampling_spec(cfg: RunConfig, n: int) -> SamplingSpec:
    r = cfg.rollout
    return SamplingSpec(n=n, max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p)


def rollout_single_turn(cfg: RunConfig, step: int, roles, encoder: PromptEncoder, problems: list[Problem],
                        first_index: int, times: dict, partial: PartialRollout | None = None) -> StepSamples:
    """Samples group_size completions for each problem and scores them; `first_index` numbers the problems within
    the step (for their sampling seeds) when a step rolls out more than once. Adds to times["generate"/"reward"].
    `partial` (partial rollouts, rollout/partial.py): interrupted samples resume under the newest weights, and
    `token_versions` records each token's policy version."""
    n = cfg.algorithm.group_size
    prompts = [encoder.encode(p.prompt) for p in problems]
    seeds = [sample_seed(cfg.seed, step, first_index + i) for i in range(len(problems))]

    def generate(prompts, spec, seeds):  # a cut call's duration is no hang bound: remote/watchdog.py UNTIMED
        return generate_on_workers(roles.rollout, prompts, spec, seeds, rollout_resync(roles), watchdog=roles.watchdog,
                                   kind="generate" if partial is None else "generate_interruptible")

    t = time.perf_counter()
    spec = sampling_spec(cfg, n)
    groups = generate(prompts, spec, seeds) if partial is None else \
        generate_resumable(generate, prompts, spec, seeds, partial)
    times["generate"] += time.perf_counter() - t

    # Flatten group by group; a sample's id is (step, prompt_id, sample_index).
    out = StepSamples()
    for p, ids, comps in zip(problems, prompts, groups):
        if len(comps) != n:
            raise RuntimeError(f"engine returned {len(comps)} completions for {p.id}, expected {n}")
        for j, c in enumerate(comps):
            out.sample_ids.append(f"{step}/{p.id}/{j}")
            out.prompts.append(ids)
            out.completions.append(list(c.token_ids))
            out.engine_logprobs.append(list(c.logprobs))
            if partial is not None:
                out.token_versions.append(list(c.versions))
            out.items.append((p.id, p.prompt, p.answer, encoder.decode_completion(c.token_ids)))
    score_samples(cfg, roles, out, problems, step, times)
    return out


def score_samples(cfg: RunConfig, roles, out: StepSamples, problems: list[Problem], step: int, times: dict,
                  completion_tokens: list[int] | None = None, extra: dict[str, list] | None = None) -> None:
    """Scores `out` (group_size samples per problem, in order) in place: rewards, verifier, components, errors.
    `completion_tokens`: the lengths the length source counts (default: the completions'); `extra`: further
    reward components (the environment's). Adds to times["reward"]."""
    n = cfg.algorithm.group_size
    t = time.perf_counter()
    scored = score_batch(cfg, roles, out.items, completion_tokens or [len(c) for c in out.completions], roles.judge,
                         completion_ids=out.completions, sample_ids=out.sample_ids, step=step + 1,
                         columns=[p.columns for p in problems for _ in range(n)], extra=extra)
    times["reward"] += time.perf_counter() - t
    out.rewards = scored.rewards
    out.function_errors = scored.function_errors or [{} for _ in range(len(out))]
    out.errors = scored.errors
    out.verifier = scored.verifier
    out.components = [{k: v[i] for k, v in scored.components.items()} for i in range(len(out))]
