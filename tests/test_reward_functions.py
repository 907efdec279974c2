"""Reward functions from user code (reward.functions): both signature forms with numbers worked out by hand, None
left out of the mean, async functions run concurrently, each failure kind counted, each bad spec a PosttrainError
naming the file and the symbol, and a short real run (Ray, child processes) with one planted failing function.
Every function here is real code in a real file, run in the real child processes of the reward worker."""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path

import pytest

from posttrain.config import RewardFunctionConfig, load_config
from posttrain.errors import PosttrainError
from posttrain.rewards.compose import compose
from posttrain.rewards.functions import (FAILURE_KINDS, FunctionScorers, changed_sources, check_functions,
                                         function_failure_counts, signature_form)
from posttrain.rewards.scoring import component_means
from posttrain.usercode import load_callable

MODULE = '''
import asyncio, math, os, time

def length_batch(prompts, completions, **kwargs):          # TRL's form, as TRL users write it
    return [float(len(c)) for c in completions]

def starts_with_answer(prompt, completion, answer):        # per-sample, no **kwargs: only `answer` is passed
    return 1.0 if completion.startswith(answer) else 0.0

def only_short(prompt, completion, completion_ids):        # None: does not apply to long completions
    return None if len(completion_ids) > 2 else 2.0

def only_answered(prompt, completion, answer):            # None where the row has no answer
    return None if answer is None else 1.0

def ids_seen(completions, sample_ids, completion_ids):     # batch, the columns the loop adds
    return [float(len(i)) + int(s.split("/")[-1]) for i, s in zip(completion_ids, sample_ids)]

async def slow_a(prompts, completions, **kw):
    await asyncio.sleep(0.5)
    return [1.0] * len(completions)

async def slow_b(prompt, completion, **kw):                # per-sample async: its samples awaited together
    await asyncio.sleep(0.5)
    return 0.5

def raises(prompt, completion):
    raise ValueError("no score for " + completion)

def wrong_type(prompt, completion):
    return "1.0"

def wrong_length(prompts, completions):
    return [1.0]

def not_finite(prompt, completion):
    return math.nan if completion == "42" else math.inf

def hangs(prompts, completions):
    time.sleep(30)

async def hangs_async(prompt, completion):
    await asyncio.sleep(30)

def dies(prompt, completion):
    os._exit(3)

def neither(text):
    return 0.0

def both(completion, completions):
    return 0.0

def needs_more(prompt, completion, rubric):
    return 0.0
'''


@pytest.fixture
def module(tmp_path) -> Path:
    path = tmp_path / "my_rewards.py"
    path.write_text(MODULE)
    return path


ROWS = [{"prompt": "40+2=", "completion": "42", "answer": "42", "completion_ids": [4, 2, 0], "sample_id": "1/p0/0"},
        {"prompt": "3+5=", "completion": "7", "answer": "8", "completion_ids": [7, 0], "sample_id": "1/p1/0"},
        {"prompt": "6+6=", "completion": "123", "answer": "12", "completion_ids": [1, 2, 3, 0], "sample_id": "1/p2/1"}]


def _score(module: Path, *names: str, timeout_s: float = 5.0, default: float = -1.0, rows=ROWS) -> dict:
    fns = [RewardFunctionConfig(name=n, fn=f"{module}:{n}") for n in names]
    scorers = FunctionScorers(fns, timeout_s, default)
    try:
        return scorers.score(rows, 1)
    finally:
        scorers.close()


def test_each_form_gives_the_numbers_worked_out_by_hand(module):
    got = _score(module, "length_batch", "starts_with_answer", "only_short", "ids_seen")
    assert got["length_batch"] == ([2.0, 1.0, 3.0], [None] * 3)          # len("42"), len("7"), len("123")
    assert got["starts_with_answer"] == ([1.0, 0.0, 1.0], [None] * 3)    # "42"/"42", "7"/"8", "123"/"12"
    assert got["only_short"] == ([None, 2.0, None], [None] * 3)          # 3, 2, 4 token ids
    assert got["ids_seen"] == ([3.0, 2.0, 5.0], [None] * 3)              # len(ids) + sample index 0, 0, 1


