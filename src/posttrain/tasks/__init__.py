"""Built-in verifiable tasks (the embedded default) and user datasets, behind one small interface."""

from posttrain.tasks.base import Problem, Task, load_task

__all__ = ["Problem", "Task", "load_task"]
