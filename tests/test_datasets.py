"""Datasets as users have them (task.name: dataset): the same rows as .jsonl, .parquet, .csv and a save_to_disk
directory give the same problems; column mapping; chat prompts rendered by a real tokenizer's chat template; the
system prompt; answers optional when nothing compares with them; a held-out file or a seeded fraction, with the
overlap count worked out by hand; extra columns arriving in user reward functions (real child processes, and a
short real run). The bad inputs are in tests/test_bad_inputs.py."""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

import pytest

from posttrain.config import RewardFunctionConfig, TaskConfig, load_config
from posttrain.errors import PosttrainError
from posttrain.rewards.functions import FunctionScorers, check_functions, signature_form
from posttrain.tasks import load_task
from posttrain.tasks.dataset import heldout_overlap, normalised, record_report, with_system

ROWS = [{"question": f"{i}+1=", "solution": str(i + 1), "rubric": f"r{i}", "level": str(i % 3)} for i in range(6)]


def _write(tmp: Path, fmt: str, rows: list[dict], name: str = "data") -> Path:
    if fmt == "jsonl":
        p = tmp / f"{name}.jsonl"
        p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "csv":
        p = tmp / f"{name}.csv"
        with open(p, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    elif fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        p = tmp / f"{name}.parquet"
        pq.write_table(pa.Table.from_pylist(rows), p)
    else:
        import datasets

        p = tmp / name
        datasets.Dataset.from_list(rows).save_to_disk(str(p))
    return p


def _task(path, **kw):
    return TaskConfig(name="dataset", path=str(path), heldout_size=2, prompt_column="question",
                      answer_column="solution", **kw)


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet", "save_to_disk"])
def test_every_format_gives_the_same_problems_with_the_column_mapping(tmp_path, fmt):
    task = load_task(_task(_write(tmp_path, fmt, ROWS)), seed=0)
    reference = load_task(_task(_write(tmp_path, "jsonl", ROWS, "ref")), seed=0)
    assert [(p.prompt, p.answer, p.columns) for p in task.train + task.heldout] == \
        [(p.prompt, p.answer, p.columns) for p in reference.train + reference.heldout]
    assert len(task.train) == 4 and len(task.heldout) == 2
    p = next(p for p in task.train if p.prompt == "0+1=")
    assert p.answer == "1" and p.columns == {"rubric": "r0", "level": "0"}
    assert p.id == ("row2" if fmt == "csv" else "row1")  # csv: line 2 (after the header); others: line/row 1
    assert task.score(p, "1") == 1.0 and task.columns == ["rubric", "level"]


def test_a_jsonl_task_reads_as_before(tmp_path):
    """task.name: jsonl with prompt/answer rows: same ids and split as the jsonl task had (seed string kept)."""
    f = _write(tmp_path, "jsonl", [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(10)])
    task = load_task(TaskConfig(name="jsonl", path=str(f), heldout_size=3), seed=0)
    assert [p.id for p in task.heldout] == ["row4", "row7", "row9"]  # what the old JsonlTask drew (checked)
    assert all(p.columns == {} for p in task.train)


def test_chat_prompts_and_the_system_prompt_render_with_the_chat_template(tmp_path, tiny_model_dir):
    from posttrain.models.loading import PromptEncoder, load_tokenizer

    rows = [{"prompt": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "1+1="}], "answer": "2"},
            {"prompt": [{"role": "user", "content": "2+2="}], "answer": "4"},
            {"prompt": "3+3=", "answer": "6"}]
    cfg = TaskConfig(name="dataset", path=str(_write(tmp_path, "jsonl", rows)), heldout_size=1,
                     heldout_fraction=None, system_prompt="add")
    task = load_task(cfg, seed=0)
    by_id = {p.id: p.prompt for p in task.train + task.heldout}
    assert by_id["row1"][0] == {"role": "system", "content": "be brief"}  # the row's own system message wins
    assert by_id["row2"] == [{"role": "system", "content": "add"}, {"role": "user", "content": "2+2="}]
    assert by_id["row3"] == [{"role": "system", "content": "add"}, {"role": "user", "content": "3+3="}]
    tok = load_tokenizer(tiny_model_dir)
    plain = PromptEncoder(tok)  # the tiny tokenizer has no template: turns joined with a space
    assert plain.encode(by_id["row3"]) == tok("add 3+3=", add_special_tokens=False)["input_ids"]
    tok.chat_template = ("{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }},{% endfor %}"
                         "{% if add_generation_prompt %}a:{% endif %}")
    chat = PromptEncoder(tok)

    def ids(text):
        return tok(text, add_special_tokens=False)["input_ids"]

    assert chat.encode(by_id["row1"]) == ids("s:be brief,u:1+1=,a:")
    assert chat.encode(by_id["row3"]) == ids("s:add,u:3+3=,a:")