# Written as TRL's documentation writes reward functions for conversational data: each completion is a list of
# messages and the text is completion[0]["content"]; prompts are lists of messages.
TRL_CONVERSATIONAL = '''
import re

def format_reward(completions, **kwargs):
    contents = [completion[0]["content"] for completion in completions]
    return [1.0 if re.match(r"^<answer>.*?</answer>$", c) else 0.0 for c in contents]

def asked_about(prompts, completions, **kwargs):
    return [float(len(p[-1]["content"])) for p in prompts]

def per_sample_chat(prompt, completion, answer):
    assert completion[0]["role"] == "assistant", completion
    return 1.0 if answer in completion[0]["content"] else 0.0

def kinds(prompts, completions, **kwargs):
    return [float(isinstance(p, list)) + 10.0 * isinstance(c, list) for p, c in zip(prompts, completions)]
'''


def test_a_trl_conversational_function_runs_unchanged_and_strings_stay_strings(tmp_path):
    """Chat prompts: completions reach the function as [{"role": "assistant", "content": text}], as TRL's
    GRPOTrainer passes them; string prompts keep string completions (both forms, through the real child process)."""
    (tmp_path / "trl_rewards.py").write_text(TRL_CONVERSATIONAL)
    chat = [{"prompt": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "3+5="}],
             "completion": "<answer>8</answer>", "answer": "8", "completion_ids": [1], "sample_id": "1/p0/0"},
            {"prompt": [{"role": "user", "content": "10+10="}],
             "completion": "the answer is 20", "answer": "21", "completion_ids": [1], "sample_id": "1/p1/0"}]
    got = _score(tmp_path / "trl_rewards.py", "format_reward", "asked_about", "per_sample_chat", "kinds", rows=chat)
    assert got["format_reward"] == ([1.0, 0.0], [None, None])      # tagged, untagged
    assert got["asked_about"] == ([4.0, 6.0], [None, None])        # len("3+5="), len("10+10=")
    assert got["per_sample_chat"] == ([1.0, 0.0], [None, None])    # "8" in the first, "21" not in the second
    assert got["kinds"] == ([11.0, 11.0], [None, None])            # list prompt (1) + list completion (10)
    assert _score(tmp_path / "trl_rewards.py", "kinds")["kinds"] == ([0.0] * 3, [None] * 3)  # ROWS: strings


def test_math_answer_reads_a_chat_completion_and_a_string_alike():
    from posttrain.rewards.math_answer import math_answer

    assert math_answer("1+1=", "so it is 2", "2") == 1.0
    assert math_answer([{"role": "user", "content": "1+1="}], [{"role": "assistant", "content": "so it is 2"}], "2") == 1.0
    assert math_answer([{"role": "user", "content": "1+1="}], [{"role": "assistant", "content": "so it is 3"}], "2") == 0.0


def test_forms_are_read_from_the_signature(module):
    def form(name):
        f = signature_form(load_callable(f"{module}:{name}", "x")[1], name)
        return f.batch, f.is_async, f.takes

    assert form("length_batch") == (True, False, None)
    assert form("starts_with_answer") == (False, False, frozenset({"prompt", "completion", "answer"}))
    assert form("slow_a")[:2] == (True, True) and form("slow_b")[:2] == (False, True)


def test_none_is_left_out_of_the_mean_and_adds_nothing_to_the_reward():
    components = {"verifier": [1.0, 0.0, 1.0], "only_short": [None, 2.0, None], "length_batch": [2.0, 1.0, 3.0]}
    # 1*verifier + 0.5*only_short + 0.25*length_batch: 1 + 0 + 0.5; 0 + 1 + 0.25; 1 + 0 + 0.75
    assert compose(components, {"verifier": 1.0, "only_short": 0.5, "length_batch": 0.25}) == [1.5, 1.25, 1.75]
    means = component_means(components)
    assert means["reward/only_short"] == 2.0                 # the mean of the one sample it applies to, not 2/3
    assert means["reward/length_batch"] == 2.0
    assert "reward/nothing" not in component_means({"nothing": [None, None]})


