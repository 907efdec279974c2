"""Gymnasium-style text environments as posttrain environments (`rollout.environment_interface`).

A Gymnasium environment (gymnasium.Env's API) whose observations are text:

    reset(self, *, seed=None, options=None) -> (observation: str, info: dict)
    step(self, action: str) -> (observation: str, reward: float, terminated: bool, truncated: bool, info: dict)

runs under posttrain's protocol (rollout/environment.py) through `GymnasiumEpisode`, one instance per episode:

- reset(row): `Class()`, then `reset(seed=row_seed(row), options={"row": row})`; the first message is
  {"role": "user", "content": observation}. `options["row"]` is what posttrain's own reset gets ({"id", "prompt",
  "answer", **the row's other columns}). The seed is the row's id hashed, so every episode of a prompt's group starts
  from the same draw of the environment (GRPO's groups compare answers to one problem), and a rerun or a resume
  starts it the same way; the policy's samples are what differ. A reset that takes neither keyword (the older
  `reset() -> observation`) is called without them, and a bare str return is taken as the observation.
- step(state, assistant_message): `step(the assistant's text)`; the next observation becomes a user message (none
  once the episode is over, since no turn would read it), the reward is this turn's (summed over the episode), and
  done = terminated or truncated. `info` is not read.

`rollout.environment_interface`: gymnasium, posttrain, or auto (the default): gymnasium for a subclass of
`gymnasium.Env`, else posttrain. This module never imports gymnasium: auto looks for it in sys.modules, where the
user's file put it if its class subclasses gymnasium.Env, so posttrain runs without gymnasium installed.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import sys
from typing import Callable

from posttrain.errors import PosttrainError
from posttrain.rollout.env_contract import is_finite_number, returned_error

FIELD = "rollout.environment_interface"
RESET_KEYWORDS = ("seed", "options")


class GymContractError(Exception):
    """A Gymnasium-style method returned what the adapter cannot map: the run stops with this text (it names the
    file, class and method)."""


def row_seed(row: dict) -> int:
    """The seed an episode's reset gets: the first 8 bytes of sha256(the row's id), in [0, 2^63)."""
    return int.from_bytes(hashlib.sha256(str(row["id"]).encode()).digest()[:8], "big") >> 1


def is_gymnasium_env(cls) -> bool:
    gym = sys.modules.get("gymnasium")  # not imported here: a subclass's file has imported it already
    return gym is not None and inspect.isclass(cls) and issubclass(cls, gym.Env)


def episode_factory(cls, interface: str, where: str) -> tuple[str, Callable[[], object]]:
    """(the interface `cls` runs under, posttrain or gymnasium; a no-argument callable that makes one episode's
    environment under posttrain's protocol). `interface` is the config's (auto, posttrain, gymnasium); `where` is
    "file:Class". A Gymnasium class whose reset or step cannot be called as the adapter calls them is a
    PosttrainError naming the field, file and class."""
    setting = f"{FIELD}={interface}"
    if interface == "auto":
        interface = "gymnasium" if is_gymnasium_env(cls) else "posttrain"
        setting += " (a gymnasium.Env subclass)"
    if interface == "posttrain":
        return "posttrain", cls
    keywords = _check_methods(cls, f"{setting}: {where}")
    return "gymnasium", functools.partial(GymnasiumEpisode, cls, where, keywords)


def _check_methods(cls, where: str) -> tuple[str, ...]:
    """The keywords of RESET_KEYWORDS that cls's reset takes; PosttrainError when reset cannot be called with them
    (nor bare) or step not with one action."""
    hint = ("a Gymnasium environment defines reset(self, *, seed=None, options=None) -> (observation, info) and "
            "step(self, action) -> (observation, reward, terminated, truncated, info); for posttrain's own protocol "
            f"(reset(self, row), step(self, state, assistant_message)) set {FIELD}=posttrain")
    gym = sys.modules.get("gymnasium")
    for name in ("reset", "step"):
        if gym is not None and issubclass(cls, gym.Env) and getattr(cls, name) is getattr(gym.Env, name):
            raise PosttrainError(f"{where} does not define {name} (gymnasium.Env's own does not run an episode)",
                                 hint=hint)
    reset, step = _method_signature(cls, "reset"), _method_signature(cls, "step")
    keywords: tuple[str, ...] = ()
    if reset is not None:
        keywords = tuple(k for k in RESET_KEYWORDS if _takes_keyword(reset, k))
        if not _binds(reset, (), dict.fromkeys(keywords)):
            raise PosttrainError(f"{where}.reset{reset} cannot be called as reset(seed=..., options=...) nor as "
                                 "reset()", hint=hint)
    if step is not None and not _binds(step, ("text",), {}):
        raise PosttrainError(f"{where}.step{step} cannot be called as step(action)", hint=hint)
    return keywords if reset is not None else RESET_KEYWORDS


def _method_signature(cls, name: str) -> inspect.Signature | None:
    """The signature a call on an instance sees (self dropped); None when it cannot be read (C code)."""
    try:
        sig = inspect.signature(getattr(cls, name))
    except (TypeError, ValueError):
        return None
    if isinstance(inspect.getattr_static(cls, name), (staticmethod, classmethod)):
        return sig
    return sig.replace(parameters=list(sig.parameters.values())[1:])


def _takes_keyword(sig: inspect.Signature, name: str) -> bool:
    p = sig.parameters.get(name)
    return (p is not None and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)) or any(
        q.kind is q.VAR_KEYWORD for q in sig.parameters.values())


def _binds(sig: inspect.Signature, args: tuple, kwargs: dict) -> bool:
    try:
        sig.bind(*args, **kwargs)
    except TypeError:
        return False
    return True


class GymnasiumEpisode:
    """posttrain's environment protocol over one instance of a Gymnasium-style class (see the module docstring)."""

    def __init__(self, cls, where: str, reset_keywords: tuple[str, ...] = RESET_KEYWORDS):
        self.env = cls()
        self.where, self.reset_keywords = where, reset_keywords

    def reset(self, row: dict) -> list[dict]:
        given = {"seed": row_seed(row), "options": {"row": row}}
        out = self.env.reset(**{k: given[k] for k in self.reset_keywords})
        if isinstance(out, str):  # the older reset() -> observation
            return [{"role": "user", "content": out}]
        if not (isinstance(out, tuple) and len(out) == 2):
            raise GymContractError(self._returned("reset", out, "expected a tuple (observation, info)"))
        if not isinstance(out[0], str):
            raise GymContractError(self._returned("reset", out, f"the observation {out[0]!r:.200} is not a str (a "
                                                  "text environment's observations are the user's messages)"))
        return [{"role": "user", "content": out[0]}]

    def step(self, state, assistant_message: dict) -> tuple[list[dict], float, bool]:
        out = self.env.step(assistant_message["content"])
        if not (isinstance(out, tuple) and len(out) == 5):
            raise GymContractError(self._returned("step", out, "expected a tuple (observation, reward, terminated, "
                                                  "truncated, info)"))
        observation, reward, terminated, truncated, _ = out
        if not isinstance(observation, str):
            raise GymContractError(self._returned("step", out, f"the observation {observation!r:.200} is not a str"))
        if not is_finite_number(reward):
            raise GymContractError(self._returned("step", out, f"the reward {reward!r} is not a finite number"))
        for name, flag in (("terminated", terminated), ("truncated", truncated)):
            if not _is_bool(flag):
                raise GymContractError(self._returned("step", out, f"{name} {flag!r} is not a bool"))
        done = bool(terminated) or bool(truncated)
        return ([] if done else [{"role": "user", "content": observation}]), float(reward), done

    def _returned(self, method: str, value, what: str) -> str:
        return returned_error(self.where, method, value, what,
                              "the Gymnasium adapter in posttrain/rollout/gym_adapter.py")


def _is_bool(value) -> bool:
    """A Python bool or a numpy one (gymnasium's own wrappers return numpy bools)."""
    return isinstance(value, bool) or (type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"))
