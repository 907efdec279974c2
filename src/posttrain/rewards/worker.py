"""The reward role for verifiable tasks: a Ray actor that scores samples with the task's verifier (in a child process,
rewards/verifier.py) and the user's reward functions (rewards/functions.py)."""

from __future__ import annotations

import functools

from posttrain.remote.faults import maybe_wedge
from posttrain.remote.stacks import ActorProcess
from posttrain.rewards.verifier import IsolatedScorer
from posttrain.tasks.base import Problem


class RewardWorker(ActorProcess):
    """The reward role for verifiable tasks. Made a Ray actor by the driver; holds the task's problems by id."""

    def __init__(self, cfg_dict: dict):
        from posttrain.config import RunConfig
        from posttrain.tasks import load_task
        from posttrain.tasks.base import answer_needed

        cfg = RunConfig.model_validate(cfg_dict)
        self.default = cfg.reward.default
        make_task = functools.partial(load_task, cfg.task, cfg.seed, need_answer=answer_needed(cfg.reward.weights))
        self.scorer = IsolatedScorer(make_task, cfg.reward.timeout_seconds, self.default)
        self.functions = None
        if cfg.reward.functions:  # user code: a child process per function (rewards/functions.py)
            from posttrain.rewards.functions import FunctionScorers

            self.functions = FunctionScorers(cfg.reward.functions, cfg.reward.timeout_seconds, self.default)

    def score(self, items: list[tuple[str, str, str, str]]) -> list[tuple[float, str | None]]:
        """items: (problem_id, prompt, answer, completion_text) -> (reward, error) per item."""
        maybe_wedge("reward")  # a recovery test's hang (remote/faults.py); nothing otherwise
        out = []
        for pid, prompt, answer, text in items:
            r = self.scorer.score(Problem(pid, prompt, answer), text)
            out.append((r.reward, r.error))
        return out

    def score_functions(self, rows: list[dict], step) -> dict[str, tuple[list, list]]:
        """The user's reward functions on rows (prompt, completion, answer, completion_ids, sample_id, columns):
        name -> (score per row, error per row); see FunctionScorers.score."""
        return self.functions.score(rows, step)
