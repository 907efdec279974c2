"""Partial rollouts (`rollout.partial_rollouts: true`, with asynchronous rollout): when the trainer publishes new
weights while a batch is being generated, the engines' unfinished requests are aborted (`interrupt()`), the new
weights loaded into the idle engines, and each cut sample resumes from the tokens it already has, under the new
policy. A long completion then no longer holds a whole step back, and every token records the policy version that
sampled it (the oldest one bounds the batch's staleness; one_step_off.py).

The driver side, free of Ray and engines: `generate_resumable` takes any `generate(prompts, spec, seeds)` (the
fleet's) and a `before_resume()` that loads the newest weights and returns their version. A continuation request is
the prompt followed by the tokens so far, with the budget left (max_new_tokens minus those tokens) and a seed
derived from the sample's own seed and how often it was resumed, so a rerun draws the same tokens. The engine
recomputes the prefix's keys and values under the new weights; the prefix's tokens and logprobs are kept as they
were sampled (they are what the behaviour policy of their version produced)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from posttrain.rollout.engine import Completion, SamplingSpec

ABORTED = "aborted"


@dataclass
class PartialRollout:
    """What a rollout needs to resume cut samples: the engines' policy version as the batch starts, and
    `before_resume()`, which loads the newest weights into the (idle) engines and returns their version."""

    version: int
    before_resume: Callable[[], int]


@dataclass
class Sample:
    """One sample across its requests: the prompt, its seed (the first request's), and what it has so far. Reads
    like a Completion (token_ids, logprobs, finish_reason); `versions[t]` is the policy version token t came from."""

    prompt: list[int]
    seed: int
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish_reason: str = ABORTED
    resumes: int = 0


def resume_seed(seed: int, resumes: int) -> int:
    """The seed of a sample's `resumes`-th continuation (>= 1): a 63-bit hash of (seed, resumes), so continuations
    never reuse the sample's own stream (seed + j belongs to its group's other samples) and reruns repeat them."""
    digest = hashlib.blake2b(f"{seed}/resume{resumes}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def absorb(sample: Sample, completion: Completion, version: int, max_new_tokens: int) -> None:
    """Appends what one request of `sample` returned, sampled under policy `version`. A sample that used its whole
    budget is finished ("length") even if its request came back aborted."""
    sample.token_ids += completion.token_ids
    sample.logprobs += completion.logprobs
    sample.versions += [version] * len(completion.token_ids)
    sample.finish_reason = completion.finish_reason
    if sample.finish_reason == ABORTED and len(sample.token_ids) >= max_new_tokens:
        sample.finish_reason = "length"


def continuation(sample: Sample, max_new_tokens: int) -> tuple[list[int], int, int]:
    """The next request of an aborted `sample`: (prompt + tokens so far, tokens left of the budget, seed). Counts
    the resume."""
    sample.resumes += 1
    return list(sample.prompt) + list(sample.token_ids), max_new_tokens - len(sample.token_ids), \
        resume_seed(sample.seed, sample.resumes)


def generate_resumable(generate, prompts: list[list[int]], spec: SamplingSpec, seeds: list[int],
                       partial: PartialRollout) -> list[list[Sample]]:
    """`generate(prompts, spec, seeds)` (prompt i's sample j seeded seeds[i] + j, as every engine does) with its
    interrupted samples resumed until all have finished: after each round that left some cut, `before_resume()`
    loads the newest weights and the cut ones continue (grouped by the budget they have left, one `generate` call
    per group, n=1 each). Returns, per prompt, `spec.n` Samples."""
    spec = replace(spec, interruptible=True)
    groups = generate(prompts, spec, seeds)
    samples = [[Sample(list(p), seed + j) for j in range(spec.n)] for p, seed in zip(prompts, seeds)]
    for group, comps in zip(samples, groups):
        for s, c in zip(group, comps):
            absorb(s, c, partial.version, spec.max_new_tokens)
    while cut := [s for group in samples for s in group if s.finish_reason == ABORTED]:
        version = partial.before_resume()
        for budget, batch in _by_budget(cut, spec.max_new_tokens).items():
            requests = [continuation(s, spec.max_new_tokens) for s in batch]
            outs = generate([r[0] for r in requests], replace(spec, n=1, max_new_tokens=budget),
                            [r[2] for r in requests])
            for s, (c,) in zip(batch, outs):
                absorb(s, c, version, spec.max_new_tokens)
    return samples


def _by_budget(cut: list[Sample], max_new_tokens: int) -> dict[int, list[Sample]]:
    """The cut samples by the tokens they have left. One engine's requests are cut at the same step, so there is
    usually one group per interrupted engine."""
    out: dict[int, list[Sample]] = {}
    for s in cut:
        out.setdefault(max_new_tokens - len(s.token_ids), []).append(s)
    return out


def version_range(versions: list[list[int]], default: int) -> tuple[int, int]:
    """(oldest, newest) policy version over every token of a batch; (default, default) when it has no token."""
    flat = [v for vs in versions for v in vs]
    return (min(flat), max(flat)) if flat else (default, default)