def test_async_functions_run_concurrently(module):
    """Two async functions (one batch, one per-sample over three samples), each sleeping 0.5 s per call: run one
    after the other they would take 0.5 + 3 * 0.5 = 2 s."""
    fns = [RewardFunctionConfig(name=n, fn=f"{module}:{n}") for n in ("slow_a", "slow_b")]
    scorers = FunctionScorers(fns, 5.0, 0.0)
    try:
        scorers.score(ROWS, 0)  # starts the child processes (spawning Python is not what is measured)
        t = time.perf_counter()
        got = scorers.score(ROWS, 1)
        took = time.perf_counter() - t
    finally:
        scorers.close()
    print(f"two async functions sleeping 0.5 s: {took:.3f} s")
    assert got == {"slow_a": ([1.0] * 3, [None] * 3), "slow_b": ([0.5] * 3, [None] * 3)}
    assert took < 0.9, took


@pytest.mark.parametrize("name, kind, text", [
    ("raises", "exception", "reward function 'raises' raised ValueError: no score for 42 for sample 1/p0/0 at step 1"),
    ("wrong_type", "type", "reward function 'wrong_type' returned str for sample 1/p0/0 at step 1; expected a float"),
    ("wrong_length", "length", "reward function 'wrong_length' returned 1 scores for the 3 samples 1/p0/0..1/p2/1 "
     "at step 1"),
    ("not_finite", "nan", "reward function 'not_finite' returned nan for sample 1/p0/0 at step 1"),
    ("hangs", "timeout", "reward function 'hangs' ran longer than 1 s at step 1 (samples 1/p0/0..1/p2/1)"),
    ("hangs_async", "timeout", "reward function 'hangs_async' ran longer than 1 s for sample 1/p0/0 at step 1"),
    ("dies", "exception", "reward function 'dies''s process died (exit code 3) at step 1 (sample 1/p0/0)"),
])
def test_each_failure_is_counted_by_kind_with_the_default_reward(module, name, kind, text):
    scores, errors = _score(module, name, timeout_s=1.0)[name]
    assert scores == [-1.0] * 3
    assert errors[0].startswith(f"{kind}: ") and text in errors[0], errors[0]
    counts = function_failure_counts([name], [{name: e} for e in errors])
    assert counts[f"reward_failures/{name}/{kind}"] == 3
    assert sum(counts.values()) == 3 and len(counts) == len(FAILURE_KINDS)


def test_a_module_that_no_longer_imports_in_the_child_is_an_import_failure(tmp_path):
    path = tmp_path / "later_broken.py"
    path.write_text("raise RuntimeError('config service down')\n")
    scores, errors = _score(path, "f")["f"]
    assert scores == [-1.0] * 3
    assert errors[0].startswith("import: reward function 'f': ") and "RuntimeError: config service down" in errors[0]


# ---------------------------------------------------------------------------------------------- bad specs at start


@pytest.mark.parametrize("spec, expect", [
    ("{dir}/nope.py:f", "reward.functions.0.fn: '{dir}/nope.py:f': the file {dir}/nope.py does not exist"),
    ("{dir}/raising.py:f", "reward.functions.0.fn: importing {dir}/raising.py (for '{dir}/raising.py:f') raised "
     "KeyError: 'API_KEY' (line 2)"),
    ("{dir}/my_rewards.py:missing", "reward.functions.0.fn: {dir}/my_rewards.py has no symbol 'missing'"),
    ("{dir}/my_rewards.py:neither", "reward.functions.0.fn: {dir}/my_rewards.py:neither: the signature fits neither "
     "reward-function form: its parameters are (text)"),
    ("{dir}/my_rewards.py:both", "the signature fits neither reward-function form"),
    ("{dir}/my_rewards.py:needs_more", "required parameter(s) ['rubric'] are not columns it can be given"),
    ("{dir}/my_rewards.py", "does not name a symbol"),
    ("no_such_pkg.rewards:f", "reward.functions.0.fn: 'no_such_pkg.rewards:f': no module named 'no_such_pkg'"),
])
def test_a_bad_spec_is_one_error_naming_the_file_and_the_symbol(module, spec, expect):
    d = module.parent
    (d / "raising.py").write_text("import os\nKEY = os.environ['API_KEY']\n")
    cfg = load_config(None, [f"reward.functions=[{{name: r, fn: '{spec.format(dir=d)}'}}]"])
    with pytest.raises(PosttrainError) as e:
        check_functions(cfg.reward.functions)
    assert expect.format(dir=d) in str(e.value), str(e.value)


