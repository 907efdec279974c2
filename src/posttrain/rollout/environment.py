"""Environments for multi-turn episodes (`rollout.environment: path/to/file.py:Class`).

An environment is a class of yours with two methods; posttrain makes **one instance per episode**, so the
episode's state lives on `self`:

    reset(self, row) -> list[message]
        The episode's first messages. `row` is {"id", "prompt", "answer", **the dataset row's other columns}.
    step(self, state, assistant_message) -> (new messages, reward, done)
        Called after each assistant turn that made no tool call (a turn with tool calls gets the tools' results
        as `tool` messages instead, and the episode goes on without asking the environment). `state` is an
        `EpisodeState` (row, messages so far, turn, tool_calls); `assistant_message` is {"role": "assistant",
        "content": ...}. Return the messages to append (e.g. a user message with feedback; [] for none), this
        turn's reward (a float, or None for no reward this turn; the episode's environment reward is their sum)
        and whether the episode is over (a bool).

A message is a dict with `role` and `content` strings (other keys, such as `name`, are passed to the chat template).
Either method may be `async def`: the episodes of a turn are then awaited concurrently. The constructor takes no
arguments. Example, a guessing game that tells the policy higher or lower:

    import random

    class GuessTheNumber:
        def reset(self, row):
            self.target = int(row["answer"])
            return [{"role": "user", "content": f"Guess my number between 1 and 100. {row['prompt']}"}]

        def step(self, state, assistant_message):
            guess = int("".join(c for c in assistant_message["content"] if c.isdigit()) or -1)
            if guess == self.target:
                return [], 1.0, True
            hint = "higher" if guess < self.target else "lower"
            return [{"role": "user", "content": f"No, {hint}."}], None, False

How it runs: your class is loaded at start (`check_environment`, errors name the field, file and class) and again
in a child process of the driver (`EnvironmentHost`), where every instance lives. One call per turn
covers all of that turn's active episodes and must finish within `rollout.environment_timeout_seconds`; past it
the child is killed and restarted, and every episode of that call ends with reason `environment_error`, as does an
episode whose method raised. Returning something that breaks the contract above stops the run with an error
naming your file, class and method. Without `rollout.environment` the built-in chat environment is used: the row's
prompt as the first message, and the episode ends when the policy answers without a tool call.

A Gymnasium-style text environment (`reset(seed, options) -> (observation, info)`, `step(text) -> (observation,
reward, terminated, truncated, info)`) runs through the adapter of rollout/gym_adapter.py
(`rollout.environment_interface`: auto picks it for a subclass of gymnasium.Env).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from dataclasses import dataclass

from posttrain.errors import PosttrainError
from posttrain.rollout.env_contract import is_finite_number, returned_error
from posttrain.rollout.gym_adapter import GymContractError, episode_factory
from posttrain.usercode import file_sha256, load


@dataclass
class EpisodeState:
    row: dict              # {"id", "prompt", "answer", **the dataset row's other columns}
    messages: list[dict]   # the conversation so far, the assistant message just sampled included
    turn: int              # 0-based index of the assistant turn just taken
    tool_calls: int = 0    # tool calls made so far in the episode


@dataclass(frozen=True)
class EnvFailure:
    """An episode's environment call that failed (raised, timed out): the runner ends it (`environment_error`)."""
    text: str


@dataclass(frozen=True)
class EnvironmentSource:
    spec: str
    file: str
    sha256: str
    name: str   # the class's name
    interface: str = "posttrain"   # the protocol it runs under: posttrain, or gymnasium (rollout/gym_adapter.py)


