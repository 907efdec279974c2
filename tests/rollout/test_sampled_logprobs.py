"""Sampling-aware behaviour logprobs: an engine built with `logprobs="sampled"` returns, for each sampled token, its
logprob under the distribution it was drawn from (logits / temperature, top_p nucleus, renormalised), while
`completion_logprobs` stays raw. Both engines are checked against one float64 reference: transformers' plain
forward of the same prefix (the peaked model `untied_b`, loaded in float64), transformed by hand below.

The HF engine runs in float64 (bound F64_TOL); vLLM runs in float32 and has a bound derived from float32's
epsilon, next to its assert. One vLLM engine (module-scoped, marked integration) serves all vLLM checks.
"""

from __future__ import annotations

import math

import pytest
import torch

from posttrain.errors import PosttrainError
from posttrain.models.tokenizer import VOCAB
from posttrain.rollout.engine import Completion, SamplingSpec
from posttrain.rollout.engines import make_engine
from posttrain.rollout.hf_engine import HfEngine
from numerics_bounds import EPS32, F64_TOL

PROMPTS = [[5, 6, 7, 8, 9], [20, 21], [30, 31, 32, 33, 34, 35, 36, 37], [12]]
SEEDS = [3, 11, 19, 27]
SPEC = SamplingSpec(n=2, max_new_tokens=8, temperature=0.7, top_p=0.8)
GREEDY = SamplingSpec(n=1, max_new_tokens=8, temperature=0.0)
# How far vLLM's float32 logits may be from the float64 ones. One logit of the tiny model is the end of a chain of
# about 60 float32 reductions (4 layers x ~14: q/k/v/o projections, scores, softmax, weighted sum, two RMSNorms, gate,
# up, down, two residual adds; then the final norm and the head) of at most 512 terms: N = 60 x 512 rounding errors.
# With rounding errors independent and of mean zero (Higham & Mary 2019, probabilistic error analysis), their sum is
# within lambda sqrt(N) u of the result's magnitude with probability >= 1 - 2 exp(-lambda^2 / 2); lambda = 5 gives
# 1 - 7.5e-6. LOGIT_REL = 5 x sqrt(30720) x 2^-24 = 5.2e-5, relative to the row's largest |logit|. docs/numerics.md
# (the LOGPROB_TOL row) adds the chain's ~50 reductions' bounds instead, each lambda sqrt(512) u: 3.4e-4, the same
# model with a union bound, 7x looser; that is too loose to show here that the raw logprob misses by far more.
LOGIT_REL = 5 * math.sqrt(60 * 512) * EPS32


def float32_bound(logits: torch.Tensor, temperature: float) -> float:
    """How far a float32 engine's logprob of one token may be from the float64 one, for the row `logits` (float64,
    unscaled) and a temperature (1 for raw logprobs). Each logit is off by at most d = LOGIT_REL * M with
    M = max(1, max |logit|); a logprob z_i / T - logsumexp_{j in S}(z_j / T) moves by at most d / T through z_i and
    d / T through the logsumexp (1-Lipschitz in the max norm): 2 d / T. The float32 transform itself (divide by T,
    subtract the max, exp, a sum of <= |V| terms, log) adds at most (|V| + 4) u (1 + M / T), worst case. For
    untied_b at T = 0.7, M = 3.4 .. 7.5: bounds of 5e-4 .. 1.2e-3 nats."""
    m = max(1.0, float(logits.abs().max()))
    return 2 * LOGIT_REL * m / temperature + (len(VOCAB) + 4) * EPS32 * (1 + m / temperature)


def nucleus_logprob(logits: torch.Tensor, token: int, temperature: float, top_p: float) -> float:
    """float64 reference: log p(token) under softmax(logits / temperature) restricted to the smallest set of tokens
    of probability >= top_p (a token stays when the mass ranked above it is < top_p) and renormalised."""
    z = logits.double() / temperature
    sorted_z, order = torch.sort(z, descending=True)
    probs = torch.softmax(sorted_z, dim=-1)
    kept = order[(torch.cumsum(probs, dim=-1) - probs) < top_p]
    if token not in kept.tolist():
        return -math.inf
    return float(z[token] - torch.logsumexp(z[kept], dim=-1))


