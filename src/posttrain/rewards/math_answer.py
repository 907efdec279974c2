"""Final answers of math word problems, checked with math-verify: a built-in reward function, usable as
`reward.functions: [{name: correct, fn: math_answer}]` (the short name of `posttrain.rewards.math_answer:math_answer`)
and as the eval scorer `{type: function, fn: math_answer}`, so training and eval give the same number.

    math_answer(prompt, completion, answer) -> 1.0 | 0.0

The completion's final answer is its last `\\boxed{...}` or, without one, its last number or LaTeX expression
("... so she has 7 apples." -> 7). It is compared with the row's `answer` column as math, not as text: `1/2`,
`0.5` and `\\frac{1}{2}` are equal, `1,000` is 1000. 1.0 when they are equal; 0.0 when they differ or no answer
can be parsed from the completion. A row whose `answer` cannot be parsed (not a number or expression) raises
ValueError naming it: in training that sample counts as an `exception` failure of this function (reward.default),
in an eval suite it stops the eval; fix the dataset.

Timeouts: math-verify limits its own parsing and comparison with `signal.alarm`, which works only in a process's
main thread. Our reward functions run in a child process whose main thread makes the call (rewards/functions.py,
child_process.ChildProcess), so there math-verify's limits are on; called from any other thread they are turned off
(instead of raising), and only the caller's limit applies (in training and eval: reward.timeout_seconds, enforced by
killing the child).
"""

from __future__ import annotations

import functools
import threading

MATH_VERIFY_TIMEOUT_S = 5  # math-verify's own limit per parse / comparison (whole seconds: signal.alarm)


def _timeout() -> int | None:
    return MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


@functools.lru_cache(maxsize=4096)
def _parse_gold(answer: str, timeout: int | None) -> tuple:
    from math_verify import parse

    return tuple(parse(answer, parsing_timeout=timeout))


def math_answer(prompt, completion, answer) -> float:
    """1.0 when the completion's final answer equals the row's `answer` (as math), else 0.0 (see the module). The
    completion is a string, or a list of messages for a chat prompt (rewards/chat_form.py)."""
    from math_verify import parse, verify

    from posttrain.rewards.chat_form import completion_text

    timeout = _timeout()
    if answer is None or not str(answer).strip():
        raise ValueError("math_answer: the row has no 'answer' to compare with")
    gold = _parse_gold(str(answer).strip(), timeout)
    if not gold:
        raise ValueError(f"math_answer: the row's answer {str(answer)!r} is not a number or math expression that "
                         "math-verify can parse; give a number, a fraction or LaTeX (e.g. 7, 1/2, \\frac{1}{2})")
    predicted = parse(completion_text(completion), parsing_timeout=timeout)
    if not predicted:
        return 0.0
    return 1.0 if verify(list(gold), predicted, timeout_seconds=timeout) else 0.0
