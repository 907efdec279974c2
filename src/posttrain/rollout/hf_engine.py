"""`HfEngine`: the transformers fallback rollout engine, for machines or models vLLM does not serve.

A plain decode loop with a KV cache over one left-padded batch (every prompt repeated `n` times). Sample j of
prompt i draws from its own `torch.Generator(seeds[i] + j)` (vLLM's rule for n > 1), so a completion depends on
its seed alone, not on what else is in the batch (up to float rounding). Slow next to vLLM, but small enough to read and to trust.
"""

from __future__ import annotations

from posttrain.errors import PosttrainError
from posttrain.rollout.engine import (Completion, LogprobsKind, SamplingSpec, check_generate_args, check_logprobs_kind,
                                      check_request_length)


def top_p_filter(logits, top_p: float):
    """Sets logits outside the smallest set of tokens with total probability >= top_p to -inf.
    logits: [rows, vocab] float; returns a new tensor of the same shape."""
    import torch

    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs  # probability of the tokens ranked above each one
    sorted_logits = sorted_logits.masked_fill(mass_before >= top_p, float("-inf"))  # the top token always stays
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)


def sampling_logits(logits, spec: SamplingSpec):
    """The logits `generate` samples from: logits / temperature with the tokens outside the top_p nucleus at -inf
    (their softmax is the renormalised nucleus); None at temperature 0 (greedy)."""
    if spec.temperature == 0:
        return None
    return top_p_filter(logits / spec.temperature, spec.top_p)


class HfEngine:
    """A `RolloutEngine` on a transformers causal LM on CPU. `max_model_len` is in tokens. `logprobs`: what `generate`
    returns per sampled token, "raw" or "sampled" (engine.py's docstring; "sampled" agrees with vLLM's
    processed_logprobs, raw at temperature 0 included)."""

    def __init__(self, model_dir: str, *, dtype: str = "float32", max_model_len: int = 128,
                 logprobs: LogprobsKind = "raw"):
        from posttrain.models.loading import load_causal_lm

        check_logprobs_kind(logprobs)
        self.logprobs = logprobs
        self.model, tokenizer = load_causal_lm(model_dir, dtype=dtype, field="rollout.model_dir")
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_id
        self.max_model_len = max_model_len

    def generate(self, prompts: list[list[int]], spec: SamplingSpec, seeds: list[int]) -> list[list[Completion]]:
        import torch

        from posttrain.algorithms.common import at_least_float32

        check_generate_args(prompts, spec, seeds)
        longest = max(len(p) for p in prompts)
        check_request_length(longest + spec.max_new_tokens, self.max_model_len)
        n, rows = spec.n, len(prompts) * spec.n
        input_ids = torch.full((rows, longest), self.pad_id, dtype=torch.long)
        mask = torch.zeros((rows, longest), dtype=torch.long)
        for i, prompt in enumerate(prompts):
            input_ids[i * n : (i + 1) * n, longest - len(prompt) :] = torch.tensor(prompt)
            mask[i * n : (i + 1) * n, longest - len(prompt) :] = 1
        generators = [torch.Generator().manual_seed(int(seed) + j) for seed in seeds for j in range(n)]

        tokens = torch.full((rows, spec.max_new_tokens), self.pad_id, dtype=torch.long)
        logprobs = torch.zeros((rows, spec.max_new_tokens), dtype=torch.float64)  # float64 holds float32 exactly
        lengths = torch.full((rows,), spec.max_new_tokens, dtype=torch.long)
        finished = torch.zeros(rows, dtype=torch.bool)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # left padding: real tokens start at position 0
        step_ids, past = input_ids, None
        with torch.no_grad():
            for t in range(spec.max_new_tokens):
                out = self.model(
                    input_ids=step_ids, attention_mask=mask, position_ids=positions, past_key_values=past,
                    use_cache=True,
                )
                past = out.past_key_values
                logits = at_least_float32(out.logits[:, -1, :])  # [rows, vocab]
                sampling = sampling_logits(logits, spec)
                chosen = self._choose(logits, sampling, generators)
                logprob = self._logprobs_of(logits, sampling, chosen)
                chosen = torch.where(finished, torch.full_like(chosen, self.pad_id), chosen)
                tokens[:, t], logprobs[:, t] = chosen, logprob
                newly_done = (chosen == self.eos_id) & ~finished
                lengths[newly_done] = t + 1
                finished |= newly_done
                if bool(finished.all()):
                    break
                step_ids = chosen[:, None]
                mask = torch.cat([mask, torch.ones((rows, 1), dtype=torch.long)], dim=-1)
                positions = positions[:, -1:] + 1

        results = []
        for i in range(len(prompts)):
            group = []
            for r in range(i * n, (i + 1) * n):
                k = int(lengths[r])
                group.append(
                    Completion(
                        token_ids=tokens[r, :k].tolist(),
                        logprobs=logprobs[r, :k].tolist(),
                        finish_reason="stop" if bool(finished[r]) else "length",
                    )
                )
            results.append(group)
        return results

    @staticmethod
    def _choose(logits, sampling, generators):
        """Next token per row: argmax when greedy (`sampling` is None), else a sample from the row's own generator."""
        import torch

        if sampling is None:
            return logits.argmax(-1)
        probs = torch.softmax(sampling, dim=-1)
        return torch.cat([torch.multinomial(probs[r : r + 1], 1, generator=g)[:, 0] for r, g in enumerate(generators)])

    def _logprobs_of(self, logits, sampling, chosen):
        """Each row's logprob of its chosen token: raw (log_softmax of `logits`), or in "sampled" mode that of the
        sampling distribution; greedy steps give the raw one in both modes, as vLLM's processed_logprobs does."""
        import torch

        source = sampling if self.logprobs == "sampled" and sampling is not None else logits
        return torch.log_softmax(source, dim=-1).gather(-1, chosen[:, None])[:, 0]

    def update_weights(self, payload) -> None:
        import torch

        from posttrain.models.weights import payload_is_partial, payload_tensors

        tensors = payload_tensors(payload)
        with torch.no_grad():
            missing, unexpected = self.model.load_state_dict(tensors, strict=False)
        # A name may be absent only when its tensor is tied to one that was sent (models/weights.py writes ties
        # once), or when the payload is partial (LoRA sends the adapted layers only).
        params = self.model.state_dict(keep_vars=True)
        sent = {id(params[name]) for name in tensors if name in params}
        partial = payload_is_partial(payload)
        untied_missing = [name for name in missing if id(params[name]) not in sent and not partial]
        if unexpected or untied_missing:
            raise PosttrainError(
                f"weight sync: the weights do not match the HF model (unexpected: {unexpected[:5]}, "
                f"missing: {untied_missing[:5]})",
                hint="export weights with posttrain.models.weights.export_weights from the same architecture",
            )

    def completion_logprobs(self, prompt: list[int], completion: list[int]) -> list[float]:
        import torch

        from posttrain.algorithms.common import at_least_float32

        if not prompt or not completion:
            raise PosttrainError("completion_logprobs: prompt and completion both need at least one token id")
        ids = torch.tensor([list(prompt) + list(completion)])
        with torch.no_grad():
            logits = at_least_float32(self.model(input_ids=ids).logits[0, len(prompt) - 1 : -1])  # [completion, vocab]
        raw = torch.log_softmax(logits, dim=-1)
        return raw.gather(-1, torch.tensor(completion)[:, None])[:, 0].tolist()
