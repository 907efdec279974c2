"""Scorers for eval suites, by name. A scorer turns one model output into a score:
`score(prompt: str, output: str, record: dict) -> float`, where `record` is the suite's sample (its "answer",
and any other fields the suite file gave it).

A suite names its scorer as `{type: NAME, ...options}`; `build_scorer` looks NAME up in `SCORERS` and calls the
factory with the options: exact, numeric, regex, verifier, python (a user hook), reward_model (a trained RM
directory), judge (an LLM judge endpoint), gold (a built-in task's hidden gold function) and function (a
reward function from user code, run exactly as `reward.functions` runs it in training: a batch function is called
once per suite, see `score_outputs`). `register_scorer` adds more.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Callable

from posttrain.errors import PosttrainError

Scorer = Callable[[str, str, dict], float]
ScorerFactory = Callable[..., Scorer]

NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def _answer(record: dict) -> str:
    if "answer" not in record:
        raise PosttrainError(f"sample {record.get('id', '?')}: this scorer needs an 'answer' field")
    return str(record["answer"])


def exact_scorer(*, strip: bool = True, ignore_case: bool = False) -> Scorer:
    def score(prompt: str, output: str, record: dict) -> float:
        a, o = _answer(record), output
        if strip:
            a, o = a.strip(), o.strip()
        if ignore_case:
            a, o = a.lower(), o.lower()
        return 1.0 if a == o else 0.0

    return score


def numeric_scorer(*, tolerance: float = 0.0) -> Scorer:
    """1 when the first number in the output is within `tolerance` (absolute) of the numeric answer."""

    def score(prompt: str, output: str, record: dict) -> float:
        m = NUMBER.search(output)
        if m is None:
            return 0.0
        try:
            target = float(_answer(record))
        except ValueError:
            raise PosttrainError(f"sample {record.get('id', '?')}: answer {record['answer']!r} is not a number") from None
        return 1.0 if abs(float(m.group()) - target) <= tolerance else 0.0

    return score


def regex_scorer(*, pattern: str, full: bool = True) -> Scorer:
    """1 when the output (stripped) matches `pattern`; `{answer}` in the pattern is the escaped answer."""

    def score(prompt: str, output: str, record: dict) -> float:
        pat = pattern.replace("{answer}", re.escape(_answer(record))) if "{answer}" in pattern else pattern
        match = re.fullmatch if full else re.search
        return 1.0 if match(pat, output.strip()) else 0.0

    return score


def verifier_scorer(*, task: str, reward: str = "exact") -> Scorer:
    """The verifier of a built-in task (addition, sorting): exact match, digit credit with reward: digits, or the
    completion's last number with reward: last_number."""
    from posttrain.tasks.base import verifier_for

    if task not in ("addition", "sorting"):
        raise PosttrainError(f"verifier scorer: task {task!r} has no built-in verifier; use addition or sorting")
    if reward not in ("exact", "digits", "last_number"):
        raise PosttrainError(f"verifier scorer: reward {reward!r} must be exact, digits or last_number")
    verify = verifier_for(reward)
    return lambda prompt, output, record: float(verify(_answer(record), output))


def python_scorer(*, hook: str) -> Scorer:
    """A user function `module:function` called as function(prompt, output, record) -> float."""
    module, _, name = hook.partition(":")
    if not module or not name:
        raise PosttrainError(f"python scorer: hook {hook!r} must look like package.module:function")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise PosttrainError(f"python scorer: cannot load {hook!r} ({e})",
                             hint="make the module importable (PYTHONPATH) and check the function name") from None
    return lambda prompt, output, record: float(fn(prompt, output, record))


class FunctionScorer:
    """A reward function (`path/to/file.py:name` or `package.module:name`, batch or per-sample, async or not; see
    rewards/functions.py) in its own child process, the same code path as `reward.functions` in training, so one
    text gets one score. `batch(rows)` scores a whole suite in one request (a batch function is called once, a
    per-sample one once per sample, as in training); calling the scorer itself scores one sample. A failure, or None
    (the function does not apply), stops the eval with a message naming the function and the sample: a suite
    scores every sample. `sources` (name -> sha256 of the function's file) goes into the suite's cache key, so
    editing the function invalidates cached results."""

    def __init__(self, fn: str, timeout_seconds: float = 10.0):
        from posttrain.config import RewardFunctionConfig
        from posttrain.rewards.functions import FunctionScorers, check_function

        self.fn, self.name = fn, fn.rpartition(":")[2]
        source = check_function(self.name, fn, "fn")
        self.sources = {self.name: source.sha256}
        self.scorers = FunctionScorers([RewardFunctionConfig(name=self.name, fn=fn)], timeout_seconds, 0.0,
                                       field="scorer")

    def batch(self, rows: list[dict]) -> tuple[list[float], None]:
        """rows: {prompt, output, record, tokens} per sample -> (score per sample, no components)."""
        fn_rows = [{"prompt": r["prompt"], "completion": r["output"], "answer": r["record"].get("answer"),
                    "completion_ids": None, "sample_id": str(r.get("id", r["record"].get("id", "?")))} for r in rows]
        values, errors = self.scorers.score(fn_rows, "eval")[self.name]
        for value, error, row in zip(values, errors, fn_rows):
            if error is not None:
                raise PosttrainError(f"function scorer {self.fn}: {error}")
            if value is None:
                raise PosttrainError(f"function scorer {self.fn}: returned None (does not apply) for sample "
                                     f"{row['sample_id']}", hint="an eval suite scores every sample: keep only "
                                     "samples the function applies to")
        return values, None

    def __call__(self, prompt: str, output: str, record: dict) -> float:
        return self.batch([{"prompt": prompt, "output": output, "record": record, "tokens": 0}])[0][0]


