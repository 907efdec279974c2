"""Multi-term arithmetic a tiny model cannot do in its head but can with a calculator tool: 'What is 37*49+12?' ->
'1825'. Operands have exactly max_digits digits (>= 2); the expression is a*b+c, a*b-c or a+b*c; the question comes in
one of `PHRASINGS`. The verifier scores the final assistant turn's text (exact match: the integer, nothing else).

Used with `rollout.tools: [posttrain.tasks.builtin_tools:calculate]` (`posttrain demo --task tools`)."""

from __future__ import annotations

import random

from posttrain.tasks.base import Problem, verifier_for
from posttrain.tasks.generated import disjoint_splits

# How a question is asked. The demo's warm-start traces are imperfect in a different way for each (demo_tools.py).
PHRASINGS = ("What is {e}?", "Calculate {e}.", "Compute {e}", "{e} = ?")
FORMS = ("{a}*{b}+{c}", "{a}*{b}-{c}", "{a}+{b}*{c}")


def phrasing_of(problem: Problem) -> int:
    """Index into PHRASINGS of a problem of this task (kept in its id: 'calc/<phrasing>/<expression>')."""
    return int(problem.id.split("/")[1])


def expression_of(problem: Problem) -> str:
    return problem.id.split("/", 2)[2]


class ToolArithmeticTask:
    name = "tool_arithmetic"

    def __init__(self, train_size: int, heldout_size: int, *, seed: int = 0, max_digits: int = 3,
                 reward: str = "exact"):
        self.max_digits = max(2, max_digits)
        self.verify = verifier_for(reward)
        self.train, self.heldout = disjoint_splits(self._draw, train_size, heldout_size, seed)

    def _operand(self, rng: random.Random) -> int:
        return rng.randint(10 ** (self.max_digits - 1), 10**self.max_digits - 1)

    def _draw(self, rng: random.Random) -> Problem:
        form, k = rng.choice(FORMS), rng.randrange(len(PHRASINGS))
        a, b, c = self._operand(rng), self._operand(rng), self._operand(rng)
        expression = form.format(a=a, b=b, c=c)
        answer = a * b + c if form == FORMS[0] else a * b - c if form == FORMS[1] else a + b * c
        return Problem(id=f"calc/{k}/{expression}", prompt=PHRASINGS[k].format(e=expression), answer=str(answer))

    def score(self, problem: Problem, completion: str) -> float:
        return self.verify(problem.answer, completion)
