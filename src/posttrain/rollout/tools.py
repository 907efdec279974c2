"""Tools from plain Python functions (`rollout.tools: [path/to/file.py:function, ...]`).

A tool is a function whose parameters all have type hints and whose docstring describes it:

    def search(query: str, limit: int = 3) -> str:
        '''Searches the knowledge base and returns the best passages.

        Args:
            query: what to look for, in a few words.
            limit: how many passages to return.
        '''

Its JSON schema, which the chat template shows the policy (`tokenizer.apply_chat_template(..., tools=[...])`), is
made from the signature and the docstring: the docstring's first paragraph is the description, its Google-style
`Args:` lines describe the parameters, a parameter with a default is not required. Supported hints: str, int,
float, bool, list / list[X], dict / dict[str, X], Optional[X] / X | None, Literal[...]. The function returns a str
(shown as is) or anything json.dumps takes; it may be `async def`. Calls run in a sandbox (rollout/tool_sandbox.py):
no network, no writes outside a scratch directory, limits on time and memory.
"""

from __future__ import annotations

import inspect
import types
import typing
from dataclasses import dataclass

from posttrain.errors import PosttrainError
from posttrain.usercode import load_callable

_SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean"}
_JSON_TYPES = {"string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,), "array": (list,),
               "object": (dict,)}


@dataclass(frozen=True)
class ToolSource:
    name: str      # what the policy calls it: the function's name in the spec
    spec: str      # path/to/file.py:function as configured
    file: str
    sha256: str
    schema: dict   # {"type": "function", "function": {"name", "description", "parameters"}}


class _Unsupported(Exception):
    pass


def type_schema(hint) -> dict:
    """The JSON schema of one type hint; _Unsupported for any other."""
    if hint in _SCALARS:
        return {"type": _SCALARS[hint]}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is list or origin is list:
        return {"type": "array", **({"items": type_schema(args[0])} if args else {})}
    if hint is dict or origin is dict:
        if args and args[0] is not str:
            raise _Unsupported("JSON object keys are strings: use dict[str, X]")
        return {"type": "object", **({"additionalProperties": type_schema(args[1])} if args else {})}
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and len(args) == 2:
            return {**type_schema(rest[0]), "nullable": True}
        raise _Unsupported("only X | None (Optional[X]) unions are supported")
    if origin is typing.Literal:
        kinds = {type(a) for a in args}
        if len(kinds) != 1 or next(iter(kinds)) not in _SCALARS:
            raise _Unsupported("Literal values must all be of one type: str, int, float or bool")
        return {"type": _SCALARS[next(iter(kinds))], "enum": list(args)}
    raise _Unsupported("supported: str, int, float, bool, list[X], dict[str, X], X | None, Literal[...]")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """(description: the first paragraph on one line, {parameter: description} from a Google-style Args: section)."""
    lines = inspect.cleandoc(doc or "").splitlines()
    first: list[str] = []
    for line in lines:
        if not line.strip():
            break
        first.append(line.strip())
    params: dict[str, str] = {}
    in_args, indent, current = False, None, None
    for line in lines:
        stripped = line.strip()
        if stripped in ("Args:", "Arguments:", "Parameters:"):
            in_args, indent, current = True, None, None
            continue
        if not in_args or not stripped:
            continue
        depth = len(line) - len(line.lstrip())
        if depth == 0:  # the next section (Returns:, Raises:, ...)
            in_args = False
            continue
        indent = depth if indent is None else indent
        if depth == indent and ":" in stripped:
            head, text = stripped.split(":", 1)
            current = head.split("(")[0].strip()  # "name (int): ..." -> name
            params[current] = text.strip()
        elif current is not None:  # a continuation line
            params[current] = f"{params[current]} {stripped}".strip()
    return " ".join(first), params


