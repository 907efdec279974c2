"""The one loader for user code: reward functions today, environments, tools and eval scorers next. A user names a
callable as `path/to/file.py:name` (a file, relative to the working directory) or `package.module:name` (an
importable module), and every error says which config field, which file and which symbol went wrong.

The driver calls `load` at start, before any Ray actor, so a typo fails in a second with exit 2; the child process
that later runs the code loads it again from the same spec (callables are not sent between processes)."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from posttrain.errors import PosttrainError

# Short names of built-in functions, usable wherever a spec is (`fn: math_answer`).
BUILTIN_SPECS = {"math_answer": "posttrain.rewards.math_answer:math_answer"}


@dataclass(frozen=True)
class UserSymbol:
    spec: str          # as written in the config
    field: str         # the config field that named it, e.g. reward.functions.0.fn
    file: Path         # the source file the symbol was loaded from
    name: str          # the attribute looked up in it
    obj: Any

    def sha256(self) -> str:
        """sha256 of the source file's bytes: recorded with the run so a changed definition is noticed on resume."""
        return file_sha256(self.file)


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def split_spec(spec: str, field: str) -> tuple[str, str]:
    """'dir/f.py:score' -> ('dir/f.py', 'score'); 'pkg.mod:score' -> ('pkg.mod', 'score')."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name.isidentifier():
        raise PosttrainError(
            f"{field}: {spec!r} does not name a symbol",
            hint="write path/to/file.py:function or package.module:function",
        )
    return where, name


def _import_file(path: Path, field: str, spec: str):
    if not path.is_file():
        raise PosttrainError(f"{field}: {spec!r}: the file {path} does not exist",
                             hint="give the path of a .py file (relative to where you run posttrain) before ':'")
    # One module name per file, so loading the same file twice (start check, then the child) behaves the same.
    mod_name = "posttrain_user_" + hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
    loader_spec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[mod_name] = module  # dataclasses and pickling look their module up here
    try:
        loader_spec.loader.exec_module(module)
    except BaseException as e:  # noqa: BLE001 — user code may raise anything, SystemExit included
        sys.modules.pop(mod_name, None)
        raise PosttrainError(f"{field}: importing {path} (for {spec!r}) raised {_describe(e, path)}",
                             hint=f"run `python {path}` to see the full traceback") from None
    return module


def _import_module(name: str, field: str, spec: str):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name and name.startswith(e.name):  # the module itself, not one it imports
            raise PosttrainError(f"{field}: {spec!r}: no module named {e.name!r}",
                                 hint="use path/to/file.py:function for a file, or install the package / add its "
                                 "directory to PYTHONPATH") from None
        raise PosttrainError(f"{field}: importing module {name} (for {spec!r}) raised "
                             f"ModuleNotFoundError: {e}") from None
    except BaseException as e:  # noqa: BLE001
        raise PosttrainError(f"{field}: importing module {name} (for {spec!r}) raised {_describe(e, None)}",
                             hint=f"run `python -c 'import {name}'` to see the full traceback") from None


def _describe(e: BaseException, path: Path | None) -> str:
    """'ValueError: bad (line 3)': the exception and the line of the user's file it came from."""
    line = None
    tb = e.__traceback__
    while tb is not None:
        if path is not None and Path(tb.tb_frame.f_code.co_filename) == path:
            line = tb.tb_lineno
        tb = tb.tb_next
    if isinstance(e, SyntaxError) and e.lineno:
        line = e.lineno
    return f"{type(e).__name__}: {e}" + (f" (line {line})" if line else "")


def load(spec: str, field: str) -> UserSymbol:
    """Imports the file or module `spec` names and returns its symbol; PosttrainError naming `field`, the file and
    the symbol when the file is missing, its import raises, or the symbol is absent. A short name of
    `BUILTIN_SPECS` stands for its full spec."""
    spec = BUILTIN_SPECS.get(spec, spec)
    where, name = split_spec(spec, field)
    if where.endswith(".py") or "/" in where or "\\" in where:
        path = Path(where)
        module = _import_file(path, field, spec)
    else:
        module = _import_module(where, field, spec)
        path = Path(getattr(module, "__file__", None) or where)
    if not hasattr(module, name):
        public = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise PosttrainError(f"{field}: {path} has no symbol {name!r} (for {spec!r})",
                             hint=f"callables it defines: {', '.join(public[:12]) or 'none'}")
    return UserSymbol(spec, field, path, name, getattr(module, name))


def load_callable(spec: str, field: str) -> tuple[UserSymbol, Callable]:
    sym = load(spec, field)
    if not callable(sym.obj):
        raise PosttrainError(f"{field}: {sym.file}:{sym.name} is a {type(sym.obj).__name__}, not a function")
    return sym, sym.obj
