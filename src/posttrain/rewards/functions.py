"""Reward functions from user code (`reward.functions`), run isolated like the verifier.

Two forms, told apart by the parameter names (the first two of the signature, or the keywords it takes):
    batch       fn(prompts, completions, **columns) -> list[float | None]   (TRL's reward_funcs form)
    per-sample  fn(prompt, completion, **columns) -> float | None
The prompt is the row's string or its list of chat messages; with a chat prompt the completion is a list of
messages too, `[{"role": "assistant", "content": text}]`, exactly as TRL's GRPOTrainer passes conversational data
(rewards/chat_form.py), and with a string prompt a string. `columns` are the row's other fields: `answer`,
`completion_ids` (token ids) and `sample_ids` (batch form; per sample: `sample_id`), and every other column of
the dataset row (task.name: dataset), as a list per column in the batch form and a value per sample. They are
passed by keyword, and only those the function takes unless it has **kwargs, so `def f(completions, **kwargs)` works as in TRL. `async def` functions are awaited: a per-sample one
concurrently over the batch. None means "does not apply": the sample adds nothing from that source and is left out
of its mean.

Each function runs in its own child process of the reward worker (`child_process.ChildProcess`), all functions at once.
Limits per call, `reward.timeout_seconds`: one call is a batch function's whole batch, a synchronous per-sample
function's one sample, an async per-sample function's one sample (awaited with that timeout inside the child).
Failures are per sample, with reward.default, and their error text starts with the kind (`FAILURE_KINDS`)."""

from __future__ import annotations

import asyncio
import functools
import inspect
import math
import numbers
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from posttrain.errors import PosttrainError
from posttrain.rewards.chat_form import as_trl_completion
from posttrain.rewards.child_process import ChildProcess
from posttrain.usercode import load_callable

FAILURE_KINDS = ("import", "exception", "type", "length", "nan", "timeout")
BATCH_COLUMNS = ("answer", "completion_ids", "sample_ids")
SAMPLE_COLUMNS = ("answer", "completion_ids", "sample_id")
# Past the per-sample limits an async per-sample call enforces itself, before the parent kills its process.
ASYNC_GRACE_S = 5.0
FIRST_CALL_TIMEOUT_S = 120.0  # the child's first answer: importing the user's module (not ChildProcess's start)


@dataclass(frozen=True)
class Form:
    batch: bool                    # batch form (else per-sample)
    is_async: bool
    takes: frozenset[str] | None   # keywords it accepts; None = any (**kwargs)

    def keywords(self, args: dict) -> dict:
        return args if self.takes is None else {k: v for k, v in args.items() if k in self.takes}


def signature_form(fn, where: str, columns: Iterable[str] | None = ()) -> Form:
    """The form of `fn` from its signature; PosttrainError (naming `where`) when it fits neither. `columns`: the
    dataset's own columns, which a required parameter may name too; None = any name (checked before)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        raise PosttrainError(f"{where}: cannot read its signature") from None
    names = [p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    var_kw = any(p.kind == p.VAR_KEYWORD for p in params)
    batch = "completions" in names and "completion" not in names
    sample = "completion" in names and "completions" not in names
    known = {"prompts", "completions", *BATCH_COLUMNS} if batch else {"prompt", "completion", *SAMPLE_COLUMNS}
    known.update(columns or ())
    required = [p.name for p in params if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    positional_only = [p.name for p in params if p.kind == p.POSITIONAL_ONLY]
    unknown = [n for n in required if n not in known] if columns is not None else []
    if not (batch or sample) or unknown or positional_only:
        why = (f"required parameter(s) {unknown} are not columns it can be given" if unknown and (batch or sample)
               else f"positional-only parameter(s) {positional_only}" if positional_only and (batch or sample)
               else f"its parameters are ({', '.join(names) or 'none'})")
        raise PosttrainError(
            f"{where}: the signature fits neither reward-function form: {why}",
            hint="write fn(prompts, completions, **kwargs) -> list of float|None (one per completion) or "
            "fn(prompt, completion, **kwargs) -> float|None; columns: answer, completion_ids, sample_ids/sample_id"
            + (f", and the dataset's {', '.join(columns)}" if columns else ""),
        )
    return Form(batch, inspect.iscoroutinefunction(fn), None if var_kw else frozenset(names))


@dataclass(frozen=True)
class FunctionSource:
    name: str
    fn: str        # the spec, path/to/file.py:function or package.module:function
    file: str
    sha256: str
    form: str      # "batch" or "sample", with " async" when it is a coroutine function


def check_function(name: str, spec: str, field: str, columns: Iterable[str] = ()) -> FunctionSource:
    """Loads the function `spec` names and reads its form; PosttrainError naming `field`, the file and the symbol
    when it cannot be used. `columns`: the dataset's columns it may take besides the fixed ones."""
    sym, fn = load_callable(spec, field)
    form = signature_form(fn, f"{field}: {sym.file}:{sym.name}", columns)
    return FunctionSource(name, spec, str(sym.file), sym.sha256(),
                          ("batch" if form.batch else "sample") + (" async" if form.is_async else ""))


