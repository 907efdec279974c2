"""Sampling for the Tinker-compatible service: a decode loop with a KV cache over one prompt, one sample at a time.

Sample j of a request with seed s draws from `torch.Generator(s + j)` (the hf engine's rule), so a completion
depends on its seed alone. A token's logprob is under the distribution it was drawn from before top-k/top-p
truncation: log_softmax(logits / temperature) (= the model's own logprob at temperature 1, the case the trainer's
`forward_backward` logprobs compare to). Temperature 0 is greedy and reports the model's logprob.
"""

from __future__ import annotations

from dataclasses import dataclass

from posttrain.rollout.hf_engine import top_p_filter
from posttrain.service.wire import SequenceOut


@dataclass
class SampleSpec:
    max_tokens: int
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    seed: int | None = None
    stop_tokens: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()


def _pick(logits, spec: SampleSpec, generator):
    """(token, its logprob) from next-token logits [V]."""
    import torch

    if spec.temperature <= 0:
        logp = torch.log_softmax(logits, -1)
        tok = int(torch.argmax(logits))
        return tok, float(logp[tok])
    scaled = logits / spec.temperature
    logp = torch.log_softmax(scaled, -1)
    filtered = scaled
    if spec.top_k > 0:
        kth = torch.topk(scaled, min(spec.top_k, scaled.shape[-1])).values[-1]
        filtered = filtered.masked_fill(filtered < kth, float("-inf"))
    filtered = top_p_filter(filtered[None], spec.top_p)[0]
    probs = torch.softmax(filtered.double(), -1)
    tok = int(torch.multinomial(probs, 1, generator=generator))
    return tok, float(logp[tok])


def sample_one(model, prompt: list[int], spec: SampleSpec, generator, decode) -> SequenceOut:
    """One completion of `prompt` (token ids). The stop token, when one ends it, is the last token returned."""
    import torch

    tokens: list[int] = []
    logprobs: list[float] = []
    with torch.no_grad():
        out = model(input_ids=torch.tensor([prompt]), use_cache=True)
        for _ in range(spec.max_tokens):
            tok, lp = _pick(out.logits[0, -1], spec, generator)
            tokens.append(tok)
            logprobs.append(lp)
            if tok in spec.stop_tokens or (spec.stop_strings and any(s in decode(tokens) for s in spec.stop_strings)):
                return SequenceOut(tokens, logprobs, "stop")
            out = model(input_ids=torch.tensor([[tok]]), past_key_values=out.past_key_values, use_cache=True)
    return SequenceOut(tokens, logprobs, "length")


def prompt_logprobs(model, prompt: list[int]) -> list[float]:
    """logprob of prompt[i] given prompt[:i] for each i; NaN at 0 (nothing precedes it)."""
    import torch

    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt])).logits[0]
    lp = torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(prompt[1:])[:, None])[:, 0]
    return [float("nan")] + lp.tolist()


def sample(model, prompt: list[int], spec: SampleSpec, num_samples: int, decode) -> list[SequenceOut]:
    import random

    import torch

    base = spec.seed if spec.seed is not None else random.randrange(2**31)
    return [sample_one(model, prompt, spec, torch.Generator().manual_seed(base + j), decode)
            for j in range(num_samples)]