def test_answers_are_optional_when_nothing_compares_with_them(tmp_path):
    f = _write(tmp_path, "jsonl", [{"prompt": f"{i}=", "ref": i} for i in range(5)])
    with pytest.raises(PosttrainError, match=r"data.jsonl, line 1: column 'answer' \(task.answer_column\) is absent"):
        load_task(TaskConfig(name="dataset", path=str(f), heldout_size=1), seed=0)
    task = load_task(TaskConfig(name="dataset", path=str(f), heldout_size=1), seed=0, need_answer=False)
    assert all(p.answer is None for p in task.train) and task.score(task.train[0], "x") == 0.0
    assert task.train[0].columns.keys() == {"ref"}


def test_numeric_answers_from_parquet_become_text(tmp_path):
    f = _write(tmp_path, "parquet", [{"prompt": f"{i}+1=", "answer": i + 1} for i in range(4)])
    task = load_task(TaskConfig(name="dataset", path=str(f), heldout_size=1), seed=0)
    assert sorted(p.answer for p in task.train + task.heldout) == ["1", "2", "3", "4"]


def test_the_overlap_count_worked_out_by_hand(tmp_path):
    """Training prompts 1+1=, '2 + 2=', 3+3=; held-out '1+1=', '  2  +\t2= ' and 9+9=: the first two are the same
    text after whitespace normalisation, so 2 of 3 held-out prompts occur in the training data."""
    train = _write(tmp_path, "jsonl", [{"prompt": p, "answer": "x"} for p in ["1+1=", "2 + 2=", "3+3="]])
    held = _write(tmp_path, "csv", [{"prompt": p, "answer": "x"} for p in ["1+1=", "  2  +\t2= ", "9+9="]], "held")
    assert normalised("  2  +\t2= ") == "2 + 2="
    cfg = TaskConfig(name="dataset", path=str(train), heldout_path=str(held))
    task = load_task(cfg, seed=0)
    assert len(task.train) == 3 and [p.id for p in task.heldout] == ["heldout-row2", "heldout-row3", "heldout-row4"]
    assert task.report["heldout_in_train"] == 2 and task.report["heldout_in_train_ids"] == ["heldout-row2",
                                                                                             "heldout-row3"]
    assert heldout_overlap(task.train, task.train) == [p.id for p in task.train]
    logged: list[str] = []
    record_report(task, tmp_path, logged.append)
    assert json.loads((tmp_path / "data_report.json").read_text())["heldout_in_train"] == 2
    assert logged[1].startswith("warning: task: 2 of 3 held-out prompts")
    with pytest.raises(PosttrainError, match="2 of 3 held-out prompts"):
        load_task(cfg.model_copy(update={"strict_heldout": True}), seed=0)


def test_a_seeded_fraction_holds_out_that_share(tmp_path):
    f = _write(tmp_path, "jsonl", [{"prompt": f"{i}+1=", "answer": "x"} for i in range(40)])
    cfg = TaskConfig(name="dataset", path=str(f), heldout_fraction=0.25)
    a, b = load_task(cfg, seed=3), load_task(cfg, seed=3)
    assert len(a.heldout) == 10 and len(a.train) == 30 and [p.id for p in a.heldout] == [p.id for p in b.heldout]
    assert not {p.id for p in a.heldout} & {p.id for p in a.train} and a.report["heldout_in_train"] == 0
    assert [p.id for p in load_task(cfg, seed=4).heldout] != [p.id for p in a.heldout]


def test_with_system_keeps_a_row_system_message():
    turns = [{"role": "system", "content": "own"}, {"role": "user", "content": "q"}]
    assert with_system(turns, "cfg") == turns and with_system("q", None) == "q"


REWARDS = '''
def rubric_batch(prompts, completions, rubric, level):
    return [float(len(r)) + int(l) for r, l in zip(rubric, level)]

def rubric_sample(prompt, completion, rubric, **kwargs):
    return float(rubric == "r1") + float(kwargs["level"])
'''


def test_dataset_columns_reach_reward_functions_by_name(tmp_path):
    (tmp_path / "rw.py").write_text(REWARDS)
    task = load_task(_task(_write(tmp_path, "parquet", ROWS)), seed=0)
    with pytest.raises(PosttrainError, match=r"required parameter\(s\) \['rubric', 'level'\]"):
        check_functions([RewardFunctionConfig(name="b", fn=f"{tmp_path / 'rw.py'}:rubric_batch")])
    fns = [RewardFunctionConfig(name=n, fn=f"{tmp_path / 'rw.py'}:{n}") for n in ("rubric_batch", "rubric_sample")]
    assert set(check_functions(fns, task.columns)) == {"rubric_batch", "rubric_sample"}
    rows = [{"prompt": p.prompt, "completion": "c", "answer": p.answer, "completion_ids": [1], "sample_id": f"1/{p.id}/0",
             "columns": p.columns} for p in task.train]
    scorers = FunctionScorers(fns, 5.0, -1.0)
    try:
        out = scorers.score(rows, 1)
    finally:
        scorers.close()
    assert out["rubric_batch"][0] == [2.0 + int(p.columns["level"]) for p in task.train]
    assert out["rubric_sample"][0] == [float(p.columns["rubric"] == "r1") + int(p.columns["level"])
                                       for p in task.train]
    assert signature_form(lambda prompt, completion, rubric: 0.0, "f", ["rubric"]).takes == {"prompt", "completion",
                                                                                              "rubric"}


