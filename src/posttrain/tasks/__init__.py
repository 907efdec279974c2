"""Built-in verifiable tasks (the embedded default) and user datasets, behind one small interface."""

from posttrain.tasks.base import Problem, Task
from posttrain.tasks.registry import DATASET_NAMES, load_task

__all__ = ["DATASET_NAMES", "Problem", "Task", "load_task"]
