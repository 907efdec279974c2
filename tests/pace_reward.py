"""A reward function for tests that hold a run's steps slow until something outside the run is ready (an extra
rollout engine that starts, a node that joins): copied into a directory (`install`), it sleeps 1 s per call while
a file named `hold` exists beside it. It enters the run with weight 0 (logged only), so the run's samples and
updates are those of the same run without it; only the steps' pace changes, and with it how many steps pass
while the thing the test waits for gets ready, however fast or loaded the machine is."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path


def pace(completions, **kwargs):
    if os.path.exists(Path(__file__).with_name("hold")):
        time.sleep(1.0)
    return [0.0] * len(completions)


def install(directory) -> tuple[str, Path]:
    """Copies this file into `directory`; returns (the reward.functions override that adds `pace` with weight 0,
    the hold file's path: create it to slow the steps, remove it to let them run)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / "pace_reward.py"
    shutil.copyfile(__file__, target)
    return f"reward.functions=[{{name: pace, fn: '{target}:pace', weight: 0}}]", directory / "hold"