def test_a_package_module_spec_loads_and_its_source_is_hashed(tmp_path, monkeypatch):
    pkg = tmp_path / "teamrewards"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "score.py").write_text("def brevity(prompt, completion, **kw):\n    return -len(completion)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = load_config(None, ["reward.functions=[{name: brevity, fn: 'teamrewards.score:brevity', weight: 0.1}]"])
    src = check_functions(cfg.reward.functions)["brevity"]
    import hashlib

    assert src.file == str(pkg / "score.py") and src.form == "sample"
    assert src.sha256 == hashlib.sha256((pkg / "score.py").read_bytes()).hexdigest()
    assert changed_sources({"brevity": {"sha256": src.sha256}}, {"brevity": src}) == []
    assert changed_sources({"brevity": {"sha256": "0" * 64}}, {"brevity": src})[0].startswith("brevity (")


@pytest.mark.parametrize("override, expect", [
    ("reward.functions=[{name: verifier, fn: 'a.py:f'}]", "not a built-in source name"),
    ("reward.functions=[{name: a, fn: 'a.py:f'}, {name: a, fn: 'b.py:f'}]", "is used twice"),
    ("reward.functions=[{name: 'a b', fn: 'a.py:f'}]", "use letters, digits"),
    ("reward.weights={mine: 1.0}", "reward functions take their weight in reward.functions"),
])
def test_function_names_are_checked_with_the_config(override, expect):
    with pytest.raises(PosttrainError, match=expect):
        load_config(None, [override])


# ---------------------------------------------------------------------------------------------- a real run

RUN_MODULE = '''
def brevity(prompts, completions, **kwargs):
    return [1.0 - len(c) / 8 for c in completions]

async def has_digit(prompt, completion, answer):
    return 1.0 if any(ch.isdigit() for ch in completion) else None

def planted(prompt, completion):
    raise RuntimeError("planted failure")
'''


@pytest.mark.integration
def test_a_run_logs_each_function_and_counts_the_planted_failures(tmp_path, tiny_model_dir):
    """Ray, the reward worker and one child process per function: two good functions and one that always raises.
    reward/<name> is logged for the good ones, reward_failures/planted/exception counts every sample, and the sha256
    of the module is in config.yaml, state.json and summary.json."""
    from posttrain.loop import train
    from posttrain.tracking import read_metrics

    mod = tmp_path / "run_rewards.py"
    mod.write_text(RUN_MODULE)
    fns = (f"[{{name: brevity, fn: '{mod}:brevity', weight: 0.5}}, {{name: has_digit, fn: '{mod}:has_digit'}}, "
           f"{{name: planted, fn: '{mod}:planted'}}]")
    cfg = load_config(None, [
        "name=fnrun", f"runs_dir={tmp_path}", f"model.path={tiny_model_dir}", "rollout.engine=hf",
        "task.train_size=64", "task.heldout_size=4", "algorithm.prompts_per_step=2", "algorithm.group_size=4",
        "algorithm.kl_coef=0", "eval.every=0", "train.steps=2", "checkpoint.every=0", "logging.progress=false",
        f"reward.functions={fns}", "reward.max_failure_fraction=1",
    ])
    t = time.perf_counter()
    summary = train(cfg, progress=False)
    print(f"run with three reward functions: {time.perf_counter() - t:.1f} s")
    steps = [m for m in read_metrics(cfg.run_dir) if "time/step" in m]
    assert len(steps) == 2
    samples = [json.loads(line) for line in (cfg.run_dir / "samples.jsonl").read_text().splitlines()]
    for m, s in zip(steps, samples):
        texts = [x[1] for x in s["samples"]]
        print({k: v for k, v in m.items() if k.startswith("reward")})
        assert m["reward/brevity"] == pytest.approx(sum(1 - len(c) / 8 for c in texts) / 8)
        with_digit = [c for c in texts if any(ch.isdigit() for ch in c)]
        assert ("reward/has_digit" in m) == bool(with_digit) and m.get("reward/has_digit", 1.0) == 1.0
        assert "reward/planted" in m and m["reward/planted"] == 0.0  # reward.default for each failed sample
        assert m["reward_failures/planted/exception"] == 8 == m["reward_failures"]
        assert m["reward_failures/brevity/exception"] == m["reward_failures/has_digit/timeout"] == 0
        assert all("planted failure" in e and e.startswith("exception: reward function 'planted'")
                   for e in s["reward_errors"].values())
        # reward = verifier + 0.5 * brevity + has_digit (None adds nothing) + planted (the default, 0)
        for sid, text, r in s["samples"]:
            expected = 0.5 * (1 - len(text) / 8) + (1.0 if text in with_digit else 0.0)
            assert min(abs(r - expected), abs(r - expected - 1.0)) < 1e-6, (sid, text, r)  # + verifier 0 or 1
    sha = summary["reward_functions"]["planted"]["sha256"]
    assert f"sha256 {sha}" in (cfg.run_dir / "config.yaml").read_text()
    state = json.loads(next((cfg.run_dir / "checkpoints").glob("*/state.json")).read_text())
    assert state["reward_functions"]["brevity"]["form"] == "batch"
    assert state["reward_functions"]["has_digit"]["form"] == "sample async"


# ---------------------------------------------------------------------------------------------- as an eval scorer


@pytest.mark.parametrize("name", ["length_batch", "starts_with_answer", "slow_b"])
def test_a_function_scores_the_same_as_reward_and_as_eval_scorer(module, name):
    """One definition of quality: the training path (FunctionScorers in the reward worker) and the eval scorer
    `{type: function, fn: ...}` give identical numbers on identical text."""
    from posttrain.evals.scorers import build_scorer, score_outputs

    as_reward, _ = _score(module, name)[name]
    scorer = build_scorer({"type": "function", "fn": f"{module}:{name}"}, where="suite.yaml, suite s")
    as_scorer = [scorer(r["prompt"], r["completion"], {"answer": r["answer"], "id": r["sample_id"]}) for r in ROWS]
    assert as_scorer == as_reward, (as_scorer, as_reward)
    rows = [{"prompt": r["prompt"], "output": r["completion"], "record": {"answer": r["answer"], "id": r["sample_id"]},
             "tokens": 0} for r in ROWS]
    assert score_outputs(scorer, rows)[0] == as_reward  # a suite's outputs in one batch: the same numbers


def test_an_eval_scorer_failure_or_none_names_the_function_and_the_sample(module):
    from posttrain.evals.scorers import build_scorer

    with pytest.raises(PosttrainError, match=r"suite.yaml, suite s, field scorer: fn: .*has no symbol 'nope'"):
        build_scorer({"type": "function", "fn": f"{module}:nope"}, where="suite.yaml, suite s")
    raises = build_scorer({"type": "function", "fn": f"{module}:raises"}, where="w")
    with pytest.raises(PosttrainError, match=r"raised ValueError: no score for 42 for sample s7 at step eval"):
        raises("40+2=", "42", {"answer": "42", "id": "s7"})
    only_answered = build_scorer({"type": "function", "fn": f"{module}:only_answered"}, where="w")
    assert only_answered("p", "x", {"id": "s8", "answer": "3"}) == 1.0
    with pytest.raises(PosttrainError, match=r"returned None \(does not apply\) for sample s8"):
        only_answered("p", "x", {"id": "s8"})


def test_resume_with_a_changed_function_warns_or_refuses_under_strict_resume(module):
    from posttrain.rewards.functions import check_resume

    cfg = load_config(None, [f"reward.functions=[{{name: len, fn: '{module}:length_batch'}}]"])
    saved = {n: vars(s) for n, s in check_functions(cfg.reward.functions).items()}
    warnings: list[str] = []
    check_resume(saved, check_functions(cfg.reward.functions), False, "ckpt", warnings.append)
    assert warnings == []
    module.write_text(MODULE + "\n# edited\n")
    now = check_functions(cfg.reward.functions)
    check_resume(saved, now, False, "ckpt", warnings.append)
    assert len(warnings) == 1 and f"len ({module}) changed: sha256 {saved['len']['sha256'][:12]}" in warnings[0]
    with pytest.raises(PosttrainError, match="the reward functions differ from those checkpoint ckpt"):
        check_resume(saved, now, True, "ckpt", warnings.append)
