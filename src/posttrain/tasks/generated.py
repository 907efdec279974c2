"""Shared split logic for generated tasks: held-out problems first, then training problems that avoid them."""

from __future__ import annotations

import random
from typing import Callable

from posttrain.tasks.base import Problem


def disjoint_splits(
    draw: Callable[[random.Random], Problem], train_size: int, heldout_size: int, seed: int
) -> tuple[list[Problem], list[Problem]]:
    """Draws `heldout_size` distinct problems from one seeded stream and `train_size` distinct problems, none of
    them held out, from another. Raises if the problem space is too small for the sizes asked."""
    limit = 50 * (train_size + heldout_size) + 1000
    heldout: dict[str, Problem] = {}
    rng = random.Random(f"{seed}/heldout")
    for _ in range(limit):
        if len(heldout) == heldout_size:
            break
        p = draw(rng)
        heldout.setdefault(p.prompt, p)
    train: dict[str, Problem] = {}
    rng = random.Random(f"{seed}/train")
    for _ in range(limit):
        if len(train) == train_size:
            break
        p = draw(rng)
        if p.prompt not in heldout:
            train.setdefault(p.prompt, p)
    if len(heldout) < heldout_size or len(train) < train_size:
        raise ValueError(
            f"could only draw {len(train)} train / {len(heldout)} held-out distinct problems; "
            "lower task.train_size / task.heldout_size or raise task.max_digits"
        )
    return list(train.values()), list(heldout.values())