def check_functions(functions, columns: Iterable[str] = ()) -> dict[str, FunctionSource]:
    """At start, before any actor: every `reward.functions` entry checked (`check_function`) against the fixed
    columns and the dataset's `columns`, the first that cannot be used raising. Returns name -> its source (sha256
    included)."""
    return {f.name: check_function(f.name, f.fn, f"reward.functions.{i}.fn", columns)
            for i, f in enumerate(functions)}


def changed_sources(saved: dict, now: dict[str, FunctionSource]) -> list[str]:
    """What differs between the reward functions a checkpoint was trained with ({name: {fn, sha256, ...}}) and
    now, in words; [] when they are the same."""
    changes = [f"{n} was removed" for n in saved if n not in now]
    for n, src in now.items():
        old = saved.get(n)
        if old is None:
            changes.append(f"{n} is new")
        elif old.get("sha256") != src.sha256:
            changes.append(f"{n} ({src.file}) changed: sha256 {str(old.get('sha256'))[:12]} -> {src.sha256[:12]}")
    return changes


def check_resume(saved: dict, now: dict[str, FunctionSource], strict: bool, checkpoint, warn) -> None:
    """--resume: warns (`warn(text)`) when the reward functions differ from the checkpoint's, or refuses with
    PosttrainError under reward.strict_resume."""
    changes = changed_sources(saved, now)
    if not changes:
        return
    text = f"--resume: the reward functions differ from those checkpoint {checkpoint} was trained with: " \
           + "; ".join(changes)
    if strict:
        raise PosttrainError(text, hint="restore the functions' files, or set reward.strict_resume=false to go on "
                             "with the new definition (the reward's meaning changes mid-run)")
    warn(f"warning: {text} (the run goes on with the new definition; reward.strict_resume=true refuses)")


def record_sources(config_yaml: Path, sources: dict[str, FunctionSource]) -> None:
    """Appends the functions' files and sha256 to the run's config.yaml as comments (the file stays a config that
    loads as it is); the same go into state.json and summary.json under reward_functions."""
    if sources:
        lines = [f"# reward function {s.name}: {s.fn} ({s.form}) sha256 {s.sha256} of {s.file}"
                 for s in sources.values()]
        with open(config_yaml, "a") as f:
            f.write("\n".join(lines) + "\n")


# ---------------------------------------------------------------------------------------------- in the child


def check_value(value, name: str, step, sample_id: str) -> tuple[float | None, str | None]:
    """A returned score as (score, None), or (None, "<kind>: why") naming the function, the step and the sample."""
    if value is None:
        return None, None
    where = f"for sample {sample_id} at step {step}"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):  # numbers.Real: numpy scalars too
        return None, f"type: reward function {name!r} returned {type(value).__name__} {where}; expected a float or None"
    value = float(value)
    if not math.isfinite(value):
        return None, f"nan: reward function {name!r} returned {value} {where}"
    return float(value), None