def reference_logits(model64, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """[len(completion), vocab] float64 logits of each completion token's prefix, from one plain forward."""
    ids = torch.tensor([list(prompt) + list(completion)])
    with torch.no_grad():
        return model64(input_ids=ids).logits[0, len(prompt) - 1 : -1].double()


def steps(groups, model64):
    """(logits row, token, engine logprob) for every sampled token of every completion."""
    for prompt, group in zip(PROMPTS, groups):
        for c in group:
            rows = reference_logits(model64, prompt, c.token_ids)
            yield from zip(rows, c.token_ids, c.logprobs)


def raw_logprob(row: torch.Tensor, token: int) -> float:
    return float(torch.log_softmax(row, dim=-1)[token])


def gap_to_reference(row, token: int, got: float, slack: float) -> tuple[float, bool]:
    """|got - reference| and whether the step is ambiguous: a nucleus boundary within `slack` (in probability) of
    top_p, where a rounding of that size may legitimately keep or drop one token; the nearer reference then counts."""
    tops = (SPEC.top_p - slack, SPEC.top_p, SPEC.top_p + slack)
    refs = {nucleus_logprob(row, token, SPEC.temperature, p) for p in tops}
    return min(abs(got - r) for r in refs), len(refs) > 1


@pytest.fixture(scope="module")
def model64(tiny_models):
    from posttrain.models.loading import load_causal_lm

    return load_causal_lm(tiny_models.untied_b, dtype="float64")[0].eval()


@pytest.fixture(scope="module")
def hf_sampled(tiny_models) -> HfEngine:
    return make_engine("hf", str(tiny_models.untied_b), dtype="float64", logprobs="sampled")


# ---------------------------------------------------------------- the HF engine (float64)


def test_an_unknown_logprobs_option_is_refused_by_both_kinds(tiny_models):
    for kind in ("hf", "vllm"):  # vLLM refuses before it starts
        with pytest.raises(PosttrainError, match="logprobs='processed' is not one of raw, sampled"):
            make_engine(kind, str(tiny_models.untied_b), logprobs="processed")


def test_hf_sampled_logprobs_are_those_of_the_truncated_renormalised_distribution(hf_sampled, model64):
    """The cached, left-padded decode loop in float64 against the float64 plain forward: the same function up to
    float64 rounding (F64_TOL, numerics_bounds.py). A nucleus boundary flips only if a cumulative mass is within
    ~1e-16 of top_p, so no slack is needed. The raw logprob of the same token is far from it, so the check bites."""
    groups = hf_sampled.generate(PROMPTS, SPEC, SEEDS)
    worst, raw_gaps = 0.0, []
    for row, token, got in steps(groups, model64):
        ref = nucleus_logprob(row, token, SPEC.temperature, SPEC.top_p)
        worst = max(worst, abs(got - ref))
        raw_gaps.append(abs(raw_logprob(row, token) - ref))
    print(f"\nhf: {len(raw_gaps)} steps, worst gap {worst:.3g}; raw off by {min(raw_gaps):.3g} .. {max(raw_gaps):.3g}")
    assert worst <= F64_TOL, f"sampled logprobs off the float64 reference by {worst:.3g} > {F64_TOL:g}"
    assert min(raw_gaps) > 1e6 * F64_TOL, f"raw logprobs come as close as {min(raw_gaps):.3g}: the check cannot bite"


def test_hf_sampled_mode_draws_the_same_tokens_and_is_raw_when_greedy(hf_sampled, tiny_models):
    """The option changes what is reported, not what is drawn; at temperature 0 both modes report the raw logprob
    (as vLLM's processed_logprobs does for greedy requests), which equals completion_logprobs."""
    raw_engine = HfEngine(str(tiny_models.untied_b), dtype="float64")
    sampled, raw = hf_sampled.generate(PROMPTS, SPEC, SEEDS), raw_engine.generate(PROMPTS, SPEC, SEEDS)
    assert [[c.token_ids for c in g] for g in sampled] == [[c.token_ids for c in g] for g in raw]
    greedy = hf_sampled.generate(PROMPTS, GREEDY, SEEDS)
    assert greedy == raw_engine.generate(PROMPTS, GREEDY, SEEDS)
    for prompt, (c,) in zip(PROMPTS, greedy):
        scored = hf_sampled.completion_logprobs(prompt, c.token_ids)
        assert max(abs(a - b) for a, b in zip(c.logprobs, scored)) <= F64_TOL


# ---------------------------------------------------------------- vLLM (float32) against the float64 reference


@pytest.fixture(scope="module")
def vllm_sampled(tiny_models):
    return make_engine("vllm", str(tiny_models.untied_b), max_model_len=128, kv_cache_gb=1, logprobs="sampled")


@pytest.mark.integration
def test_vllm_sampled_logprobs_are_those_of_the_truncated_renormalised_distribution(vllm_sampled, model64):
    """vLLM's processed_logprobs against the float64 reference, within float32_bound (derived in its docstring).
    Steps whose nucleus boundary lies within the bound of top_p may keep or drop one token either way; the nearer
    reference counts there. The raw logprob misses the reference by orders of magnitude more than the bound."""
    groups = vllm_sampled.generate(PROMPTS, SPEC, SEEDS)
    worst_ratio, raw_ratios, ambiguous, n = 0.0, [], 0, 0
    for row, token, got in steps(groups, model64):
        bound = float32_bound(row, SPEC.temperature)
        gap, unsure = gap_to_reference(row, token, got, slack=bound)
        worst_ratio, ambiguous, n = max(worst_ratio, gap / bound), ambiguous + unsure, n + 1
        ref = nucleus_logprob(row, token, SPEC.temperature, SPEC.top_p)
        raw_ratios.append(abs(raw_logprob(row, token) - ref) / bound)
    print(f"\n{n} steps ({ambiguous} ambiguous): worst gap {worst_ratio:.3g} x bound; raw off by "
          f"{min(raw_ratios):.3g} .. {max(raw_ratios):.3g} x bound (median {sorted(raw_ratios)[n // 2]:.3g})")
    assert worst_ratio <= 1.0, f"sampled logprobs off the float64 reference by {worst_ratio:.3g} x the bound"
    assert ambiguous <= n // 10, f"{ambiguous} of {n} steps have a nucleus boundary within the bound"
    assert sorted(raw_ratios)[n // 2] > 100, "raw logprobs are not far from the reference: the check cannot bite"


@pytest.mark.integration
def test_vllm_greedy_logprobs_are_raw_in_sampled_mode(vllm_sampled, model64):
    """processed_logprobs on an all-greedy batch is log_softmax of the unscaled logits (vllm/v1/sample/sampler.py,
    Sampler.sample), not the 0 of the point mass: raw logprobs, as the HF engine reports at temperature 0."""
    groups = vllm_sampled.generate(PROMPTS, GREEDY, SEEDS)
    worst_ratio = max(abs(got - raw_logprob(row, token)) / float32_bound(row, 1.0)
                      for row, token, got in steps(groups, model64))
    print(f"\ngreedy: worst gap {worst_ratio:.3g} x bound")
    assert worst_ratio <= 1.0, f"greedy logprobs off the raw float64 reference by {worst_ratio:.3g} x the bound"


@pytest.mark.integration
def test_vllm_completion_logprobs_stay_raw_in_sampled_mode(vllm_sampled, model64):
    """completion_logprobs (vLLM's prompt logprobs, log_softmax of the raw logits in every logprobs_mode:
    v1/worker/gpu_model_runner.py) of tokens sampled at temperature 0.7, top_p 0.8 equal the raw float64 reference
    within float32_bound at temperature 1, and are far from what generate reported for the same tokens."""
    groups = vllm_sampled.generate(PROMPTS, SPEC, SEEDS)
    scored = [[Completion(c.token_ids, vllm_sampled.completion_logprobs(prompt, c.token_ids), c.finish_reason)
               for c in group] for prompt, group in zip(PROMPTS, groups)]
    worst_ratio, apart = 0.0, []
    for (row, token, got), (_, _, reported) in zip(steps(scored, model64), steps(groups, model64)):
        bound = float32_bound(row, 1.0)
        worst_ratio = max(worst_ratio, abs(got - raw_logprob(row, token)) / bound)
        apart.append(abs(got - reported) / bound)
    print(f"\ncompletion_logprobs: worst gap {worst_ratio:.3g} x bound; generate's sampled logprobs differ by "
          f"{min(apart):.3g} .. {max(apart):.3g} x bound (median {sorted(apart)[len(apart) // 2]:.3g})")
    assert worst_ratio <= 1.0, f"completion_logprobs off the raw float64 reference by {worst_ratio:.3g} x the bound"
    assert sorted(apart)[len(apart) // 2] > 100, "completion_logprobs are close to the sampled logprobs"
