"""Reading the policy's tool calls from its text (`rollout.tool_parser`).

    hermes  every <tool_call>{"name": ..., "arguments": {...}}</tool_call> block is one call (Qwen2.5 / Hermes chat
            templates); `arguments` may also be a JSON-encoded string. An unclosed <tool_call> or a block that is not
            such an object is a `BadToolCall` (kind "malformed"), which the policy is told about in a tool message.
    json    the whole text (stripped) is one {"name": ..., "arguments": ...} object, or a list of them; any other
            text is an answer, not a call.

Text without a call gives [] (the policy answered). Another format is one function `text -> list` in `PARSERS`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Callable

from posttrain.errors import PosttrainError

# What a tool call's result can be besides a success (ToolResult.error, metrics tools/error/<kind>).
TOOL_ERROR_KINDS = ("malformed", "unknown_tool", "bad_arguments", "exception", "timeout", "limit")


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict

    def record(self) -> dict:
        return {"name": self.name, "arguments": self.arguments}


@dataclass(frozen=True)
class BadToolCall:
    text: str             # the offending text, as the policy wrote it
    why: str              # what is wrong with it, in words the policy can learn from
    kind: str = "malformed"

    def record(self) -> dict:
        return {"error": self.kind, "text": self.text, "why": self.why}


def _call_from_object(obj, text: str) -> ToolCall | BadToolCall:
    """{"name": str, "arguments": object or JSON string of one} -> ToolCall; other keys are ignored."""
    if not isinstance(obj, dict):
        return BadToolCall(text, f"expected a JSON object with \"name\" and \"arguments\", got {type(obj).__name__}")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return BadToolCall(text, "the call has no \"name\" string")
    arguments = obj.get("arguments", obj.get("parameters", {}))  # Llama-style "parameters" read the same way
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as e:
            return BadToolCall(text, f"\"arguments\" is a string that is not JSON ({e})")
    if not isinstance(arguments, dict):
        return BadToolCall(text, f"\"arguments\" must be a JSON object, got {type(arguments).__name__}")
    return ToolCall(name, arguments)


HERMES_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)  # one hermes call, its JSON body in group 1


def parse_hermes(text: str) -> list[ToolCall | BadToolCall]:
    calls: list[ToolCall | BadToolCall] = []
    end = 0
    for m in HERMES_BLOCK.finditer(text):
        body = m.group(1).strip()
        try:
            calls.append(_call_from_object(json.loads(body), m.group(0)))
        except json.JSONDecodeError as e:
            calls.append(BadToolCall(m.group(0), f"the <tool_call> block is not valid JSON ({e})"))
        end = m.end()
    rest = text[end:]
    if "<tool_call>" in rest:
        calls.append(BadToolCall(rest[rest.index("<tool_call>"):],
                                 "<tool_call> is never closed: end the call with </tool_call>"))
    return calls


def format_tool_call(name: str, arguments, parser: str) -> str:
    """A call written the way `parse_tool_calls(text, parser)` reads it back: hermes wraps the JSON object in
    <tool_call> tags, json writes it bare. `arguments`: a dict, or a JSON-encoded string (as OpenAI sends them)."""
    body = json.dumps({"name": name, "arguments": decoded_arguments(arguments)})
    return f"<tool_call>\n{body}\n</tool_call>" if parser == "hermes" else body


def decoded_arguments(raw) -> dict | str:
    """OpenAI's JSON-encoded arguments as an object; an empty string is no arguments; text that is not JSON stays."""
    if isinstance(raw, str):
        try:
            return json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError:
            return raw
    return raw if raw is not None else {}


def parse_json(text: str) -> list[ToolCall | BadToolCall]:
    stripped = text.strip()
    try:
        obj = json.loads(stripped)
    except json.JSONDecodeError:
        return []  # prose: an answer
    objs = obj if isinstance(obj, list) else [obj]
    if not objs or not all(isinstance(o, dict) and "name" in o for o in objs):
        return []  # JSON, but not calls: an answer that happens to be JSON
    return [_call_from_object(o, json.dumps(o)) for o in objs]


PARSERS: dict[str, Callable[[str], list[ToolCall | BadToolCall]]] = {"hermes": parse_hermes, "json": parse_json}


def parse_tool_calls(text: str, parser: str) -> list[ToolCall | BadToolCall]:
    """The calls in one assistant turn's text, in order; [] when it holds none."""
    if parser not in PARSERS:
        raise PosttrainError(f"rollout.tool_parser: unknown parser {parser!r}",
                             hint=f"use one of {', '.join(PARSERS)}")
    return PARSERS[parser](text)