def _failed(kind_why: str, n: int) -> list[tuple[None, str]]:
    return [(None, kind_why)] * n


def _call_rows(fn, form: Form, name: str, step, rows: list[dict], timeout_s: float) -> list[tuple]:
    """Runs `fn` on `rows` (dicts of prompt, completion, answer, completion_ids, sample_id, and columns: the dataset
    row's other columns) as its form wants; (score or None, error or None) per row."""
    ids = [r["sample_id"] for r in rows]
    names = list(dict.fromkeys(k for r in rows for k in r.get("columns") or {}))
    if form.batch:
        args = {**{k: [(r.get("columns") or {}).get(k) for r in rows] for k in names},
                "prompts": [r["prompt"] for r in rows],
                "completions": [as_trl_completion(r["prompt"], r["completion"]) for r in rows],
                "answer": [r["answer"] for r in rows], "completion_ids": [r["completion_ids"] for r in rows],
                "sample_ids": ids}
        call = functools.partial(fn, **form.keywords(args))
        try:
            values = asyncio.run(asyncio.wait_for(call(), timeout_s)) if form.is_async else call()
        except asyncio.TimeoutError:
            return _failed(f"timeout: reward function {name!r} ran longer than {timeout_s:g} s at step {step} "
                           f"(samples {ids[0]}..{ids[-1]})", len(rows))
        except Exception as e:  # noqa: BLE001 — user code may raise anything
            return _failed(f"exception: reward function {name!r} raised {type(e).__name__}: {e} at step {step} "
                           f"(samples {ids[0]}..{ids[-1]})", len(rows))
        if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
            return _failed(f"type: reward function {name!r} returned {type(values).__name__} at step {step} "
                           f"(samples {ids[0]}..{ids[-1]}); a batch function returns a list", len(rows))
        if len(values) != len(rows):
            return _failed(f"length: reward function {name!r} returned {len(values)} scores for the {len(rows)} "
                           f"samples {ids[0]}..{ids[-1]} at step {step}; a batch function returns one score (or None) "
                           "per completion", len(rows))
        return [check_value(v, name, step, sid) for v, sid in zip(values, ids)]

    def sample_args(r):
        return form.keywords({**{k: (r.get("columns") or {}).get(k) for k in names},
                              "prompt": r["prompt"], "completion": as_trl_completion(r["prompt"], r["completion"]),
                              "answer": r["answer"],
                              "completion_ids": r["completion_ids"], "sample_id": r["sample_id"]})

    def raised(e, sid):
        return None, f"exception: reward function {name!r} raised {type(e).__name__}: {e} for sample {sid} at step {step}"

    if not form.is_async:
        out = []
        for r in rows:
            try:
                out.append(check_value(fn(**sample_args(r)), name, step, r["sample_id"]))
            except Exception as e:  # noqa: BLE001
                out.append(raised(e, r["sample_id"]))
        return out

    async def one(r):
        try:
            return check_value(await asyncio.wait_for(fn(**sample_args(r)), timeout_s), name, step, r["sample_id"])
        except asyncio.TimeoutError:
            return None, (f"timeout: reward function {name!r} ran longer than {timeout_s:g} s for sample "
                          f"{r['sample_id']} at step {step}")
        except Exception as e:  # noqa: BLE001
            return raised(e, r["sample_id"])

    async def all_rows():
        return await asyncio.gather(*(one(r) for r in rows))

    return asyncio.run(all_rows())