def check_environment(spec: str, field: str = "rollout.environment", interface: str = "auto") -> EnvironmentSource:
    """At start: the class `spec` names must exist, have `reset` and `step` methods, and take no constructor
    arguments; else PosttrainError naming `field`, the file and the class. `interface`: rollout.environment_interface
    (a Gymnasium class's reset and step must also take what the adapter passes them)."""
    sym = load(spec, field)
    where = f"{field}: {sym.file}:{sym.name}"
    if not inspect.isclass(sym.obj):
        raise PosttrainError(f"{where} is a {type(sym.obj).__name__}, not a class",
                             hint="name a class with reset(self, row) and step(self, state, assistant_message) methods "
                             "(see posttrain/rollout/environment.py)")
    missing = [m for m in ("reset", "step") if not callable(getattr(sym.obj, m, None))]
    if missing:
        raise PosttrainError(f"{where} has no {' and no '.join(missing)} method",
                             hint="an environment defines reset(self, row) -> messages and "
                             "step(self, state, assistant_message) -> (messages, reward, done)")
    try:
        inspect.signature(sym.obj).bind()
    except TypeError as e:
        raise PosttrainError(f"{where} cannot be constructed without arguments ({e})",
                             hint="posttrain makes one instance per episode with Class(); give every __init__ "
                             "parameter a default, or read settings from the row in reset") from None
    except ValueError:
        pass  # no readable signature (a C-implemented base): found out at the first reset
    interface, _ = episode_factory(sym.obj, interface, f"{sym.file}:{sym.name}")
    return EnvironmentSource(spec, str(sym.file), file_sha256(sym.file), sym.name, interface)


class ChatEnvironment:
    """The built-in environment: the row's prompt is the conversation's start; the first step ends the episode
    (the runner only steps an environment once the policy answers without a tool call)."""

    def reset(self, row: dict) -> list[dict]:
        prompt = row["prompt"]
        return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)

    def step(self, state: EpisodeState, assistant_message: dict) -> tuple[list[dict], float | None, bool]:
        return [], None, True


# ---------------------------------------------------------------------------------------------- contract checks


def _contract_error(where: str, method: str, what: str, value) -> str:
    return returned_error(where, method, value, what, "the protocol in posttrain/rollout/environment.py")


def _check_messages(value, where: str, method: str) -> str | None:
    if not isinstance(value, list):
        return _contract_error(where, method, "expected a list of messages", value)
    for m in value:
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            return _contract_error(where, method, f"the message {m!r:.200} is not a dict with str 'role' and "
                                   "'content'", value)
    return None


def check_reset(value, where: str) -> str | None:
    """Why `value` is not what reset returns (a list of messages), or None."""
    return _check_messages(value, where, "reset")


def check_step(value, where: str) -> str | None:
    """Why `value` is not what step returns ((messages, reward float|None, done bool)), or None."""
    if not (isinstance(value, tuple) and len(value) == 3):
        return _contract_error(where, "step", "expected a tuple (messages, reward, done)", value)
    messages, reward, done = value
    why = _check_messages(messages, where, "step")
    if why is not None:
        return why
    if reward is not None and not is_finite_number(reward):
        return _contract_error(where, "step", f"the reward {reward!r} is not a finite number or None", value)
    if not isinstance(done, bool):
        return _contract_error(where, "step", f"done {done!r} is not a bool", value)
    return None


# ---------------------------------------------------------------------------------------------- the instances


class Episodes:
    """One environment instance per episode id, and the batched reset/step/end over them. Runs in the child for
    user code, in the driver itself for the built-in chat environment. Each request is (method, items);
    each item's answer is ("ok", value), ("error", text: the user's method raised) or ("contract", text)."""

    def __init__(self, cls, where: str):
        self.cls, self.where = cls, where
        self.instances: dict = {}
        self.loop = asyncio.new_event_loop()  # one loop for the child's life: an env may keep loop-bound clients

    def __call__(self, request: tuple) -> list[tuple[str, object]]:
        method, items = request
        if method == "end":
            for episode_id in items:
                self.instances.pop(episode_id, None)
            return []
        calls = [self._start(method, item) for item in items]
        pending = [i for i, c in enumerate(calls) if inspect.isawaitable(c[1])]
        if pending:
            async def gather():
                return await asyncio.gather(*(calls[i][1] for i in pending), return_exceptions=True)
            for i, value in zip(pending, self.loop.run_until_complete(gather())):
                calls[i] = ("error", _raised(self.where, method, value)) if isinstance(value, BaseException) \
                    else ("ok", value)
        check = check_reset if method == "reset" else check_step
        out = []
        for status, value in calls:
            why = check(value, self.where) if status == "ok" else None
            out.append(("contract", why) if why else (status, _plain(value) if status == "ok" else value))
        return out

    def _start(self, method: str, item: tuple) -> tuple[str, object]:
        """("ok", the return value or a coroutine) or ("error", text)."""
        episode_id = item[0]
        try:
            if method == "reset":
                self.instances[episode_id] = instance = self.cls()
                return "ok", instance.reset(item[1])
            instance = self.instances.get(episode_id)
            if instance is None:
                return "error", (f"{self.where}: episode {episode_id!r} has no instance (never reset, or its "
                                 "process was restarted after another call timed out)")
            return "ok", instance.step(item[1], item[2])
        except GymContractError as e:  # a Gymnasium-style return the adapter cannot map
            return "contract", str(e)
        except Exception as e:  # noqa: BLE001 — the user's method may raise anything
            return "error", _raised(self.where, method, e)


