"""The task registry: the task a config names (a built-in generated task or a user dataset), with its splits."""

from __future__ import annotations

from typing import TYPE_CHECKING

from posttrain.errors import PosttrainError
from posttrain.tasks.addition import AdditionTask
from posttrain.tasks.base import Task
from posttrain.tasks.dataset import DatasetTask
from posttrain.tasks.sorting import SortingTask
from posttrain.tasks.tool_arithmetic import ToolArithmeticTask

if TYPE_CHECKING:
    from posttrain.config import TaskConfig


DATASET_NAMES = ("dataset", "jsonl")  # a user dataset; "jsonl" is its first name, kept as an alias


def load_task(cfg: "TaskConfig", seed: int, need_answer: bool = True) -> Task:
    """The task named in the config, with splits drawn from `seed`. need_answer=False: dataset rows may lack the
    answer column (nothing compares with it, see `answer_needed`)."""
    builtins = {"addition": AdditionTask, "sorting": SortingTask, "tool_arithmetic": ToolArithmeticTask}
    if cfg.name in builtins:
        try:
            return builtins[cfg.name](cfg.train_size, cfg.heldout_size, seed=seed, max_digits=cfg.max_digits,
                                      reward=cfg.reward)
        except ValueError as e:  # the problem space is smaller than the splits asked for
            raise PosttrainError(f"task {cfg.name}: {e}") from None
    if cfg.name in DATASET_NAMES:
        if not cfg.path:
            raise PosttrainError(f"task.name is {cfg.name!r} but task.path is not set",
                                 hint="set task.path to a .jsonl, .parquet or .csv file or a save_to_disk directory")
        return DatasetTask(cfg, seed, need_answer=need_answer)
    raise PosttrainError(
        f"task.name: unknown task {cfg.name!r}",
        hint=f"use one of {sorted(builtins) + list(DATASET_NAMES)}",
    )