def _function_handler(name: str, spec: str, field: str):
    """Child process: loads the function by its spec. The request "form" asks for its form ("batch", "sample",
    "... async"); any other is (step, rows, timeout_s). A load that fails now (the file changed since the start
    check) answers every request with import failures instead of leaving the child dead."""
    try:
        _, fn = load_callable(spec, field)
        form = signature_form(fn, field, columns=None)  # the dataset's columns were checked at start
    except PosttrainError as e:
        why = str(e).splitlines()[0]
        return lambda request: "batch" if request == "form" else _failed(
            f"import: reward function {name!r}: {why}", len(request[1]))

    def handle(request):
        if request == "form":
            return ("batch" if form.batch else "sample") + (" async" if form.is_async else "")
        step, rows, timeout_s = request
        return _call_rows(fn, form, name, step, rows, timeout_s)

    return handle


# ---------------------------------------------------------------------------------------------- in the reward worker


class FunctionScorers:
    """The reward worker's side: one child process per function, all called at once (one thread each, which only
    waits on its pipe). `functions`: the `reward.functions` entries."""

    def __init__(self, functions, timeout_s: float, default: float, field: str = "reward.functions"):
        self.timeout_s, self.default = timeout_s, default
        self.children = {f.name: ChildProcess(functools.partial(_function_handler, f.name, f.fn, f"{field}.{i}.fn"),
                                              f"posttrain-reward-{f.name}")
                         for i, f in enumerate(functions)}
        self._forms: dict[str, str] = {}
        self._pool = ThreadPoolExecutor(max(1, len(functions)), thread_name_prefix="reward-fn")

    def _form(self, name: str) -> str:
        if name not in self._forms:
            status, form = self.children[name].call("form", FIRST_CALL_TIMEOUT_S)
            self._forms[name] = form if status == "ok" else "batch"  # a dead child: fail the batch as one call
        return self._forms[name]

    def _score_one_function(self, name: str, step, rows: list[dict]) -> tuple[list, list]:
        form = self._form(name)
        if form == "sample":  # synchronous per-sample: one call per sample, so a hang costs that sample only
            requests = [([r], self.timeout_s) for r in rows]
        else:  # an async per-sample call enforces its per-sample limits itself: the parent waits a little longer
            requests = [(rows, self.timeout_s + (ASYNC_GRACE_S if form == "sample async" else 0.0))]
        scores, errors = [], []
        for part, limit in requests:
            status, value = self.children[name].call((step, part, self.timeout_s), limit)
            ids = [r["sample_id"] for r in part]
            where = f"sample {ids[0]}" if len(ids) == 1 else f"samples {ids[0]}..{ids[-1]}"
            if status == "timeout":
                value = _failed(f"timeout: reward function {name!r} ran longer than {limit:g} s at step {step} "
                                f"({where})", len(part))
            elif status == "died":
                value = _failed(f"exception: reward function {name!r}'s process died (exit code {value}) at step "
                                f"{step} ({where})", len(part))
            for s, e in value:
                scores.append(self.default if e is not None else s)
                errors.append(e)
        return scores, errors

    def score(self, rows: list[dict], step) -> dict[str, tuple[list, list]]:
        """rows: one dict per sample (prompt, completion, answer, completion_ids, sample_id) -> name -> (scores,
        errors): a score is a float, None (does not apply) or reward.default where the error says why it failed."""
        futures = {n: self._pool.submit(self._score_one_function, n, step, rows) for n in self.children}
        return {n: f.result() for n, f in futures.items()}

    def close(self) -> None:
        for c in self.children.values():
            c.close()
        self._pool.shutdown(wait=False)


def function_failure_counts(names: list[str], errors: list[dict]) -> dict[str, int]:
    """{"reward_failures/<name>/<kind>": count} for every function and kind (zeros included); `errors` holds one
    dict per sample, function name -> its error."""
    out = {f"reward_failures/{n}/{k}": 0 for n in names for k in FAILURE_KINDS}
    for per_sample in errors:
        for n, e in per_sample.items():
            key = f"reward_failures/{n}/{e.split(':', 1)[0]}"
            out[key] = out.get(key, 0) + 1
    return out