def _raised(where: str, method: str, e: BaseException) -> str:
    return f"{where}.{method} raised {type(e).__name__}: {e}"[:2000]


def _plain(value):
    """Messages as plain dicts (and a float reward), so the answer pickles back to the parent."""
    if isinstance(value, tuple):
        messages, reward, done = value
        return [dict(m) for m in messages], None if reward is None else float(reward), done
    return [dict(m) for m in value]


def _episodes_handler(spec: str, field: str, interface: str = "auto"):
    """In the child: the user's class loaded again by its spec (behind the Gymnasium adapter if it runs under that
    interface). A load that fails now (the file changed since the start check) answers every request with that
    error, which the parent raises."""
    try:
        sym = load(spec, field)
        _, make = episode_factory(sym.obj, interface, f"{sym.file}:{sym.name}")
    except PosttrainError as e:
        text = str(e)
        return lambda request: ("load", text)
    return Episodes(make, f"{sym.file}:{sym.name}")


class EnvironmentHost:
    """The driver's side (rollout/episodes.py). `spec`: the user's class (run in a child process), or None for the built-in chat
    environment (run in this process). `timeout_s`: the limit of one call, for all of its episodes together.
    `interface`: rollout.environment_interface (auto, posttrain, gymnasium)."""

    def __init__(self, spec: str | None, timeout_s: float, field: str = "rollout.environment",
                 interface: str = "auto"):
        self.spec, self.timeout_s = spec, timeout_s
        self.child = None
        if spec is None:
            self._local = Episodes(ChatEnvironment, "posttrain.rollout.environment:ChatEnvironment (built-in)")
        else:
            from posttrain.rewards.child_process import ChildProcess

            self._local = None
            self.child = ChildProcess(functools.partial(_episodes_handler, spec, field, interface),
                                      "posttrain-environment")

    def reset(self, items: list[tuple[str, dict]]) -> list[list[dict] | EnvFailure]:
        """items: (episode_id, row) -> the first messages of each episode, or its failure."""
        return self._call("reset", items)

    def step(self, items: list[tuple[str, EpisodeState, dict]]) -> list[tuple[list[dict], float | None, bool]
                                                                         | EnvFailure]:
        """items: (episode_id, state, assistant_message) -> (new messages, reward, done) per episode, or its failure."""
        return self._call("step", items)

    def end(self, episode_ids: list[str]) -> None:
        """Drops the instances of episodes that ended."""
        if episode_ids:
            self._call("end", list(episode_ids))

    def _call(self, method: str, items: list) -> list:
        if not items:
            return []
        if self._local is not None:
            answers = self._local((method, items))
        else:
            status, answers = self.child.call((method, items), self.timeout_s)
            if status != "ok":
                why = (f"ran longer than {self.timeout_s:g} s (rollout.environment_timeout_seconds)"
                       if status == "timeout" else f"took its process down (exit code {answers})")
                text = (f"{self.spec}: {method} of {len(items)} episode(s) {why}; the environment process was "
                        "restarted and these episodes ended")
                return [] if method == "end" else [EnvFailure(text)] * len(items)
            if isinstance(answers, tuple) and answers[0] == "load":
                raise PosttrainError(answers[1])
        if method == "end":
            return []
        out = []
        for status, value in answers:
            if status == "contract":
                raise PosttrainError(f"rollout.environment: {value}")
            out.append(value if status == "ok" else EnvFailure(value))
        return out

    def close(self) -> None:
        if self.child is not None:
            self.child.close()
