"""Every sample of a run exactly once: the sample ids in runs/<name>/samples.jsonl against those replayed from the
data cursor (step/prompt_id/index for each of the step's prompts and group members). Shared by the fault tests."""

from __future__ import annotations

from collections import Counter


def lost_and_duplicated(lines: list[dict], sampler, prompts: int, group: int) -> tuple[int, int]:
    """(ids replayed but not in `lines`, ids in `lines` more than once or not replayed); `lines`: the parsed
    samples.jsonl records in step order; `sampler`: a fresh PromptSampler of the run's training split and seed."""
    lost = duplicated = 0
    for rec in lines:
        step = rec["step"] - 1
        expected = {f"{step}/{p.id}/{j}" for p in sampler.next_batch(prompts) for j in range(group)}
        got = Counter(sid for sid, _, _ in rec["samples"])
        lost += len(expected - set(got))
        duplicated += sum(c - 1 for c in got.values()) + len(set(got) - expected)
    return lost, duplicated
