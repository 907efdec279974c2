"""The built-in math_answer function (rewards/math_answer.py, math-verify): final answers of word problems by hand,
through the real reward path (the reward worker's child process, where math-verify's signal timeouts must work),
and the same numbers as a reward and as an eval scorer on identical rows."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from posttrain.config import load_config
from posttrain.errors import PosttrainError
from posttrain.rewards.math_answer import math_answer

CASES = [  # (completion, row answer, score): worked out by reading the completion's final answer
    (r"Half of the pie is left, so the answer is \boxed{1/2}.", "0.5", 1.0),   # boxed fraction = decimal
    ("She pays 3 + 4 = 7 dollars in all.", "7", 1.0),                          # plain final number
    ("So the probability is 0.5", r"\frac{1}{2}", 1.0),                        # LaTeX answer column
    ("There were 12 apples; 5 were eaten, so 7 remain.", "12", 0.0),           # the last number counts, not the first
    (r"\boxed{3/4} of the class passed", "0.75", 1.0),                         # \boxed wins over later text
    ("The total is 1,000 dollars.", "1000", 1.0),                              # thousands separator
    ("I do not know.", "7", 0.0),                                              # no answer in the completion
    ("", "7", 0.0),
]
BAD_ANSWER_ROW = ("It is 7.", "seven", None)  # the row's answer cannot be parsed


@pytest.mark.parametrize("completion,answer,expected", CASES)
def test_final_answers_by_hand(completion, answer, expected):
    assert math_answer("q", completion, answer) == expected


def test_an_unparseable_row_answer_is_a_clear_error():
    with pytest.raises(ValueError, match=r"the row's answer 'seven' is not a number or math expression"):
        math_answer("q", "It is 7.", "seven")
    with pytest.raises(ValueError, match="the row has no 'answer'"):
        math_answer("q", "It is 7.", None)


def test_off_the_main_thread_it_works_without_signal_timeouts():
    """math-verify's signal.alarm raises ValueError off the main thread; math_answer turns its timeouts off there."""
    def call(case):
        assert threading.current_thread() is not threading.main_thread()
        return math_answer("q", case[0], case[1])

    with ThreadPoolExecutor(2) as pool:
        assert list(pool.map(call, CASES)) == [c[2] for c in CASES]


def _rows(cases):
    return [{"prompt": f"problem {i}", "completion": c, "answer": a, "completion_ids": None, "sample_id": f"1/p{i}/0"}
            for i, (c, a, _) in enumerate(cases)]


def test_as_a_reward_and_as_a_scorer_the_scores_agree_exactly():
    """One definition of quality: the reward worker's path (RewardWorker.score_functions: one child process per
    function, called from its main thread) and the eval scorer `{type: function, fn: math_answer}` (scoring a suite's
    outputs in one batch) give identical numbers on identical rows; an unparseable answer is an exception failure in
    training and stops the eval."""
    from posttrain.evals.scorers import build_scorer, score_outputs
    from posttrain.rewards.worker import RewardWorker

    cfg = load_config(None, ["reward.functions=[{name: correct, fn: math_answer}]", "reward.default=-1",
                             "task.train_size=50", "task.heldout_size=5"])
    worker = RewardWorker(cfg.to_dict())
    try:
        scores, errors = worker.score_functions(_rows(CASES + [BAD_ANSWER_ROW]), 3)["correct"]
    finally:
        worker.functions.close()
    assert scores == [c[2] for c in CASES] + [-1.0] and errors[:-1] == [None] * len(CASES)
    assert errors[-1].startswith("exception: reward function 'correct' raised ValueError: math_answer: the row's "
                                 "answer 'seven'") and "for sample 1/p8/0 at step 3" in errors[-1]

    scorer = build_scorer({"type": "function", "fn": "math_answer"}, where="suite.yaml, suite math")
    rows = [{"prompt": r["prompt"], "output": r["completion"], "record": {"id": r["sample_id"], "answer": r["answer"]},
             "tokens": 0} for r in _rows(CASES)]
    as_scorer, _ = score_outputs(scorer, rows)
    assert as_scorer == scores[:-1]
    bad = _rows([BAD_ANSWER_ROW])[0]
    with pytest.raises(PosttrainError, match="function scorer math_answer: exception: .*the row's answer 'seven'"):
        scorer(bad["prompt"], bad["completion"], {"id": "b", "answer": bad["answer"]})


def test_the_short_name_and_the_full_spec_load_the_same_function():
    from posttrain.rewards.functions import check_functions
    from posttrain.usercode import load_callable

    assert load_callable("math_answer", "f")[1] is load_callable("posttrain.rewards.math_answer:math_answer", "f")[1]
    cfg = load_config(None, ["reward.functions=[{name: correct, fn: math_answer, weight: 2}]"])
    (src,) = check_functions(cfg.reward.functions).values()
    assert src.form == "sample" and src.file.endswith("rewards/math_answer.py")
