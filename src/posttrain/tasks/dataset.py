"""A user dataset (`task.name: dataset`, or its older name `jsonl`): rows from a .jsonl, .parquet or .csv file or a
`save_to_disk` directory (tasks/dataset_files.py), scored by task.reward against the answer column.

Column mapping: `task.prompt_column` holds the prompt, a string or a chat-format list of {role, content} messages
(rendered with the tokenizer's chat template by PromptEncoder); `task.answer_column` the answer, needed only where
something compares with it (the verifier as a reward source, SFT). An optional `id` column names the row (else
"row<N>", N its line or row number). Every other column travels with the row as `Problem.columns` to reward
functions. `task.system_prompt` is put in front of every prompt as a system message.

The held-out split is a second file (`task.heldout_path`), a seeded fraction (`task.heldout_fraction`) or a seeded
`task.heldout_size` rows, and `data_report` counts the held-out prompts that also occur in the training data."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from posttrain.errors import PosttrainError
from posttrain.tasks.base import Problem, prompt_text, verifier_for
from posttrain.tasks.dataset_files import file_format, read_rows

if TYPE_CHECKING:
    from posttrain.config import TaskConfig

ROLES = ("system", "user", "assistant")
# Names reward functions are already given (rewards/functions.py): a dataset column may not take one of them.
RESERVED = frozenset({"prompt", "prompts", "completion", "completions", "answer", "completion_ids", "sample_id",
                      "sample_ids"})
OVERLAP_EXAMPLES = 10  # held-out ids listed in the report


@dataclass(frozen=True)
class ColumnMap:
    prompt: str = "prompt"
    answer: str = "answer"
    need_answer: bool = True        # a row without an answer is an error (else its answer is None)
    system_prompt: str | None = None


# ---------------------------------------------------------------- one row: pure


def check_prompt(value, where: str, column: str) -> str | list[dict]:
    """A prompt string, or a chat-format list of {role, content} messages (roles system, user, assistant; content
    a string); PosttrainError naming `where` (file and row), the column and the message otherwise."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list) or not value:
        raise PosttrainError(f"{where}: column {column!r} must be a string or a non-empty list of {{role, content}} "
                             f"messages, got {type(value).__name__}", hint="fix or drop that row")
    turns = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise PosttrainError(f"{where}: column {column!r}, message {i}: expected an object with 'role' and "
                                 f"'content', got {json.dumps(m, default=str)[:80]}", hint="fix or drop that row")
        if m["role"] not in ROLES:
            raise PosttrainError(f"{where}: column {column!r}, message {i}: unknown role {m['role']!r}",
                                 hint=f"roles are {', '.join(ROLES)}")
        if not isinstance(m["content"], str):
            raise PosttrainError(f"{where}: column {column!r}, message {i} ({m['role']}): content must be a string, "
                                 f"got {type(m['content']).__name__}",
                                 hint="put the message's text in 'content' (multimodal parts are not supported)")
        turns.append({"role": m["role"], "content": m["content"]})
    return turns


def with_system(prompt: str | list[dict], system: str | None) -> str | list[dict]:
    """`system` as a first system message; a chat prompt that starts with its own system message keeps it."""
    if system is None:
        return prompt
    turns = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    return turns if turns[0]["role"] == "system" else [{"role": "system", "content": system}, *turns]


def check_answer(value, where: str, cols: ColumnMap) -> str | None:
    if value is None:
        if cols.need_answer:
            raise PosttrainError(
                f"{where}: column {cols.answer!r} (task.answer_column) is absent",
                hint="the verifier (reward.weights.verifier) and SFT compare completions with it: add the column, "
                "name it with task.answer_column, or score with reward.functions only (reward.weights={verifier: 0})",
            )
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        raise PosttrainError(f"{where}: column {cols.answer!r} (task.answer_column) must be a string, got "
                             f"{type(value).__name__}", hint="store answers as text")
    return value


def row_problem(row, where: str, number: str, cols: ColumnMap, extra: list[str], id_prefix: str = "") -> Problem:
    """One row -> Problem; `extra`: the names of the columns that travel with it (a row lacking one gets None)."""
    if not isinstance(row, dict):
        raise PosttrainError(f"{where}: each row must be a JSON object with a {cols.prompt!r} column, got "
                             f"{type(row).__name__}")
    if row.get(cols.prompt) is None:
        raise PosttrainError(f"{where}: column {cols.prompt!r} (task.prompt_column) is absent; the row has "
                             f"{', '.join(map(repr, row)) or 'no columns'}",
                             hint="set task.prompt_column to the column that holds the prompts")
    prompt = with_system(check_prompt(row[cols.prompt], where, cols.prompt), cols.system_prompt)
    answer = check_answer(row.get(cols.answer), where, cols)
    columns = {k: row.get(k) for k in extra}
    for k, v in columns.items():
        try:
            json.dumps(v)
        except (TypeError, ValueError):
            raise PosttrainError(f"{where}: column {k!r} holds a {type(v).__name__}, which is not a JSON value",
                                 hint="reward functions get columns as JSON values: convert it (e.g. to a string) "
                                 "or drop the column") from None
    pid = row.get("id")
    return Problem(id=str(pid) if pid is not None else f"{id_prefix}row{number}", prompt=prompt, answer=answer,
                   columns=columns)