def function_scorer(*, fn: str, timeout_seconds: float = 10.0) -> Scorer:
    """See FunctionScorer."""
    return FunctionScorer(fn, timeout_seconds)


def score_outputs(scorer: Scorer, rows: list[dict]) -> tuple[list[float], list[dict] | None]:
    """Scores a suite's outputs. rows: {prompt, output, record, tokens} per sample. A scorer with a `batch` method
    (function scorers, the run's reward) gets every row in one call and may return per-sample components
    ({source: score}); any other scorer is called once per row."""
    batch = getattr(scorer, "batch", None)
    if batch is not None:
        scores, components = batch(rows)
        return [float(s) for s in scores], components
    return [float(scorer(r["prompt"], r["output"], r["record"])) for r in rows], None


def reward_model_scorer(*, path: str, chat_template: str = "auto", normalized: bool = True) -> Scorer:
    """A trained reward model (`posttrain rm train` writes one) in this process: its score of (prompt, output),
    normalized by the mean/std stored with the model unless normalized: false."""
    from posttrain.rewards.reward_model import RewardModel

    if not (Path(path) / "posttrain_reward.json").is_file():
        raise PosttrainError(f"reward_model scorer: {path} is not a reward-model directory (no posttrain_reward.json)",
                             hint="point path at the directory `posttrain rm train` wrote (rm.out)")
    rm = RewardModel(str(path), chat_template=chat_template)
    pick = rm.score if normalized else rm.raw_scores
    return lambda prompt, output, record: float(pick([(prompt, output)])[0])


def judge_scorer(*, url: str, cache: str | None = None, **judge_options) -> Scorer:
    """The LLM judge (rewards/judge.py) over an OpenAI-compatible endpoint; options are reward.judge's keys
    (model, template, score_regex, score_min, score_max, ...). The score is in [0, 1]; a failed request raises."""
    import tempfile

    from posttrain.config import JudgeConfig
    from posttrain.rewards.judge import JudgeReward

    if judge_options.get("api_key_env"):
        raise PosttrainError("judge scorer: api_key_env is not supported in suite files",
                             hint="serve the judge locally without a key, or score with a python hook")
    jcfg = JudgeConfig(url=url, **judge_options)
    judge = JudgeReward(jcfg, cache or Path(tempfile.gettempdir()) / "posttrain-eval-judge.sqlite")

    def score(prompt: str, output: str, record: dict) -> float:
        (result,) = judge.results([(prompt, output)])
        if result.error is not None:
            raise PosttrainError(f"judge scorer, sample {record.get('id', '?')}: {result.error}")
        return float(result.reward)

    return score


def gold_scorer(*, task: str = "addition") -> Scorer:
    """The hidden gold function of a built-in task (rewards/gold.py): digit credit minus a brevity term."""
    from posttrain.rewards.gold import gold_function

    gold = gold_function(task)
    if gold is None:
        raise PosttrainError(f"gold scorer: task {task!r} has no gold function; use addition")
    return lambda prompt, output, record: float(gold(_answer(record), output))


SCORERS: dict[str, ScorerFactory] = {
    "exact": exact_scorer,
    "numeric": numeric_scorer,
    "regex": regex_scorer,
    "verifier": verifier_scorer,
    "python": python_scorer,
    "reward_model": reward_model_scorer,
    "judge": judge_scorer,
    "gold": gold_scorer,
    "function": function_scorer,
}


def register_scorer(name: str, factory: ScorerFactory) -> None:
    """Makes `name` usable as a suite scorer type."""
    SCORERS[name] = factory


def build_scorer(spec: dict, *, where: str) -> Scorer:
    """Builds the scorer a suite names. `where` ("file, suite NAME") prefixes every error."""
    spec = dict(spec)
    kind = spec.pop("type", None)
    if kind not in SCORERS:
        raise PosttrainError(f"{where}, field scorer.type: unknown scorer {kind!r}; choose one of {', '.join(SCORERS)}")
    try:
        return SCORERS[kind](**spec)
    except TypeError as e:
        raise PosttrainError(f"{where}, field scorer: bad options for scorer {kind!r} ({e})") from None
    except PosttrainError as e:
        raise PosttrainError(f"{where}, field scorer: {e}") from None
