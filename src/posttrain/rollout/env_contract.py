"""What an environment's method returned that breaks its protocol, in words: shared by the posttrain protocol
(rollout/environment.py) and the Gymnasium adapter (rollout/gym_adapter.py), which environment.py imports."""

from __future__ import annotations

import math
import numbers


def returned_error(where: str, method: str, value, what: str, protocol: str) -> str:
    """`where.method returned <value, cut at 300 characters>: what (see <protocol>)`."""
    text = repr(value)
    return f"{where}.{method} returned {text[:300] + '...' if len(text) > 300 else text}: {what} (see {protocol})"


def is_finite_number(value) -> bool:
    """A real, finite number that is not a bool."""
    return not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value)