def function_schema(fn, where: str) -> dict:
    """The OpenAI/HF tool schema of `fn`; PosttrainError naming `where` (field: file:function) when a parameter
    cannot be described."""
    if not inspect.isfunction(fn):
        raise PosttrainError(f"{where} is a {type(fn).__name__}, not a function",
                             hint="name a plain `def` (or `async def`) function whose parameters have type hints")
    try:
        hints = typing.get_type_hints(fn)
    except Exception as e:  # noqa: BLE001 — a hint naming something undefined
        raise PosttrainError(f"{where}: its type hints cannot be resolved ({type(e).__name__}: {e})") from None
    description, param_docs = parse_docstring(fn.__doc__)
    properties, required = {}, []
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            kind = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "positional-only ")
            raise PosttrainError(f"{where}: parameter {kind}{p.name} cannot be given by a tool call",
                                 hint="a tool takes named parameters only (the policy passes a JSON object)")
        if p.name not in hints:
            raise PosttrainError(f"{where}: parameter {p.name!r} has no type hint",
                                 hint=f"annotate it, e.g. `{p.name}: str`; the hints make the schema the policy sees")
        try:
            schema = type_schema(hints[p.name])
        except _Unsupported as e:
            raise PosttrainError(f"{where}: parameter {p.name!r} has an unsupported type hint {hints[p.name]!r}",
                                 hint=str(e)) from None
        if p.name in param_docs:
            schema["description"] = param_docs[p.name]
        properties[p.name] = schema
        if p.default is p.empty:
            required.append(p.name)
    return {"type": "function", "function": {"name": fn.__name__, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required}}}


def check_tools(specs: list[str], field: str = "rollout.tools") -> list[ToolSource]:
    """At start: loads every tool and makes its schema; the first that cannot be used raises PosttrainError naming
    `field`.<i>, the file and the function; so do two tools of one name."""
    tools: list[ToolSource] = []
    seen: dict[str, tuple[int, str]] = {}
    for i, spec in enumerate(specs):
        sym, fn = load_callable(spec, f"{field}.{i}")
        schema = function_schema(fn, f"{field}.{i}: {sym.file}:{sym.name}")
        schema["function"]["name"] = sym.name
        if sym.name in seen:
            j, other = seen[sym.name]
            raise PosttrainError(f"{field}.{i}: two tools are named {sym.name!r}: {other!r} ({field}.{j}) and {spec!r}",
                                 hint="the policy calls tools by name: rename one of the functions")
        seen[sym.name] = (i, spec)
        tools.append(ToolSource(sym.name, spec, str(sym.file), sym.sha256(), schema))
    return tools


def _json_type_ok(value, schema: dict) -> bool:
    if value is None:
        return bool(schema.get("nullable"))
    expected = _JSON_TYPES[schema["type"]]
    if isinstance(value, bool) and schema["type"] != "boolean":
        return False  # True is an int in Python, not in JSON
    if not isinstance(value, expected):
        return False
    if "enum" in schema and value not in schema["enum"]:
        return False
    if schema["type"] == "array" and "items" in schema:
        return all(_json_type_ok(v, schema["items"]) for v in value)
    if schema["type"] == "object" and "additionalProperties" in schema:
        return all(_json_type_ok(v, schema["additionalProperties"]) for v in value.values())
    return True


def _describe_schema(schema: dict) -> str:
    if "enum" in schema:
        return "one of " + ", ".join(map(repr, schema["enum"]))
    text = {"string": "a string", "integer": "an integer", "number": "a number", "boolean": "true or false",
            "array": "an array", "object": "an object"}[schema["type"]]
    if "items" in schema:
        text += f" of {_describe_schema(schema['items']).split(' ', 1)[1]}s"
    return text + (" or null" if schema.get("nullable") else "")


def check_arguments(schema: dict, arguments: dict) -> str | None:
    """Why `arguments` do not fit the tool's schema (missing, unexpected or mistyped), or None when they do."""
    params = schema["function"]["parameters"]
    missing = [k for k in params["required"] if k not in arguments]
    if missing:
        return "missing " + ", ".join(repr(k) for k in missing)
    unexpected = [k for k in arguments if k not in params["properties"]]
    if unexpected:
        return ("unexpected " + ", ".join(repr(k) for k in unexpected)
                + f" (it takes {', '.join(params['properties']) or 'no arguments'})")
    for k, v in arguments.items():
        if not _json_type_ok(v, params["properties"][k]):
            return f"{k!r} must be {_describe_schema(params['properties'][k])}, got {json_type(v)} {v!r}"[:300]
    return None


def json_type(value) -> str:
    for name, kinds in (("null", (type(None),)), ("boolean", (bool,)), ("integer", (int,)), ("number", (float,)),
                        ("string", (str,)), ("array", (list,)), ("object", (dict,))):
        if isinstance(value, kinds):
            return name
    return type(value).__name__
