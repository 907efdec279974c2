"""The rollout engine interface: the one small surface the loop, the rollout worker and the tests use, whatever
engine (vLLM or transformers) is behind it.

Conventions every engine keeps:
- Prompts and completions are token ids (list[int]); no text crosses this interface.
- `generate` takes one seed per prompt and draws that prompt's sample j with seed + j (vLLM's rule for the
  children of an n > 1 request); callers space prompts' seeds apart (`sampler.sample_seed`). The same (weights,
  prompts, spec, seeds) give the same completions.
- `temperature == 0` means greedy decoding (the seed is then irrelevant).
- A completion's `token_ids` include the EOS token when `finish_reason == "stop"`.
- `completion_logprobs` returns raw-model logprobs, log_softmax of the unscaled logits (the temperature-1
  distribution, before temperature and top_p), whatever the engine's `logprobs` option.
- `generate`'s logprobs follow the engine's `logprobs` option (LogprobsKind), one per sampled token:
  - "raw" (the default): the raw-model logprobs above, the same numbers `completion_logprobs` gives for those tokens.
    They are the behaviour policy's logprobs only when sampling at temperature 1 without top_p.
  - "sampled": the logprobs of the distribution the token was actually drawn from: log_softmax of
    logits / temperature with every token outside the top_p nucleus removed (the nucleus renormalised to 1).
    That is vLLM's `logprobs_mode="processed_logprobs"`. At temperature 0 (greedy) nothing is sampled and both
    engines return the raw logprob, as vLLM does (its greedy path takes log_softmax of the unscaled logits), not
    the 0 of the point mass.
  The trainer recomputes the current policy's logprobs itself (DESIGN.md); "sampled" ones are the behaviour
  policy's, for a loss that corrects for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, get_args

from posttrain.errors import PosttrainError


LogprobsKind = Literal["raw", "sampled"]  # what `generate`'s logprobs are: see the module docstring


def check_logprobs_kind(logprobs: str) -> None:
    """Every engine refuses an unknown `logprobs` option with the same message."""
    if logprobs not in get_args(LogprobsKind):
        raise PosttrainError(f"rollout engine: logprobs={logprobs!r} is not one of {', '.join(get_args(LogprobsKind))}")


@dataclass
class SamplingSpec:
    """How to sample: `n` completions per prompt, each at most `max_new_tokens` tokens. `interruptible`: the
    engine's `interrupt()` may cut this call short (partial rollouts, rollout/partial.py): the completions not yet
    finished then come back with finish_reason "aborted" and the tokens sampled so far. Engines without
    `interrupt()` (HfEngine) ignore it."""

    n: int = 1
    max_new_tokens: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    interruptible: bool = False


@dataclass
class Completion:
    """One sampled completion: its tokens, the engine's logprob of each (same length; raw or sampled, as the
    engine's `logprobs` option says), and why it ended."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (EOS, included in token_ids) | "length" (hit max_new_tokens) | "aborted" (interrupted)


class RolloutEngine(Protocol):
    def generate(self, prompts: list[list[int]], spec: SamplingSpec, seeds: list[int]) -> list[list[Completion]]:
        """Returns, for each prompt i, `spec.n` completions; completion j is sampled with seed `seeds[i] + j`."""
        ...

    def update_weights(self, payload) -> None:
        """Replaces all weights in place from safetensors bytes or an array payload keyed by HF parameter names
        (see models/weights.py)."""
        ...

    def completion_logprobs(self, prompt: list[int], completion: list[int]) -> list[float]:
        """log p(completion[t] | prompt + completion[:t]) under the current weights; len == len(completion)."""
        ...


def check_request_length(tokens: int, max_model_len: int) -> None:
    """Every engine refuses a request longer than its max_model_len (tokens) with the same message."""
    if tokens > max_model_len:
        raise PosttrainError(
            f"rollout: a request needs {tokens} tokens but max_model_len is {max_model_len}",
            hint="raise rollout.vllm.max_model_len or shorten prompts / max_new_tokens",
        )


def check_generate_args(prompts: list[list[int]], spec: SamplingSpec, seeds: list[int]) -> None:
    """Validates `generate` arguments the same way for every engine."""
    if len(seeds) != len(prompts):
        raise PosttrainError(f"generate: got {len(prompts)} prompts but {len(seeds)} seeds; pass one seed per prompt")
    if any(len(p) == 0 for p in prompts):
        raise PosttrainError("generate: a prompt has no tokens; every prompt needs at least one token id")
    if spec.n < 1 or spec.max_new_tokens < 1:
        raise PosttrainError(f"sampling: n={spec.n} and max_new_tokens={spec.max_new_tokens} must both be >= 1")
    if spec.temperature < 0 or not 0 < spec.top_p <= 1:
        raise PosttrainError(
            f"sampling: temperature={spec.temperature} must be >= 0 and top_p={spec.top_p} must be in (0, 1]"
        )
