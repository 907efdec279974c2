"""Partial rollouts (rollout/partial.py, VllmEngine's interruptible generate, one_step_off.py).

- The driver side by hand, with a fake `generate`: continuation = prompt + tokens so far, the budget left, a seed
  derived from the sample's and its resume count; prefix and continuation concatenated; per-token versions.
- One real in-process vLLM engine (the random tiny model: long completions): uninterrupted, the stepping path returns
  exactly what the plain path does; interrupted (after k engine steps, or from another thread), every cut completion
  is token- and logprob-exactly the start of the uninterrupted one; resumed, it keeps that prefix, stays within
  max_new_tokens, and its tail is what the continuation request alone gives.
The run on real Ray is in tests/test_partial_rollouts_integration.py.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest

from posttrain.rollout.engine import Completion, SamplingSpec
from posttrain.rollout.partial import (PartialRollout, Sample, absorb, continuation, generate_resumable, resume_seed,
                                       version_range)

PROMPTS = [[5, 6, 7, 8, 9], [20, 21], [30, 31, 32, 33, 34, 35, 36, 37], [12]]
SEEDS = [1, 2, 3, 4]
LONG = SamplingSpec(n=2, max_new_tokens=48, temperature=0.9)


# ---------------------------------------------------------------- the driver side, by hand


class FakeEngine:
    """`generate` that records its requests. Round 0: sample (i, j) gets tokens [100*i + 10*j, +1, +2] and is cut
    ("aborted") when j == 1; a continuation gets `budget` tokens [900 + r, ...] (r: its resume count, read back from
    the seed) and finishes "length", or is cut again after one token when `cut_again` holds its prompt's length."""

    def __init__(self, cut_again: set[int] = frozenset()):
        self.calls: list[tuple[list[list[int]], SamplingSpec, list[int]]] = []
        self.cut_again = cut_again

    def generate(self, prompts, spec, seeds):
        self.calls.append((prompts, spec, seeds))
        assert spec.interruptible
        if len(self.calls) == 1:
            return [[Completion([100 * i + 10 * j + t for t in range(3)], [-0.5] * 3, "aborted" if j else "stop")
                     for j in range(spec.n)] for i in range(len(prompts))]
        out = []
        for p in prompts:
            if len(p) in self.cut_again:
                out.append([Completion([800], [-0.25], "aborted")])
            else:
                out.append([Completion([900 + t for t in range(spec.max_new_tokens)], [-1.0] * spec.max_new_tokens,
                                       "length")])
        return out


def test_resume_seed_is_deterministic_and_new():
    assert resume_seed(1024, 1) == resume_seed(1024, 1)
    seeds = {resume_seed(s, r) for s in (0, 1, 1024, 2**62) for r in (1, 2, 3)}
    assert len(seeds) == 12 and all(0 <= s < 2**63 for s in seeds)
    assert resume_seed(1024, 1) not in (1024, 1025)  # not the sample's stream, nor its neighbour's


def test_absorb_and_continuation_by_hand():
    s = Sample(prompt=[1, 2], seed=7)
    absorb(s, Completion([5, 6], [-0.1, -0.2], "aborted"), version=3, max_new_tokens=10)
    assert (s.token_ids, s.logprobs, s.versions, s.finish_reason) == ([5, 6], [-0.1, -0.2], [3, 3], "aborted")
    assert continuation(s, 10) == ([1, 2, 5, 6], 8, resume_seed(7, 1))
    assert s.resumes == 1 and s.prompt == [1, 2]  # the prompt itself is untouched
    absorb(s, Completion([8], [-0.3], "stop"), version=4, max_new_tokens=10)
    assert (s.token_ids, s.logprobs, s.versions, s.finish_reason) == ([5, 6, 8], [-0.1, -0.2, -0.3], [3, 3, 4], "stop")
    full = Sample(prompt=[1], seed=0)
    absorb(full, Completion([1, 2, 3], [-1.0] * 3, "aborted"), version=0, max_new_tokens=3)
    assert full.finish_reason == "length"  # cut exactly at its budget: nothing left to resume
    assert version_range([[3, 3, 4], [5], []], default=9) == (3, 5)
    assert version_range([[], []], default=9) == (9, 9)


def test_generate_resumable_continues_cut_samples_under_the_new_version():
    engine = FakeEngine()
    versions = iter([5])
    prompts, spec = [[1, 2], [3]], SamplingSpec(n=2, max_new_tokens=8)
    out = generate_resumable(engine.generate, prompts, spec, [40, 60], PartialRollout(2, lambda: next(versions)))

    assert len(engine.calls) == 2  # the first round, then one continuation call: every cut sample has 5 tokens left
    cont_prompts, cont_spec, cont_seeds = engine.calls[1]
    assert cont_prompts == [[1, 2, 10, 11, 12], [3, 110, 111, 112]]  # prompt + the tokens so far
    assert (cont_spec.n, cont_spec.max_new_tokens) == (1, 5)
    assert cont_seeds == [resume_seed(41, 1), resume_seed(61, 1)]  # from sample j=1's own seed (seeds[i] + 1)
    finished = out[0][0]
    assert (finished.token_ids, finished.versions, finished.finish_reason) == ([0, 1, 2], [2, 2, 2], "stop")
    resumed = out[1][1]
    assert resumed.token_ids == [110, 111, 112, 900, 901, 902, 903, 904]
    assert resumed.logprobs == [-0.5] * 3 + [-1.0] * 5
    assert resumed.versions == [2, 2, 2, 5, 5, 5, 5, 5]  # the prefix keeps the version that sampled it
    assert resumed.finish_reason == "length" and len(resumed.token_ids) == spec.max_new_tokens