RUN_REWARDS = '''
def matches_target(prompt, completion, target):  # a chat prompt's completion is [{"role": "assistant", ...}]
    return 1.0 if completion[0]["content"].strip() == target else 0.0

def seen(prompts, completions, note, **kwargs):
    assert all(n == "x" + p[0]["content"] for n, p in zip(note, prompts)), (note, prompts)
    return [0.5] * len(completions)
'''


@pytest.mark.integration
def test_a_run_on_a_parquet_dataset_without_answers_scores_with_its_columns(tmp_path, tiny_model_dir):
    """A real short run: chat prompts from parquet, no answer column, the verifier left out; two reward functions
    take the row's columns by name. data_report.json is written and the run's reward is the functions'."""
    from posttrain.loop import train
    from posttrain.tracking import read_metrics

    rows = [{"prompt": [{"role": "user", "content": f"{i}+1="}], "target": str(i + 1), "note": f"x{i}+1="}
            for i in range(12)]
    data = _write(tmp_path, "parquet", rows)
    (tmp_path / "run_rw.py").write_text(RUN_REWARDS)
    fns = (f"[{{name: target, fn: '{tmp_path / 'run_rw.py'}:matches_target'}}, "
           f"{{name: seen, fn: '{tmp_path / 'run_rw.py'}:seen'}}]")
    cfg = load_config(None, [
        "name=dsrun", f"runs_dir={tmp_path}", f"model.path={tiny_model_dir}", "rollout.engine=hf",
        "task.name=dataset", f"task.path={data}", "task.heldout_fraction=0.25", "reward.weights={verifier: 0}",
        "algorithm.prompts_per_step=2", "algorithm.group_size=2", "algorithm.kl_coef=0", "eval.every=0",
        "train.steps=1", "checkpoint.every=0", "logging.progress=false", f"reward.functions={fns}",
        "reward.max_failure_fraction=0",
    ])
    t = time.perf_counter()
    train(cfg, progress=False)
    print(f"dataset run: {time.perf_counter() - t:.1f} s")
    step = next(m for m in read_metrics(cfg.run_dir) if "time/step" in m)
    assert step["reward/seen"] == 0.5 and step["reward_failures"] == 0
    assert step["reward_mean"] == pytest.approx(0.5 + step["reward/target"])
    report = json.loads((cfg.run_dir / "data_report.json").read_text())
    assert report["train_rows"] == 9 and report["heldout_rows"] == 3 and report["columns"] == ["target", "note"]


def test_a_column_that_is_not_a_json_value_is_named_with_its_row(tmp_path):
    import datetime

    rows = [{"prompt": "1+1=", "answer": "2", "when": datetime.date(2026, 1, i + 1)} for i in range(3)]
    with pytest.raises(PosttrainError, match=r"data.parquet, row 1: column 'when' holds a date"):
        load_task(TaskConfig(name="dataset", path=str(_write(tmp_path, "parquet", rows)), heldout_size=1), seed=0)


def test_the_data_fingerprint_counts_columns_and_keeps_the_old_hashes():
    import hashlib

    from posttrain.rollout.sampler import data_fingerprint
    from posttrain.tasks import Problem

    before_columns = hashlib.sha256(json.dumps([["a", "1+1=", "2"]]).encode()).hexdigest()[:16]
    assert data_fingerprint([Problem("a", "1+1=", "2")]) == before_columns
    assert data_fingerprint([Problem("a", "1+1=", "2", {"r": 1})]) != data_fingerprint([Problem("a", "1+1=", "2",
                                                                                                {"r": 2})])


def test_dataset_keys_with_a_built_in_task_are_refused():
    with pytest.raises(PosttrainError, match="task.system_prompt is set but task.name='addition' is a built-in task"):
        load_config(None, ["task.system_prompt=hi"])
    assert load_config(None, ["task.name=dataset", "task.path=x.csv", "task.system_prompt=hi"]).task.path == "x.csv"


def test_sft_encodes_a_chat_prompt_like_the_policy_sees_it(tiny_model_dir):
    from posttrain.models.loading import PromptEncoder, load_tokenizer
    from posttrain.tasks import Problem
    from posttrain.training.sft import encode_sft_example

    tok = load_tokenizer(tiny_model_dir)
    tok.chat_template = "{% for m in messages %}{{ m['content'] }},{% endfor %}{% if add_generation_prompt %}a:{% endif %}"
    encoder = PromptEncoder(tok)
    prompt = [{"role": "system", "content": "add"}, {"role": "user", "content": "1+1="}]
    ids, mask = encode_sft_example(encoder, Problem("p", prompt, "2"))
    assert ids == encoder.encode(prompt) + tok("2", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert encoder.encode(prompt) == tok("add,1+1=,a:", add_special_tokens=False)["input_ids"]
    assert mask == [0] * (len(ids) - 2) + [1, 1]
