"""The catalogue of bad inputs: each one, given to the real CLI (in-process through typer's CliRunner; a few as
real subprocesses), exits with code 2 and one message that names the field, file or row and says what to do —
never a traceback. Every case is caught before Ray starts, so the whole catalogue runs in seconds.

`python tests/test_bad_inputs.py > docs/errors.md` regenerates the table of cases and their messages."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import yaml
from typer.testing import CliRunner

from posttrain.cli import app

BIN = Path(sys.executable).parent
SMALL = ["task.train_size=200", "task.heldout_size=20", "logging.progress=false"]


@dataclass
class Case:
    id: str
    what: str                                   # the bad input, in words (the docs table's first column)
    args: Callable[[Path, str], list[str]]      # (tmp dir, a good model dir) -> CLI arguments
    expect: str                                 # a piece of the message that names the culprit


def _config(tmp: Path, text: str, name: str = "run.yaml") -> str:
    (tmp / name).write_text(text)
    return str(tmp / name)


def _good(tmp: Path, model: str, *extra: str) -> list[str]:
    """`train` with a valid config and model, plus the bad part in `extra`."""
    cfg = _config(tmp, yaml.safe_dump({"name": "bad", "runs_dir": str(tmp / "runs"), "model": {"path": model}}))
    return ["train", cfg, *SMALL, *extra]


def _dataset(tmp: Path, lines: list[str]) -> str:
    (tmp / "data.jsonl").write_text("".join(l + "\n" for l in lines))
    return str(tmp / "data.jsonl")


def _data_file(tmp: Path, name: str, text: str) -> str:
    (tmp / name).write_text(text)
    return str(tmp / name)


def _chat_rows(bad: dict) -> list[str]:
    """Two good chat-format rows, then one whose prompt holds the message `bad` (line 3)."""
    good = {"prompt": [{"role": "user", "content": "1+1="}], "answer": "2"}
    return [json.dumps(good), json.dumps(good),
            json.dumps({"prompt": [{"role": "system", "content": "add"}, bad], "answer": "2"})]


def _parquet(tmp: Path, rows: list[dict]) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), tmp / "data.parquet")
    return str(tmp / "data.parquet")


def _corrupt_dataset_dir(tmp: Path) -> str:
    """A save_to_disk directory whose state.json is not what this datasets version reads (here: cut short)."""
    import datasets

    datasets.Dataset.from_list([{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(8)]).save_to_disk(
        str(tmp / "ds"))
    state = tmp / "ds" / "state.json"
    state.write_text(state.read_text()[:40])
    return str(tmp / "ds")


def _dataset_task(tmp: Path, model: str, path: str, *extra: str) -> list[str]:
    return _good(tmp, model, "task.name=dataset", f"task.path={path}", "task.heldout_size=2", *extra)


def _rows(n: int) -> list[str]:
    return [json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) for i in range(n)]


def _model_variant(tmp: Path, model: str, change: Callable[[Path], None]) -> str:
    out = tmp / "model-variant"
    shutil.copytree(model, out)
    change(out)
    return str(out)


def _fake_rm(tmp: Path, model: str) -> str:
    """The tiny model with reward statistics beside it: passes the reward-model directory check."""
    return _model_variant(tmp, model, lambda d: (d / "posttrain_reward.json").write_text('{"mean": 0, "std": 1}'))


MULTITURN = Path(__file__).parent / "fixtures" / "multiturn"
_LISTENING: list = []  # sockets held open for the rest of the session: their ports are in use


def _taken_port() -> int:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    _LISTENING.append(s)
    return s.getsockname()[1]


def _chatml_without_tools(d: Path) -> None:
    """The model's tokenizer given a plain ChatML template, which never reads `tools`."""
    from posttrain.models.bpe import CHATML_TEMPLATE

    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = CHATML_TEMPLATE
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    (d / "chat_template.jinja").unlink(missing_ok=True)


def _unlink(*names: str) -> Callable[[Path], None]:
    return lambda d: [(d / n).unlink() for n in names]


def _shrink_vocab(d: Path) -> None:
    cfg = json.loads((d / "config.json").read_text())
    cfg["vocab_size"] = 8
    (d / "config.json").write_text(json.dumps(cfg))