def test_a_sample_cut_twice_resumes_twice_with_budgets_grouped():
    engine = FakeEngine(cut_again={5})  # prompt 0's continuation (2 + 3 tokens) is cut once more after one token
    versions = iter([1, 2])
    out = generate_resumable(engine.generate, [[1, 2], [3]], SamplingSpec(n=2, max_new_tokens=8), [40, 60],
                             PartialRollout(0, lambda: next(versions)))
    assert len(engine.calls) == 3
    assert engine.calls[2][0] == [[1, 2, 10, 11, 12, 800]] and engine.calls[2][1].max_new_tokens == 4
    assert engine.calls[2][2] == [resume_seed(41, 2)]
    twice = out[0][1]
    assert twice.token_ids == [10, 11, 12, 800, 900, 901, 902, 903] and twice.resumes == 2
    assert twice.versions == [0, 0, 0, 1, 2, 2, 2, 2]
    assert out[1][1].versions == [0, 0, 0, 1, 1, 1, 1, 1]


# ---------------------------------------------------------------- a real vLLM engine


@pytest.fixture(scope="module")
def engine(tiny_models):
    """One in-process engine on the random model (EOS is rare: long completions), returning sampled logprobs."""
    import gc

    from posttrain.rollout.engines import make_engine

    e = make_engine("vllm", str(tiny_models.untied_a), max_model_len=128, kv_cache_gb=1, logprobs="sampled")
    yield e
    del e
    gc.collect()
    from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

    destroy_model_parallel()
    destroy_distributed_environment()


@pytest.fixture(scope="module")
def uninterrupted(engine):
    return engine.generate(PROMPTS, LONG, SEEDS)


def _assert_prefixes(cut, full):
    """Every completion of `cut` is the start of `full`'s, token and logprob exactly; returns how many were cut."""
    n_cut = 0
    for group_cut, group_full in zip(cut, full):
        for c, f in zip(group_cut, group_full):
            k = len(c.token_ids)
            assert c.token_ids == f.token_ids[:k] and c.logprobs == f.logprobs[:k]
            if c.finish_reason == "aborted":
                n_cut += 1
                assert k < len(f.token_ids)
            else:
                assert (c.token_ids, c.finish_reason) == (f.token_ids, f.finish_reason)
    return n_cut


@pytest.mark.integration
def test_the_stepping_path_returns_what_the_plain_one_does(engine, uninterrupted):
    assert max(len(c.token_ids) for g in uninterrupted for c in g) == LONG.max_new_tokens
    assert engine.generate(PROMPTS, replace(LONG, interruptible=True), SEEDS) == uninterrupted
    engine.interrupt()  # an interrupt a plain call never sees, and the next interruptible one clears
    assert engine.generate(PROMPTS, LONG, SEEDS) == uninterrupted
    assert engine.generate(PROMPTS, replace(LONG, interruptible=True), SEEDS) == uninterrupted


@pytest.mark.integration
def test_an_interrupt_after_k_steps_returns_the_exact_prefixes(engine, uninterrupted):
    engine.step_hook = lambda steps: engine.interrupt() if steps == 6 else None
    try:
        cut = engine.generate(PROMPTS, replace(LONG, interruptible=True), SEEDS)
    finally:
        engine.step_hook = None
    assert _assert_prefixes(cut, uninterrupted) == sum(len(g) for g in cut)  # nothing finishes in 6 steps here
    assert {len(c.token_ids) for g in cut for c in g} == {6}  # the first step prefills and samples one token
    assert {c.finish_reason for g in cut for c in g} == {"aborted"}


@pytest.mark.integration
def test_an_interrupt_from_another_thread_mid_generation(engine, uninterrupted):
    engine.step_hook = lambda steps: time.sleep(0.02)  # ~1 s for the whole call: the interrupt lands inside it
    timer = threading.Timer(0.3, engine.interrupt)
    try:
        timer.start()
        cut = engine.generate(PROMPTS, replace(LONG, interruptible=True), SEEDS)
    finally:
        timer.cancel()
        engine.step_hook = None
    assert _assert_prefixes(cut, uninterrupted) >= 1


@pytest.mark.integration
def test_a_resumed_completion_keeps_its_prefix_and_budget(engine, uninterrupted):
    fired = []

    def cut_once(steps):
        if steps == 10 and not fired:
            fired.append(steps)
            engine.interrupt()

    engine.step_hook = cut_once
    try:
        out = generate_resumable(engine.generate, PROMPTS, LONG, SEEDS, PartialRollout(0, lambda: 1))
    finally:
        engine.step_hook = None
    samples = [s for group in out for s in group]
    for s, f in zip(samples, [f for group in uninterrupted for f in group]):
        assert s.resumes == 1 and len(s.token_ids) <= LONG.max_new_tokens
        assert s.token_ids[:10] == f.token_ids[:10] and s.logprobs[:10] == f.logprobs[:10]  # the prefix, unchanged
        assert s.versions == [0] * 10 + [1] * (len(s.token_ids) - 10)
        assert s.finish_reason in ("stop", "length")
    # the tails are what the continuation requests alone draw: prompt + prefix, 38 tokens left, the resume seed
    alone = engine.generate([s.prompt + s.token_ids[:10] for s in samples], replace(LONG, n=1, max_new_tokens=38),
                            [resume_seed(s.seed, 1) for s in samples])
    assert [c.token_ids for (c,) in alone] == [s.token_ids[10:] for s in samples]
    assert [c.logprobs for (c,) in alone] == [s.logprobs[10:] for s in samples]
    assert [s.prompt for s in samples] == [p for p in PROMPTS for _ in range(LONG.n)]