def extra_columns(rows: list[tuple[str, object]], cols: ColumnMap, where: str) -> list[str]:
    """The columns besides prompt, answer and id, in order of first appearance; a reserved name is an error."""
    names: dict[str, str] = {}
    for loc, row in rows:
        for k in row if isinstance(row, dict) else ():
            if k not in (cols.prompt, cols.answer, "id") and k not in names:
                names[k] = loc
    clash = [k for k in names if k in RESERVED]
    if clash:
        raise PosttrainError(f"{where}, {names[clash[0]]}: column {clash[0]!r} has a name reward functions are "
                             "already given", hint=f"rename or drop it (reserved: {', '.join(sorted(RESERVED))})")
    return list(names)


def read_problems(path: str | Path, field: str, cols: ColumnMap, id_prefix: str = "") -> list[Problem]:
    """Every row of the dataset at `path` as a Problem; errors name the file, the line/row and the column."""
    rows = list(read_rows(path, field))
    extra = extra_columns(rows, cols, str(path))
    return [row_problem(row, f"{path}, {loc}", loc.split()[-1], cols, extra, id_prefix) for loc, row in rows]


# ---------------------------------------------------------------- splits and the overlap report: pure


def seeded_split(rows: list[Problem], heldout: int, seed: int) -> tuple[list[Problem], list[Problem]]:
    """(train, held-out): `heldout` rows drawn with `seed`, both in file order."""
    order = list(range(len(rows)))
    random.Random(f"{seed}/jsonl-split").shuffle(order)  # the seed string of the jsonl task: same splits as before
    held = set(order[:heldout])
    return [r for i, r in enumerate(rows) if i not in held], [rows[i] for i in sorted(held)]


def normalised(prompt: str | list[dict]) -> str:
    """The prompt's text with every run of whitespace made one space, ends stripped (for the overlap count)."""
    return " ".join(prompt_text(prompt).split())


def heldout_overlap(train: Iterable[Problem], heldout: Iterable[Problem]) -> list[str]:
    """Ids of the held-out problems whose prompt, whitespace-normalised, is also a training prompt."""
    seen = {normalised(p.prompt) for p in train}
    return [p.id for p in heldout if normalised(p.prompt) in seen]


# ---------------------------------------------------------------- the task


class DatasetTask:
    name = "dataset"

    def __init__(self, cfg: "TaskConfig", seed: int = 0, need_answer: bool = True):
        self.verify = verifier_for(cfg.reward)
        cols = ColumnMap(cfg.prompt_column, cfg.answer_column, need_answer, cfg.system_prompt)
        rows = read_problems(cfg.path, "task.path", cols)
        if not rows:
            raise PosttrainError(f"{cfg.path}: the dataset is empty",
                                 hint=f"add rows with a {cfg.prompt_column!r} column")
        if cfg.heldout_path:
            self.train = rows
            self.heldout = read_problems(cfg.heldout_path, "task.heldout_path", cols, id_prefix="heldout-")
            if not self.heldout:
                raise PosttrainError(f"task.heldout_path: {cfg.heldout_path} holds no rows",
                                     hint="add held-out rows, or drop task.heldout_path to hold out "
                                     "task.heldout_size rows of task.path")
            source = f"task.heldout_path {cfg.heldout_path}"
        else:
            if cfg.heldout_fraction is not None:
                size = max(1, round(cfg.heldout_fraction * len(rows)))
                source = f"task.heldout_fraction={cfg.heldout_fraction:g}"
            else:
                size, source = cfg.heldout_size, f"task.heldout_size={cfg.heldout_size}"
            if len(rows) <= size:
                raise PosttrainError(f"{source} leaves no training rows in {cfg.path} ({len(rows)} rows)",
                                     hint=f"lower {source.split('=')[0]}")
            self.train, self.heldout = seeded_split(rows, size, seed)
        both = heldout_overlap(self.train, self.heldout)
        self.columns = list(dict.fromkeys(k for p in [rows[0], self.heldout[0]] for k in p.columns))
        self.report = {
            "path": str(cfg.path), "format": file_format(Path(cfg.path)), "heldout_from": source,
            "train_rows": len(self.train), "heldout_rows": len(self.heldout), "columns": self.columns,
            "heldout_in_train": len(both), "heldout_in_train_ids": both[:OVERLAP_EXAMPLES],
        }
        if both and cfg.strict_heldout:
            raise PosttrainError(overlap_message(self.report),
                                 hint="remove those prompts from one of the files, or set task.strict_heldout=false "
                                 "to go on with a warning")

    def score(self, problem: Problem, completion: str) -> float:
        if problem.answer is None:  # no answer column: the verifier has nothing to compare (not a reward source)
            return 0.0
        return self.verify(problem.answer, completion)


def record_report(task, run_dir: Path, log) -> None:
    """Writes a dataset task's report to run_dir/data_report.json and logs it (`log(text)`), with a warning when
    held-out prompts occur in the training data. Other tasks have no report: nothing happens."""
    report = getattr(task, "report", None)
    if report is None:
        return
    (Path(run_dir) / "data_report.json").write_text(json.dumps(report, indent=1) + "\n")
    log(f"data: {report['train_rows']} training and {report['heldout_rows']} held-out rows from {report['path']} "
        f"({report['format']}; held out by {report['heldout_from']}); columns for reward functions: "
        f"{', '.join(report['columns']) or 'none'}")
    if report["heldout_in_train"]:
        log(f"warning: {overlap_message(report)} (task.strict_heldout=true refuses)")


def overlap_message(report: dict) -> str:
    n = report["heldout_in_train"]
    return (f"task: {n} of {report['heldout_rows']} held-out prompts ({report['heldout_from']}) also occur in the "
            f"training data {report['path']} (exact text after whitespace normalisation), e.g. "
            f"{', '.join(report['heldout_in_train_ids'][:3])}; held-out scores overstate generalisation")
