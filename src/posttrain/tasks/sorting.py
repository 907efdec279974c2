"""Sorting a digit string: 'sort:31942=' -> '12349'. Lengths 3..max_digits+2 digits."""

from __future__ import annotations

import random

from posttrain.tasks.base import Problem, verifier_for
from posttrain.tasks.generated import disjoint_splits


class SortingTask:
    name = "sorting"

    def __init__(self, train_size: int, heldout_size: int, *, seed: int = 0, max_digits: int = 3, reward: str = "exact"):
        self.max_len = max(4, max_digits + 2)
        self.verify = verifier_for(reward)
        self.train, self.heldout = disjoint_splits(self._draw, train_size, heldout_size, seed)

    def _draw(self, rng: random.Random) -> Problem:
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(3, self.max_len)))
        return Problem(id=f"sort:{digits}", prompt=f"sort:{digits}=", answer="".join(sorted(digits)))

    def score(self, problem: Problem, completion: str) -> float:
        return self.verify(problem.answer, completion)
