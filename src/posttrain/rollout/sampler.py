"""The data cursor: which prompts each step trains on. Each epoch is a seeded permutation of the training split;
the cursor (epoch, offset) is all the state there is, so a resume continues with exactly the next prompts. A cursor
at the end of a pass (offset == the split's size) wraps on the next draw, so a checkpoint taken there resumes into
the next epoch's first prompts (tests/test_resume_edges.py)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from posttrain.tasks.base import Problem


@dataclass
class Cursor:
    epoch: int = 0
    offset: int = 0


class PromptSampler:
    def __init__(self, problems: list[Problem], seed: int, cursor: Cursor | None = None):
        if not problems:
            raise ValueError("no training problems")
        self.problems = problems
        self.seed = seed
        self.cursor = cursor or Cursor()
        self._order = self._permutation(self.cursor.epoch)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(len(self.problems)))
        random.Random(f"{self.seed}/epoch{epoch}").shuffle(order)
        return order

    def next_batch(self, k: int) -> list[Problem]:
        batch = []
        while len(batch) < k:
            if self.cursor.offset >= len(self._order):
                self.cursor = Cursor(self.cursor.epoch + 1, 0)
                self._order = self._permutation(self.cursor.epoch)
            take = self._order[self.cursor.offset : self.cursor.offset + (k - len(batch))]
            batch.extend(self.problems[i] for i in take)
            self.cursor = Cursor(self.cursor.epoch, self.cursor.offset + len(take))
        return batch

    def state(self) -> dict:
        return {"epoch": self.cursor.epoch, "offset": self.cursor.offset}


# Bit fields of a sampling seed, low to high: sample index | prompt index within the step | step | run seed.
SAMPLE_BITS, PROMPT_BITS, STEP_BITS, RUN_BITS = 10, 16, 22, 15
MAX_GROUP_SIZE = 1 << SAMPLE_BITS  # completions per prompt that get seeds of their own
MAX_PROMPTS_PER_STEP = 1 << PROMPT_BITS  # refill rounds included
MAX_STEPS = 1 << STEP_BITS


def sample_seed(run_seed: int, step: int, prompt_index: int) -> int:
    """Seed of sample 0 of the prompt at `prompt_index` (numbered across the step's refill rounds) of `step`.

    Engines draw sample j of a prompt with seed + j: that is vLLM's own rule for the children of an n > 1 request
    (vllm/v1/engine/parallel_sampling.py), and HfEngine follows it. The fields are packed into disjoint bit ranges
    (sample 10 bits, prompt 16, step 22, run seed 15; < 2**63), so every (step, prompt, sample) of a run has a seed
    no other one has: no two samples of a run share a random stream, whichever worker draws them and after any
    resume. (The old `base + prompt_index` gave prompt i's sample j the stream of prompt i+1's sample j-1.)
    Run seeds are taken modulo 2**15."""
    if not 0 <= step < MAX_STEPS:
        raise ValueError(f"step {step} is outside the seed layout's 0..{MAX_STEPS - 1}")
    if not 0 <= prompt_index < MAX_PROMPTS_PER_STEP:
        raise ValueError(f"prompt index {prompt_index} is outside the seed layout's 0..{MAX_PROMPTS_PER_STEP - 1}")
    run = run_seed % (1 << RUN_BITS)
    return ((run << STEP_BITS | step) << PROMPT_BITS | prompt_index) << SAMPLE_BITS


def prompt_seeds(base_seed: int, count: int) -> list[int]:
    """Seeds for `count` prompts sampled together outside the RL loop (eval suites): prompt i gets
    base_seed + i * MAX_GROUP_SIZE, so its samples (seed + j) never meet another prompt's."""
    return [base_seed + i * MAX_GROUP_SIZE for i in range(count)]


def data_fingerprint(problems: list[Problem]) -> str:
    """Hash of the training split (ids, prompts, answers and a dataset's other columns, in order). The cursor
    (epoch, offset) only means the same prompts over the same data: a resume checks this against the checkpoint's,
    so a changed dataset file is an error instead of silently skipped or repeated samples. Rows without other
    columns hash as they did before columns existed, so older checkpoints still resume."""
    import hashlib
    import json

    rows = [[p.id, p.prompt, p.answer, *([p.columns] if p.columns else [])] for p in problems]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]


def turn_seed(first_turn_seed: int, turn: int) -> int:
    """Seed of an episode's assistant turn `turn` (0-based) in a multi-turn rollout. Turn 0 is sampled like a
    single-turn completion (`first_turn_seed` = the prompt's seed + sample index), so a one-turn episode draws what
    a single-turn rollout draws; later turns take a splitmix64 hash of (seed, turn) in [2**63, 2**64), a range no
    first-turn seed (< 2**63, see `sample_seed`) is in, so a later turn never shares a first turn's stream."""
    if turn == 0:
        return first_turn_seed
    mask = (1 << 64) - 1
    x = (first_turn_seed * 0x9E3779B97F4A7C15 + turn * 0xBF58476D1CE4E5B9) & mask
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
    return (x ^ (x >> 31)) | (1 << 63)
