"""The data cursor: which prompts each step trains on. Each epoch is a seeded permutation of the training split;
the cursor (epoch, offset) is all the state there is, so a resume continues with exactly the next prompts."""

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


def sample_seed(run_seed: int, step: int, prompt_index: int) -> int:
    """A per-prompt sampling seed fixed by (run seed, step, prompt index), so the same step resamples the same
    completions after a resume without saving engine RNG state."""
    return (run_seed * 1_000_003 + step * 10_007 + prompt_index) % (2**31 - 1)


def data_fingerprint(problems: list[Problem]) -> str:
    """Hash of the training split (ids, prompts, answers, in order). The cursor (epoch, offset) only means the same
    prompts over the same data: a resume checks this against the checkpoint's, so a changed dataset file is an
    error instead of silently skipped or repeated samples."""
    import hashlib
    import json

    rows = [[p.id, p.prompt, p.answer] for p in problems]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]
