"""Multi-digit addition: '47+385=' -> '432'. Operands have 2..max_digits digits (lengths drawn uniformly)."""

from __future__ import annotations

import random

from posttrain.tasks.base import Problem, verifier_for
from posttrain.tasks.generated import disjoint_splits


class AdditionTask:
    name = "addition"

    def __init__(self, train_size: int, heldout_size: int, *, seed: int = 0, max_digits: int = 3, reward: str = "exact"):
        self.max_digits = max(2, max_digits)
        self.verify = verifier_for(reward)
        self.train, self.heldout = disjoint_splits(self._draw, train_size, heldout_size, seed)

    def _operand(self, rng: random.Random) -> int:
        digits = rng.randint(2, self.max_digits)
        return rng.randint(10 ** (digits - 1), 10**digits - 1)

    def _draw(self, rng: random.Random) -> Problem:
        a, b = self._operand(rng), self._operand(rng)
        return Problem(id=f"add:{a}+{b}", prompt=f"{a}+{b}=", answer=str(a + b))

    def score(self, problem: Problem, completion: str) -> float:
        return self.verify(problem.answer, completion)
