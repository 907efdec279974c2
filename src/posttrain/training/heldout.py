"""Held-out greedy accuracy: batched greedy decoding with the HF model, in-process, scored by the task's verifier;
and the same loop sampling at temperature 1 with a seeded generator (a policy's expected score on fixed problems).

A hand-written KV-cached loop rather than `model.generate`: the prompts are left-padded, positions are counted from
each prompt's first real token (so padding changes nothing but float rounding), and the loop stops as soon as every
row has emitted EOS. tests/test_sft.py checks it against `model.generate` on unpadded single prompts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch

if TYPE_CHECKING:
    from posttrain.models.loading import PromptEncoder
    from posttrain.tasks.base import Problem, Task


def greedy_completions(
    model, prompts: Sequence[list[int]], *, pad_id: int, eos_id: int, max_new_tokens: int = 8
) -> list[list[int]]:
    """Greedy continuations (token ids, EOS included when emitted, at most `max_new_tokens` tokens) of one batch
    of prompts given as token ids of any lengths."""
    return _completions(model, prompts, lambda logits: logits.argmax(-1), pad_id, eos_id, max_new_tokens)


def sampled_completions(
    model, prompts: Sequence[list[int]], generator: torch.Generator, *, pad_id: int, eos_id: int,
    max_new_tokens: int = 8
) -> list[list[int]]:
    """Continuations sampled at temperature 1 from the whole distribution (the rollout's default sampling), drawn
    with `generator` (seeded: the same draws for the same model), otherwise as `greedy_completions`."""

    def draw(logits: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(logits.double(), dim=-1)
        return torch.multinomial(probs, 1, generator=generator)[:, 0]

    return _completions(model, prompts, draw, pad_id, eos_id, max_new_tokens)


@torch.no_grad()
def _completions(model, prompts: Sequence[list[int]], pick, pad_id: int, eos_id: int,
                 max_new_tokens: int) -> list[list[int]]:
    """The KV-cached decoding loop; `pick` maps the last position's logits [rows, vocabulary] to one token per row."""
    device = next(model.parameters()).device
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p):] = 1
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)

    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
    past = out.past_key_values
    next_pos = positions[:, -1:] + 1
    done = torch.zeros(len(prompts), dtype=torch.bool, device=device)
    steps: list[torch.Tensor] = []
    for step in range(max_new_tokens):
        token = pick(out.logits[:, -1, :])
        token = torch.where(done, torch.full_like(token, pad_id), token)  # finished rows keep emitting pad
        steps.append(token)
        done |= token == eos_id
        if bool(done.all()) or step == max_new_tokens - 1:
            break
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
        out = model(
            input_ids=token[:, None], attention_mask=mask, position_ids=next_pos, past_key_values=past, use_cache=True
        )
        past = out.past_key_values
        next_pos = next_pos + 1
    generated = torch.stack(steps, dim=-1).tolist()
    # Cut after the first EOS: what follows it is the pad that finished rows were fed.
    return [row[: row.index(eos_id) + 1] if eos_id in row else row for row in generated]


def greedy_accuracy(
    model,
    encoder: "PromptEncoder",
    task: "Task",
    problems: Sequence["Problem"],
    max_new_tokens: int = 8,
    batch_size: int = 250,
) -> tuple[float, list[str]]:
    """Mean task score of the greedy completion of each problem (exact match for the built-in tasks), in [0, 1],
    and the decoded completions (text before the first EOS/pad), in the order of `problems`."""
    if not problems:
        return 0.0, []
    texts = completion_texts(model, encoder, problems, greedy_completions, max_new_tokens, batch_size)
    scores = [task.score(p, t) for p, t in zip(problems, texts)]
    return sum(scores) / len(scores), texts


def completion_texts(model, encoder: "PromptEncoder", problems: Sequence["Problem"], complete,
                     max_new_tokens: int = 8, batch_size: int = 250) -> list[str]:
    """The decoded completions of `problems`' prompts in batches of `batch_size`, in their order, the model in eval
    mode meanwhile; `complete` is greedy_completions or a sampled_completions with its generator bound."""
    tok = encoder.tokenizer
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    was_training = model.training
    model.eval()
    texts: list[str] = []
    try:
        for start in range(0, len(problems), batch_size):
            prompts = [encoder.encode(p.prompt) for p in problems[start:start + batch_size]]
            completions = complete(model, prompts, pad_id=pad_id, eos_id=tok.eos_token_id,
                                   max_new_tokens=max_new_tokens)
            texts.extend(encoder.decode_completion(c) for c in completions)
    finally:
        model.train(was_training)
    return texts
