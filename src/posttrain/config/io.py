"""Reading and checking run configs: the YAML file, dotted command-line overrides, one validation with errors that
name the key, the value and what is allowed, and the config reference table of the README. The sections themselves
are in config/sections.py; config/__init__.py re-exports both."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from posttrain.config.lora import FIELD as LORA_FIELD
from posttrain.config.sections import RunConfig
from posttrain.errors import PosttrainError


def _allowed_keys(model_cls: type[BaseModel]) -> list[str]:
    return sorted(model_cls.model_fields)


def _section_class(loc: tuple) -> type[BaseModel]:
    cls: type[BaseModel] = RunConfig
    for part in loc:
        field = cls.model_fields.get(str(part))
        ann = getattr(field, "annotation", None) if field else None
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            cls = ann
        else:
            break
    return cls


def _format_validation_error(err: ValidationError, source: str) -> str:
    lines = [f"invalid config ({source}):"]
    for e in err.errors():
        loc = tuple(e["loc"])
        key = ".".join(str(p) for p in loc) or "<root>"
        if e["type"] == "extra_forbidden":
            parent = _section_class(loc[:-1])
            allowed = _allowed_keys(parent)
            close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
            tip = f" (did you mean '{close[0]}'?)" if close else ""
            lines.append(f"  - unknown key '{key}'{tip}; allowed keys here: {', '.join(allowed)}")
        elif e["type"] == "literal_error":
            lines.append(f"  - {key}: got {e.get('input')!r}; {e['msg'].lower()}")
        elif e["type"] == "value_error":  # a LoRA section's message names itself by its place (model/rm.lora)
            msg = e["msg"].removeprefix("Value error, ").replace(LORA_FIELD, ".".join(str(p) for p in loc[:-1]))
            lines.append(f"  - {msg}")
        else:
            lines.append(f"  - {key}: got {e.get('input')!r}; {e['msg']}")
    return "\n".join(lines)


def parse_override(text: str) -> tuple[list[str], Any]:
    """'algorithm.kl_coef=0.02' -> (['algorithm', 'kl_coef'], 0.02). Values are read as YAML scalars/lists."""
    if "=" not in text:
        raise PosttrainError(
            f"override {text!r} is not of the form key.path=value", hint="e.g. algorithm.kl_coef=0.02"
        )
    key, raw = text.split("=", 1)
    if not key or any(not p for p in key.split(".")):
        raise PosttrainError(f"override {text!r} has an empty key", hint="e.g. algorithm.kl_coef=0.02")
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for text in overrides:
        path, value = parse_override(text)
        node = data
        for i, part in enumerate(path[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif not isinstance(child, dict):
                raise PosttrainError(
                    f"override {text!r}: '{'.'.join(path[: i + 1])}' is a value, not a section",
                )
            node = child
        node[path[-1]] = value
    return data


def read_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise PosttrainError(f"config file {p} does not exist", hint="pass the path of a YAML run config")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        raise PosttrainError(f"config file {p} is not valid YAML{where}: {problem}") from None
    if not isinstance(data, dict):
        raise PosttrainError(f"config file {p} must hold a mapping of sections at the top, got {type(data).__name__}")
    return data


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Reads the YAML (or the built-in defaults when path is None), applies overrides, validates once."""
    data = read_yaml(path) if path is not None else {}
    data = apply_overrides(data, list(overrides or []))
    return validate_config(data, source=str(path) if path else "built-in defaults")


def validate_config(data: dict[str, Any], source: str = "config") -> RunConfig:
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise PosttrainError(_format_validation_error(e, source)) from None


def dump_config(cfg: RunConfig) -> str:
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)


def config_reference_markdown() -> str:
    """A markdown table of every config key with its type, default and description (for the README)."""
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]

    def walk(cls: type[BaseModel], prefix: str) -> None:
        for name, field in cls.model_fields.items():
            ann = field.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                walk(ann, f"{prefix}{name}.")
                continue
            args = getattr(ann, "__args__", ())  # Optional[Section] only: list[Section] (reward.functions) stays a row
            optional_section = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)
                                and type(None) in args]
            if optional_section:  # a section that is off when absent (model.lora): its row, then its keys
                rows.append(f"| `{prefix}{name}` | section or None | `None` | {field.description or ''} |")
                walk(optional_section[0], f"{prefix}{name}.")
                continue
            default = field.get_default(call_default_factory=True)
            type_name = str(ann).replace("typing.", "").replace("<class '", "").replace("'>", "")
            desc = (field.description or "").replace("|", "\\|")
            rows.append(f"| `{prefix}{name}` | {type_name.replace('|', chr(92) + '|')} | `{default!r}` | {desc} |")

    walk(RunConfig, "")
    return "\n".join(rows)