def _swap_two_ids(d: Path) -> None:
    """The same vocabulary with the ids of '0' and '1' swapped: a tokenizer that is not the student's."""
    tok = json.loads((d / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    vocab["0"], vocab["1"] = vocab["1"], vocab["0"]
    (d / "tokenizer.json").write_text(json.dumps(tok))


def _as_bin(d: Path) -> None:
    (d / "model.safetensors").rename(d / "pytorch_model.bin")


def _reward_fn(tmp: Path, model: str, code: str | None, symbol: str = "score") -> list[str]:
    """`train` with one reward function from rewards.py in tmp (not written when `code` is None)."""
    if code is not None:
        (tmp / "rewards.py").write_text(code)
    return _good(tmp, model, f"reward.functions=[{{name: mine, fn: '{tmp / 'rewards.py'}:{symbol}'}}]")


def _eval_from_run(tmp: Path, model: str, change: Callable[[Path], None]) -> list[str]:
    """`eval --from-run` on a run directory as `train` leaves it (config.yaml, then the function's sha256), after
    `change` was done to the reward function's file."""
    from posttrain.config import dump_config, load_config
    from posttrain.rewards.functions import check_functions, record_sources

    (tmp / "rewards.py").write_text("def score(prompt, completion):\n    return 1.0\n")
    cfg = load_config(None, ["name=r", f"runs_dir={tmp / 'runs'}",
                             f"reward.functions=[{{name: mine, fn: '{tmp / 'rewards.py'}:score'}}]"])
    cfg.run_dir.mkdir(parents=True)
    (cfg.run_dir / "config.yaml").write_text(dump_config(cfg))
    record_sources(cfg.run_dir / "config.yaml", check_functions(cfg.reward.functions))
    change(tmp / "rewards.py")
    return ["eval", "--model", model, "--from-run", str(cfg.run_dir), "--out", str(tmp / "out")]


def _checkpoint(tmp: Path, model: str, fingerprint: str | None = None, corrupt: bool = False,
                extra: tuple[str, ...] = (), data: str | None = None, files: dict | None = None,
                rows: int | None = None) -> list[str]:
    """A run dir holding one checkpoint whose state.json carries `fingerprint` (default: the config's own), the
    data fingerprint `data` (none: a checkpoint from before data fingerprints) and row count `rows` (none: from
    before row counts), plus `files` (path -> text)."""
    from posttrain.config import load_config
    from posttrain import checkpoint as ckpt

    args = _good(tmp, model, *extra)
    cfg = load_config(args[1], [*SMALL, *extra])
    tmp_dir = ckpt.begin_checkpoint(cfg.run_dir / "checkpoints", 2)
    state = {"step": 2, "cursor": {"epoch": 0, "offset": 64}, "eval_history": [],
             "config_fingerprint": fingerprint or cfg.fingerprint(), "data_fingerprint": data, "data_rows": rows}
    (tmp_dir / "state.json").write_text(json.dumps(state))
    for rel, text in (files or {}).items():
        (tmp_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_dir / rel).write_text(text)
    final = ckpt.finalize_checkpoint(tmp_dir, 2)
    if corrupt:
        (final / "state.json").write_text(json.dumps({**state, "step": 3}))  # bytes no longer match the manifest
    return args


def _lora_checkpoint(tmp: Path, model: str, *extra: str, base_hash: str | None = None) -> list[str]:
    """A checkpoint of a LoRA run: its adapter's record of the base model (`base_hash`, default: `model`'s own)."""
    from posttrain.models.loading import model_content_hash
    from posttrain.models.lora import ADAPTER_DIR, BASE_RECORD

    record = {"model_path": model, "model_hash": base_hash or model_content_hash(model)}
    return _checkpoint(tmp, model, extra=extra, files={f"{ADAPTER_DIR}/{BASE_RECORD}": json.dumps(record)})


def _run_dir_with_checkpoint(tmp: Path, model: str) -> str:
    """A run directory as `train` leaves it: its config.yaml and a checkpoint of step 2."""
    config = Path(_checkpoint(tmp, model)[1])
    shutil.copy(config, tmp / "runs" / "bad" / "config.yaml")
    return str(tmp / "runs" / "bad")


def _checkpoint_then_edit_data(tmp: Path, model: str) -> list[str]:
    """A checkpoint of a jsonl run with the data's true fingerprint; then one row of the file changes."""
    from posttrain.config import load_config
    from posttrain.rollout.sampler import data_fingerprint
    from posttrain.tasks import load_task

    extra = ("task.name=jsonl", f"task.path={_dataset(tmp, _rows(40))}", "task.heldout_size=5")
    cfg = load_config(None, [*SMALL, *extra])
    args = _checkpoint(tmp, model, extra=extra, data=data_fingerprint(load_task(cfg.task, cfg.seed).train))
    _dataset(tmp, _rows(39) + [json.dumps({"prompt": "39+1=", "answer": "41"})])
    return args


def _checkpoint_then_add_rows(tmp: Path, model: str) -> list[str]:
    """A checkpoint of a jsonl run of 40 rows with the data's true fingerprint and row count; then 4 rows are added."""
    from posttrain.config import load_config
    from posttrain.rollout.sampler import data_fingerprint
    from posttrain.tasks import load_task

    extra = ("task.name=jsonl", f"task.path={_dataset(tmp, _rows(40))}", "task.heldout_size=5")
    cfg = load_config(None, [*SMALL, *extra])
    train = load_task(cfg.task, cfg.seed).train
    args = _checkpoint(tmp, model, extra=extra, data=data_fingerprint(train), rows=len(train))
    _dataset(tmp, _rows(44))
    return args


def _checkpoint_cut_off(tmp: Path, model: str) -> list[str]:
    """A run dir whose only checkpoint was cut off mid-write (a kill before its rename): a temp directory."""
    from posttrain import checkpoint as ckpt

    args = _checkpoint(tmp, model)
    final = ckpt.list_checkpoints(tmp / "runs" / "bad" / "checkpoints")[0]
    final.rename(final.parent / f".tmp-{final.name}-0123abcd")
    return args


CASES = [
    # --- the config file and overrides
    Case("yaml-syntax", "malformed YAML", lambda t, m: ["train", _config(t, "model:\n  path: [unclosed\n")],
         "is not valid YAML at line"),
    Case("yaml-not-mapping", "YAML whose top level is a list", lambda t, m: ["train", _config(t, "- a\n- b\n")],
         "must hold a mapping of sections"),
    Case("config-missing", "nonexistent config file", lambda t, m: ["train", str(t / "nope.yaml")],
         "nope.yaml does not exist"),
    Case("unknown-top-key", "unknown top-level key (typo)", lambda t, m: ["train", _config(t, "trian:\n  steps: 3\n")],
         "unknown key 'trian' (did you mean 'train'?)"),
    Case("unknown-nested-key", "unknown key in a section", lambda t, m: ["config", "show", "algorithm.klcoef=1"],
         "unknown key 'algorithm.klcoef' (did you mean 'kl_coef'?)"),
    Case("section-scalar", "a section given a scalar", lambda t, m: ["train", _config(t, "algorithm: 5\n")],
         "algorithm: got 5"),
    Case("wrong-type-override", "wrong type in an override", lambda t, m: ["config", "show", "rollout.num_workers=two"],
         "rollout.num_workers: got 'two'"),
    Case("wrong-type-yaml", "wrong type in the YAML", lambda t, m: ["train", _config(t, "train:\n  steps: many\n")],
         "train.steps: got 'many'"),
    Case("bad-choice", "a value outside a key's choices", lambda t, m: ["config", "show", "rollout.engine=tensorrt"],
         "rollout.engine: got 'tensorrt'"),
    Case("negative-steps", "negative train.steps", lambda t, m: ["config", "show", "train.steps=-1"],
         "train.steps: got -1; Input should be greater than or equal to 0"),
    Case("zero-prompts", "zero prompts per step", lambda t, m: ["config", "show", "algorithm.prompts_per_step=0"],
         "algorithm.prompts_per_step: got 0"),
    Case("negative-lr", "negative learning rate", lambda t, m: ["config", "show", "algorithm.lr=-0.001"],
         "algorithm.lr: got -0.001"),
    Case("top-p-above-1", "rollout.top_p above 1", lambda t, m: ["config", "show", "rollout.top_p=1.5"],
         "rollout.top_p: got 1.5"),
    Case("clip-eps-1", "clip range of 1 or more", lambda t, m: ["config", "show", "algorithm.clip_eps=1"],
         "algorithm.clip_eps: got 1"),
    Case("group-size-1", "group size 1 for GRPO", lambda t, m: ["config", "show", "algorithm.group_size=1"],
         "algorithm.group_size=1: grpo needs at least 2 completions per prompt"),
    Case("minibatches-divide", "minibatches that do not divide the batch",
         lambda t, m: ["config", "show", "algorithm.prompts_per_step=3", "algorithm.group_size=2", "algorithm.minibatches=4"],
         "algorithm.minibatches=4 does not divide prompts_per_step*group_size=6"),
    Case("failure-fraction", "reward.max_failure_fraction above 1",
         lambda t, m: ["config", "show", "reward.max_failure_fraction=1.5"], "reward.max_failure_fraction: got 1.5"),
    Case("rm-path-missing", "reward.rm_path that does not exist",
         lambda t, m: _good(t, m, "reward.weights={rm: 1.0}", f"reward.rm_path={t / 'no-rm'}"),
         "reward.rm_path: reward-model directory"),
    Case("rm-path-not-rm", "reward.rm_path that is a policy, not a reward model",
         lambda t, m: _good(t, m, "reward.weights={rm: 1.0}", f"reward.rm_path={m}"),
         "has no posttrain_reward.json (reward mean/std), so it is not a reward model"),
    Case("rm-ensemble-member-missing", "a reward.rm_ensemble member that does not exist",
         lambda t, m: _good(t, m, "reward.weights={rm: 1.0}", f"reward.rm_path={_fake_rm(t, m)}",
                            f"reward.rm_ensemble=[{t / 'rm2'}]"),
         "reward.rm_ensemble.0: reward-model directory"),
    Case("rm-ensemble-without-rm", "reward.rm_ensemble without an rm weight",
         lambda t, m: ["config", "show", f"reward.rm_ensemble=[{t}]"], "reward.rm_ensemble is set but reward.weights"),
    Case("rm-disagreement-one-rm", "the rm_disagreement alarm with a single reward model",
         lambda t, m: _good(t, m, "alarms.rules=[{kind: rm_disagreement}]"),
         "alarms.rules: rm_disagreement needs two or more reward models"),
    Case("grace-zero", "checkpoint.grace_seconds of 0", lambda t, m: ["config", "show", "checkpoint.grace_seconds=0"],
         "checkpoint.grace_seconds: got 0"),
    Case("override-no-equals", "override without '='", lambda t, m: ["train", _config(t, "seed: 1\n"), "train.steps"],
         "override 'train.steps' is not of the form key.path=value"),
    Case("override-empty-key", "override with an empty key part", lambda t, m: ["config", "show", "train..steps=3"],
         "override 'train..steps=3' has an empty key"),
    Case("override-into-value", "override below a plain value", lambda t, m: ["config", "show", _config(t, "seed: 1\n"), "seed.x=1"],
         "override 'seed.x=1': 'seed' is a value, not a section"),
    # --- the model directory
    Case("model-missing", "missing model directory", lambda t, m: _good(t, str(t / "no-model")),
         "model.path: model directory"),
    Case("model-no-config", "model dir without config.json",
         lambda t, m: _good(t, _model_variant(t, m, _unlink("config.json"))), "has no config.json"),
    Case("model-no-weights", "model dir with PyTorch .bin weights only",
         lambda t, m: _good(t, _model_variant(t, m, _as_bin)), "convert them to safetensors"),
    Case("model-no-tokenizer", "model dir without a tokenizer",
         lambda t, m: _good(t, _model_variant(t, m, _unlink("tokenizer.json", "tokenizer_config.json"))),
         "has no tokenizer"),
    Case("vocab-mismatch", "tokenizer larger than the model's vocabulary",
         lambda t, m: _good(t, _model_variant(t, m, _shrink_vocab)), "the model's vocab_size is 8"),
    Case("teacher-tokenizer-differs", "an opd teacher whose tokenizer differs from the student's",
         lambda t, m: _good(t, m, "algorithm.name=opd", f"distill.teacher={_model_variant(t, m, _swap_two_ids)}"),
         "distill.teacher: the tokenizer in"),
    # --- the dataset / task
    Case("task-unknown", "unknown task name", lambda t, m: _good(t, m, "task.name=chess"), "task.name: unknown task 'chess'"),
    Case("jsonl-no-path", "jsonl task without a path", lambda t, m: _good(t, m, "task.name=jsonl"),
         "task.name is 'jsonl' but task.path is not set"),
    Case("dataset-missing", "dataset file missing",
         lambda t, m: _good(t, m, "task.name=jsonl", f"task.path={t / 'none.jsonl'}"), "none.jsonl does not exist"),
    Case("dataset-empty", "empty dataset",
         lambda t, m: _good(t, m, "task.name=jsonl", f"task.path={_dataset(t, [])}"), "the dataset is empty"),
    Case("row-missing-field", "dataset row missing a field (row number)",
         lambda t, m: _good(t, m, "task.name=jsonl", f"task.path={_dataset(t, _rows(3) + [json.dumps({'prompt': 'x'})])}"),
         "data.jsonl, line 4: column 'answer' (task.answer_column) is absent"),
    Case("row-bad-json", "dataset row that is not JSON",
         lambda t, m: _good(t, m, "task.name=jsonl", f"task.path={_dataset(t, _rows(2) + ['{oops'])}"),
         "data.jsonl, line 3: not valid JSON"),
    Case("row-not-object", "dataset row that is not an object",
         lambda t, m: _good(t, m, "task.name=jsonl", f"task.path={_dataset(t, ['[1, 2]'])}"),
         "data.jsonl, line 1: each row must be a JSON object"),
    Case("dataset-column-absent", "a dataset column named in the config that is absent (row and column)",
         lambda t, m: _dataset_task(t, m, _parquet(t, [{"q": f"{i}+1=", "answer": str(i + 1)} for i in range(8)]),
                                    "task.prompt_column=question"),
         "data.parquet, row 1: column 'question' (task.prompt_column) is absent; the row has 'q', 'answer'"),
    Case("chat-unknown-role", "a chat-format row with an unknown role",
         lambda t, m: _dataset_task(t, m, _dataset(t, _chat_rows({"role": "robot", "content": "hi"}))),
         "data.jsonl, line 3: column 'prompt', message 1: unknown role 'robot'"),
    Case("chat-content-not-string", "a chat-format row whose content is not a string",
         lambda t, m: _dataset_task(t, m, _dataset(t, _chat_rows({"role": "user", "content": ["1+1="]}))),
         "data.jsonl, line 3: column 'prompt', message 1 (user): content must be a string, got list"),
    Case("csv-ragged", "a .csv with a ragged row",
         lambda t, m: _dataset_task(t, m, _data_file(t, "data.csv", "prompt,answer\n1+1=,2\n2+2=,4\n3+3=\n4+4=,8\n")),
         "data.csv, line 4: ragged row, 1 value(s) for the 2 columns of the header: no value for column(s) 'answer'"),
    Case("heldout-file-empty", "an empty held-out file",
         lambda t, m: _dataset_task(t, m, _dataset(t, _rows(8)), f"task.heldout_path={_data_file(t, 'held.jsonl', '')}"),
         "held.jsonl holds no rows"),
    Case("dataset-dir-unreadable", "a save_to_disk directory that cannot be read (corrupt state.json)",
         lambda t, m: _dataset_task(t, m, _corrupt_dataset_dir(t)),
         "/ds: datasets.load_from_disk cannot read this directory (JSONDecodeError"),
    Case("heldout-overlap-strict", "held-out prompts that occur in the training data, with task.strict_heldout",
         lambda t, m: _dataset_task(t, m, _dataset(t, _rows(8)), "task.strict_heldout=true",
                                    f"task.heldout_path={_data_file(t, 'held.jsonl', chr(10).join(_rows(3)))}"),
         "task: 3 of 3 held-out prompts (task.heldout_path"),
    Case("heldout-path-and-fraction", "both a held-out file and a held-out fraction",
         lambda t, m: ["config", "show", "task.name=dataset", "task.heldout_path=h.jsonl", "task.heldout_fraction=0.1"],
         "task.heldout_path and task.heldout_fraction are both set"),
    Case("stop-at-accuracy-without-evals", "a target accuracy with no periodic held-out eval to check it",
         lambda t, m: ["config", "show", "eval.every=0", "eval.stop_at_accuracy=0.8"],
         "eval.stop_at_accuracy=0.8 needs periodic held-out evals: set eval.every"),
    Case("heldout-too-big", "held-out split as large as the dataset",
         lambda t, m: _good(t, m, "task.name=jsonl", f"task.path={_dataset(t, _rows(5))}", "task.heldout_size=5"),
         "task.heldout_size=5 leaves no training rows"),
    Case("task-too-small", "more problems asked than the task has",
         lambda t, m: _good(t, m, "task.max_digits=2", "task.train_size=9000"), "task addition: could only draw"),
    Case("prompt-too-long", "prompts longer than the engine's max length",
         lambda t, m: _good(t, m, "rollout.vllm.max_model_len=10"),
         "rollout.vllm.max_model_len=10 is shorter than the longest prompt"),
    # --- reward functions from user code
    Case("reward-fn-missing-file", "reward function whose file does not exist",
         lambda t, m: _reward_fn(t, m, None), "reward.functions.0.fn:"),
    Case("reward-fn-import-raises", "reward function module that raises on import",
         lambda t, m: _reward_fn(t, m, "import os\nURL = os.environ['SCORER_URL']\n"),
         "raised KeyError: 'SCORER_URL' (line 2)"),
    Case("reward-fn-missing-symbol", "reward function name absent from its module",
         lambda t, m: _reward_fn(t, m, "def scor(prompt, completion):\n    return 1.0\n"),
         "has no symbol 'score'"),
    Case("reward-fn-signature", "reward function whose signature fits neither form",
         lambda t, m: _reward_fn(t, m, "def score(text, gold):\n    return 1.0\n"),
         "the signature fits neither reward-function form: its parameters are (text, gold)"),
    # --- the run directory and resume
    Case("run-dir-unwritable", "unwritable run directory", lambda t, m: _good(t, m, "runs_dir=/proc/posttrain"),
         "runs_dir: cannot write to /proc/posttrain"),
    Case("run-dir-is-file", "runs_dir that is a file",
         lambda t, m: _good(t, m, f"runs_dir={_config(t, 'x', 'a-file')}"), "runs_dir: cannot write to"),
    Case("checkpoints-exist", "a run with checkpoints started without --resume",
         lambda t, m: _checkpoint(t, m), "already holds checkpoints"),
    Case("resume-nothing", "--resume with no checkpoint", lambda t, m: [*_good(t, m), "--resume"],
         "--resume: no valid checkpoint under"),
    Case("resume-corrupt", "--resume when the only checkpoint is corrupt",
         lambda t, m: [*_checkpoint(t, m, corrupt=True), "--resume"], "--resume: no valid checkpoint under"),
    Case("resume-incompatible", "--resume with an incompatible config",
         lambda t, m: [*_checkpoint(t, m, fingerprint="0123456789abcdef"), "--resume"],
         "--resume: the config's model/task/algorithm/seed differ from the checkpoint"),
    Case("resume-data-changed", "--resume after the dataset file changed (here: one row edited)",
         lambda t, m: [*_checkpoint_then_edit_data(t, m), "--resume"], "--resume: the training data of task.path"),
    Case("resume-data-rows-added", "--resume after rows were added to the dataset file (40 -> 44 rows, 5 held out)",
         lambda t, m: [*_checkpoint_then_add_rows(t, m), "--resume"], "; training rows 35 -> 39)"),
    Case("allow-data-change-alone", "`--allow-data-change` without `--resume`",
         lambda t, m: [*_good(t, m), "--allow-data-change"], "--allow-data-change applies only to a resume"),
    Case("resume-checkpoint-cut-off", "--resume when the only checkpoint was cut off mid-write (a temp directory)",
         lambda t, m: [*_checkpoint_cut_off(t, m), "--resume"], "--resume: no valid checkpoint under"),
    Case("tiny-size", "unknown tiny model size", lambda t, m: ["model", "tiny", str(t / "m"), "--size", "7b"],
         "--size: unknown size '7b'"),
    Case("from-run-not-a-run", "`eval --from-run` on a directory that is not a run",
         lambda t, m: ["eval", "--model", m, "--from-run", str(t), "--out", str(t / "out")],
         "not a run directory (no config.yaml in it)"),
    Case("from-run-fn-gone", "`eval --from-run` when the run's reward function file is gone",
         lambda t, m: _eval_from_run(t, m, Path.unlink),
         "the run's reward function 'mine' cannot be loaded (the run recorded sha256"),
    Case("from-run-fn-changed", "`eval --from-run` when the run's reward function file changed since the run",
         lambda t, m: _eval_from_run(t, m, lambda f: f.write_text(f.read_text() + "# edited\n")),
         "rewards.py) changed since the run: sha256"),
    Case("notify-url-scheme", "`ops.notify` webhook URL that is not http(s)",
         lambda t, m: _good(t, m, "ops.notify=[{url: ftp://example.com/hook}]"), "ops.notify.0.url"),
    Case("notify-unknown-event", "`ops.notify` event name that does not exist",
         lambda t, m: _good(t, m, "ops.notify=[{url: http://127.0.0.1:9/, events: [run_finishd]}]"),
         "run_finishd"),
    Case("workers-range-min-over-max", "`rollout.num_workers` range with MIN greater than MAX",
         lambda t, m: _good(t, m, "rollout.num_workers=3..1"), "MIN 3 is greater than MAX 1"),
    Case("workers-range-min-zero", "`rollout.num_workers` range with MIN 0",
         lambda t, m: _good(t, m, "rollout.num_workers=0..2"), "MIN must be at least 1"),
    Case("workers-range-one-step-off", "`rollout.num_workers` range with `rollout.async_one_step_off: true`",
         lambda t, m: _good(t, m, "rollout.num_workers=1..3", "rollout.async_one_step_off=true"),
         "does not combine with rollout.async_one_step_off=true"),
    Case("max-staleness-negative", "`rollout.max_staleness` below 0",
         lambda t, m: _good(t, m, "rollout.max_staleness=-1"), "rollout.max_staleness: got -1"),
    Case("correction-cap", "`algorithm.rollout_correction.cap` of 1 or less",
         lambda t, m: _good(t, m, "algorithm.rollout_correction.mode=tis", "algorithm.rollout_correction.cap=1"),
         "algorithm.rollout_correction.cap=1.0 must be greater than 1"),
    Case("correction-with-dpo", "`algorithm.rollout_correction` (MIS) with `algorithm.name: dpo` (offline)",
         lambda t, m: _good(t, m, "algorithm.name=dpo", "algorithm.rollout_correction.mode=mis"),
         "algorithm.rollout_correction.mode=mis with algorithm.name=dpo"),
    Case("partial-rollouts-synchronous", "`rollout.partial_rollouts: true` with a synchronous rollout "
         "(`rollout.max_staleness: 0`)", lambda t, m: _good(t, m, "rollout.partial_rollouts=true"),
         "rollout.partial_rollouts=true needs asynchronous rollout, but rollout.max_staleness=0"),
    Case("partial-rollouts-hf", "`rollout.partial_rollouts: true` with `rollout.engine: hf`",
         lambda t, m: _good(t, m, "rollout.partial_rollouts=true", "rollout.max_staleness=1", "rollout.engine=hf"),
         "rollout.partial_rollouts=true does not combine with rollout.engine=hf"),
    Case("partial-rollouts-multi-turn", "`rollout.partial_rollouts: true` with multi-turn episodes "
         "(`rollout.environment` or `rollout.tools`)",
         lambda t, m: _good(t, m, "rollout.partial_rollouts=true", "rollout.max_staleness=1",
                            f"rollout.environment={t / 'env.py'}:Env"),
         "rollout.partial_rollouts=true does not combine with multi-turn or agent episodes"),
    Case("hang-factor", "`ops.hang_factor` of 1 or less",
         lambda t, m: _good(t, m, "ops.hang_factor=1"), "ops.hang_factor=1.0: must be > 1"),
    Case("review-prompts-missing", "`review new` with a prompts file that does not exist",
         lambda t, m: ["review", "new", "--a", m, "--b", m, "--prompts", str(t / "nope.jsonl"), "--db",
                       str(t / "r.db")], "nope.jsonl"),
    Case("review-n-zero", "`review new --n 0`",
         lambda t, m: ["review", "new", "--a", m, "--b", m, "--prompts", "addition", "--n", "0", "--db",
                       str(t / "r.db")], "--n"),
    Case("review-no-db", "`review results` with no review database at --db",
         lambda t, m: ["review", "results", "demo", "--db", str(t / "none.db")], "no review database here"),
    Case("review-unknown-session", "`review results` of a session that does not exist",
         lambda t, m: ["review", "results", "nope", "--db", _review_db(t)], "unknown review session 'nope'"),
    # --- posttrain cost --runs (the on-call line from measured interruptions)
    Case("cost-runs-not-a-run", "`cost --runs` on a directory that is not a run",
         lambda t, m: ["cost", "--runs", str(t), "--out", str(t / "out")], "not a run directory (no config.yaml in it)"),
    Case("cost-runs-no-steps", "`cost --runs` on a run that trained no step (no device-hours to measure against)",
         lambda t, m: ["cost", "--runs", _run_without_steps(t), "--out", str(t / "out")],
         "no step times in metrics.jsonl"),
    Case("cost-response-hours", "`cost --response-hours` that is not WORKING,OFF",
         lambda t, m: ["cost", "--response-hours", "8", "--out", str(t / "out")], "--response-hours '8': give WORKING,OFF"),
    # multi-turn episodes (docs/multi-turn.md): caught at start, before Ray
    Case("env-missing-method", "an environment class without a step method",
         lambda t, m: _good(t, m, f"rollout.environment={MULTITURN / 'envs.py'}:NoStep"), "NoStep has no step method"),
    Case("env-not-class", "an environment that is a function, not a class",
         lambda t, m: _good(t, m, f"rollout.environment={MULTITURN / 'envs.py'}:not_a_class"),
         "not_a_class is a function, not a class"),
    Case("gym-env-wrong-step", "a gymnasium.Env subclass whose step has posttrain's signature, not step(action)",
         lambda t, m: _good(t, m, f"rollout.environment={MULTITURN / 'gym_envs.py'}:PosttrainStyleStep"),
         "PosttrainStyleStep.step(state, assistant_message) cannot be called as step(action)"),
    # agents (docs/agents.md): caught at start, before Ray
    Case("agent-not-found", "an agent command whose program is not found",
         lambda t, m: _good(t, m, "rollout.agent={command: no-such-agent-xyz --episode}"),
         "'no-such-agent-xyz' is not found on PATH"),
    Case("agent-port-in-use", "an agent endpoint port that another process listens on",
         lambda t, m: _good(t, _model_variant(t, m, _chatml_without_tools),
                            f"rollout.agent={{command: 'bash agent.sh', port: {_taken_port()}}}"),
         "cannot listen"),
    # verifiers environments (docs/verifiers.md)
    Case("verifiers-python-without-it", "`verifiers export` with a Python that has no verifiers installed",
         lambda t, m: ["verifiers", "export", "--python", sys.executable, "--taskset", "sum_env", "--out",
                       str(t / "vf")],
         "No module named 'verifiers'"),
    Case("tool-no-hints", "a tool whose parameter has no type hint",
         lambda t, m: _good(t, m, f"rollout.tools=[{MULTITURN / 'bad_tools.py'}:no_hints]"),
         "parameter 'query' has no type hint"),
    Case("tool-name-clash", "two tools with the same name",
         lambda t, m: _good(t, m, f"rollout.tools=[{MULTITURN / 'calc_tools.py'}:calculate, "
                                  f"{MULTITURN / 'clash_tools.py'}:calculate]"),
         "two tools are named 'calculate'"),
    Case("max-turns-zero", "rollout.max_turns 0", lambda t, m: ["config", "show", "rollout.max_turns=0"],
         "rollout.max_turns=0: an episode needs at least one assistant turn"),
    Case("tools-no-template", "tools with a model that has no chat template",
         lambda t, m: _good(t, m, f"rollout.tools=[{MULTITURN / 'calc_tools.py'}:calculate]"),
         "multi-turn episodes need a chat template"),
    Case("tools-template-without-tools", "tools with a chat template that never reads `tools`",
         lambda t, m: _good(t, _model_variant(t, m, _chatml_without_tools),
                            f"rollout.tools=[{MULTITURN / 'calc_tools.py'}:calculate]"),
         "has no tool support"),
    # LoRA (model.lora): caught at start, before Ray
    Case("lora-targets-none", "`model.lora.target_modules` naming no linear layer of the model",
         lambda t, m: _good(t, m, "model.lora.target_modules=[query, value]"),
         "names no linear layer of the model in"),
    Case("lora-rank-zero", "`model.lora.r` 0", lambda t, m: ["config", "show", "model.lora.r=0"],
         "model.lora.r=0: the LoRA rank must be at least 1"),
    Case("lora-sync-adapter-hf", "`model.lora.sync: adapter` with the transformers engine (`rollout.engine: hf`)",
         lambda t, m: _good(t, m, "model.lora.sync=adapter", "rollout.engine=hf"),
         "model.lora.sync=adapter with rollout.engine=hf: only vLLM serves adapters"),
    Case("lora-sync-adapter-rank", "`model.lora.sync: adapter` with a rank above vLLM's largest (512)",
         lambda t, m: _good(t, m, "model.lora.sync=adapter", "model.lora.r=1024"),
         "vLLM serves LoRA ranks up to 512"),
    Case("lora-sync-adapter-head", "`model.lora.sync: adapter` adapting the LM head of a Qwen2 model (vLLM cannot)",
         lambda t, m: _good(t, m, "model.lora.sync=adapter", "model.lora.target_modules=[q_proj, lm_head]"),
         "vLLM's LoRA cannot serve an adapter on the LM head (lm_head) of Qwen2ForCausalLM"),
    Case("rm-lora-rank-zero", "`rm.lora.r` 0 (the message names rm.lora)", lambda t, m: ["config", "show", "rm.lora.r=0"],
         "rm.lora.r=0: the LoRA rank must be at least 1"),
    Case("resume-full-with-lora", "--resume of a full-weight checkpoint with `model.lora` set",
         lambda t, m: [*_checkpoint(t, m), "model.lora.r=8", "--resume"], "holds full weights"),
    Case("resume-lora-without-lora", "--resume of a LoRA checkpoint without `model.lora`",
         lambda t, m: [*_lora_checkpoint(t, m, "model.lora.r=8")[:-1], "--resume"],
         "holds a LoRA adapter, but the config has no model.lora"),
    Case("resume-lora-other-base", "--resume of a LoRA checkpoint whose base model differs from `model.path`",
         lambda t, m: [*_lora_checkpoint(t, m, "model.lora.r=8", base_hash="0" * 64), "--resume"],
         "holds different weights (content sha256 differs)"),
    Case("export-not-a-run", "`export` of a directory that is not a run",
         lambda t, m: ["export", str(t), "--merge", str(t / "out")], "not a run directory (no config.yaml in it)"),
    Case("export-no-step", "`export --step N` when the run has no checkpoint of step N",
         lambda t, m: ["export", _run_dir_with_checkpoint(t, m), "--step", "7", "--merge", str(t / "out")],
         "--step 7: the run"),
]


def _run_without_steps(tmp: Path) -> str:
    """A run directory as `train` leaves it when it stops before its first step: config.yaml, no step metrics."""
    _config(tmp, "name: r\n", "config.yaml")
    _data_file(tmp, "metrics.jsonl", "")
    return str(tmp)


def _review_db(tmp: Path) -> str:
    """A review database holding one session, "demo"."""
    from posttrain.review.store import NewItem, ReviewStore

    store = ReviewStore(tmp / "r.db", create=True)
    store.create_session("demo", "a", "b", "test", [NewItem("i0", "1+1=", "2", "3", "test")])
    return str(tmp / "r.db")


@pytest.fixture(scope="module")
def runner():
    return CliRunner()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_clear_message(case, tmp_path, tiny_model_dir, runner):
    result = runner.invoke(app, case.args(tmp_path, tiny_model_dir))
    text = result.output
    assert result.exit_code == 2, f"exit {result.exit_code}: {text[-2000:]} {result.exception!r}"
    assert isinstance(result.exception, SystemExit)  # not an escaped exception
    assert case.expect in " ".join(text.split()), text
    assert "Traceback" not in text
    assert text.count("error:") == 1, text  # one message (a warning may precede it, e.g. a skipped checkpoint)


DATASET_CASES = ["row-missing-field", "dataset-column-absent", "chat-unknown-role", "chat-content-not-string",
                 "csv-ragged", "heldout-file-empty", "dataset-dir-unreadable", "heldout-overlap-strict"]


@pytest.mark.parametrize("case_id", DATASET_CASES)
def test_a_bad_dataset_is_refused_before_anything_is_written(case_id, tmp_path, tiny_model_dir, runner):
    case = next(c for c in CASES if c.id == case_id)
    result = runner.invoke(app, case.args(tmp_path, tiny_model_dir))
    assert result.exit_code == 2 and not (tmp_path / "runs").exists(), result.output


def test_every_case_has_its_own_id():
    assert len(CASES) >= 30 and len({c.id for c in CASES}) == len(CASES)


def _tmpfs(size: str):
    mnt = Path(tempfile.mkdtemp(prefix="posttrain-tmpfs-"))
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        mnt.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    return mnt


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tiny tmpfs needs root")
def test_disk_full_is_refused_before_the_run_starts(tmp_path, tiny_model_dir, runner):
    """A 1 MiB disk: the config and a metrics line fit, a checkpoint of the 1m model (~10 MiB) never will."""
    mnt = _tmpfs("1m")
    try:
        result = runner.invoke(app, _good(tmp_path, tiny_model_dir, f"runs_dir={mnt}"))
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
        mnt.rmdir()
    assert result.exit_code == 2, result.output
    assert f"runs_dir: {mnt}/bad has" in result.output and "MiB free" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("case_id", ["yaml-syntax", "row-missing-field", "vocab-mismatch"])
def test_a_real_subprocess_prints_the_same_one_message(case_id, tmp_path, tiny_model_dir):
    case = next(c for c in CASES if c.id == case_id)
    r = subprocess.run([str(BIN / "posttrain"), *case.args(tmp_path, tiny_model_dir)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and case.expect in " ".join(r.stderr.split()), r.stderr
    assert "Traceback" not in r.stdout + r.stderr


def test_the_docs_table_lists_every_case_in_order():
    """docs/errors.md is generated from CASES (see errors_markdown): a case added without regenerating it fails here."""
    rows = [line.split(" | ") for line in (Path(__file__).parents[1] / "docs" / "errors.md").read_text().splitlines()
            if line.startswith("| ") and not line.startswith("| #")]
    assert [r[1] for r in rows[:len(CASES)]] == [c.what for c in CASES], "regenerate docs/errors.md"
    # + the disk-full case, which needs a tmpfs mount, and bfloat16 on a CPU without it (tests/test_model_dtype.py)
    assert len(rows) == len(CASES) + 2
    for row, case in zip(rows, CASES):
        assert " ".join(case.expect.split()) in row[2].replace("\\|", "|"), (case.id, row[2])


# tests/test_model_dtype.py checks the CLI prints this (the CPU faked in-process: this machine has bfloat16)
BF16_REFUSAL = ("model.dtype=bfloat16: this CPU (Intel(R) Xeon(R) CPU E5-2686 v4 @ 2.30GHz) has no native bfloat16 "
                "(neither of avx512_bf16, amx_bf16, bf16 is in its /proc/cpuinfo flags), so the trainer, reference and "
                "engines on it would emulate bfloat16: slower than float32, with bfloat16's rounding -> set "
                "model.dtype=float32 (or auto, which is float32 on CPU), or run on a CPU with AVX512-BF16 or AMX")


def errors_markdown() -> str:
    """docs/errors.md: every case with the message the CLI printed for it (run against a fresh tiny model)."""
    from posttrain.models.tiny import build_tiny_model

    lines = ["# Bad inputs and their messages", "",
             "Every case below is a test in `tests/test_bad_inputs.py`: the CLI exits with code 2 and prints this one",
             "message (no traceback). Paths are from the test's temporary directory. Regenerate with",
             "`python tests/test_bad_inputs.py > docs/errors.md`.", "",
             "Other exit codes: 0 success; 75 preempted (SIGTERM): a checkpoint of the last completed step was written",
             "within `checkpoint.grace_seconds`, rerun with `--resume` (see docs/reliability.md); 1 a bug (a traceback:",
             "please report it).", "",
             "| # | bad input | message |", "|---|---|---|"]
    runner = CliRunner()
    with tempfile.TemporaryDirectory() as d:
        model = str(build_tiny_model(Path(d) / "model", "1m", seed=0))
        for i, case in enumerate(CASES, 1):
            tmp = Path(d) / case.id
            tmp.mkdir()
            out = runner.invoke(app, case.args(tmp, model)).output.strip().removeprefix("error: ")
            msg = " ".join(out.replace(d, "<tmp>").replace(str(MULTITURN), "<tests/fixtures/multiturn>").split())
            msg = msg.replace("|", "\\|")
            lines.append(f"| {i} | {case.what} | {msg} |")
    lines.append(f"| {len(CASES) + 1} | disk too small for a checkpoint (1 MiB tmpfs) | runs_dir: <mnt>/bad has 1.0 "
                 "MiB free, but one checkpoint of <model> needs about 13.2 MiB -> free disk space or point runs_dir at "
                 "a larger disk |")
    lines.append(f"| {len(CASES) + 2} | `model.dtype: bfloat16` on a CPU without native bfloat16 (no AVX512-BF16, "
                 "no AMX) | " + BF16_REFUSAL + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(errors_markdown())
