"""The run config's reward sections: how samples are scored (sources and weights, user reward functions, the LLM
judge) and what a failed score becomes. Part of the one run config (config/__init__.py re-exports these classes)."""

from __future__ import annotations

import re

from pydantic import Field, model_validator

from posttrain.config.base import _Section

# the built-in reward sources: names used in `reward.weights` and logged as `reward/<name>` (rewards/compose.py)
SOURCES = ("verifier", "rm", "judge", "length", "format", "environment")


class JudgeConfig(_Section):
    """An LLM judge over an OpenAI-compatible /v1/chat/completions endpoint (RLAIF)."""

    url: str | None = Field(None, description="Base URL of the endpoint, e.g. http://127.0.0.1:8000/v1.")
    model: str = Field("judge", description="Model name sent in the request.")
    template: str = Field(
        "Rate the answer to the question from 0 to 10.\nQuestion: {prompt}\nAnswer: {completion}\nScore:",
        description="User message; {prompt} and {completion} are filled in.",
    )
    score_regex: str = Field(r"(-?\d+(?:\.\d+)?)", description="First match's group 1 is the score.")
    score_min: float = Field(0.0, description="Lowest valid score; scores outside [min, max] are failures.")
    score_max: float = Field(10.0, description="Highest valid score; the reward is (score - min) / (max - min).")
    max_tokens: int = Field(8, gt=0, description="Longest judge reply (tokens).")
    timeout_s: float = Field(30.0, gt=0, description="Per-request timeout (seconds).")
    retries: int = Field(2, ge=0, description="Retries after a failed request (exponential backoff).")
    backoff_s: float = Field(0.5, ge=0, description="First retry delay (seconds); doubles each retry.")
    api_key_env: str | None = Field(None, description="Name of the env var holding the API key (never logged).")
    cache: str | None = Field(None, description="sqlite cache file (default: <run dir>/judge-cache.sqlite).")


class RewardFunctionConfig(_Section):
    """One reward function from user code (rewards/functions.py): batch or per-sample, sync or async."""

    name: str = Field(description="Its source name: logged as reward/<name>, failures as reward_failures/<name>/<kind>.")
    fn: str = Field(description="path/to/file.py:function or package.module:function.")
    weight: float = Field(1.0, description="Its weight in the reward (0 = logged only).")


class RewardConfig(_Section):
    """How samples are scored: sources, their weights, and what a failed score becomes."""

    default: float = Field(0.0, description="Reward given to a sample whose scoring failed (error, NaN, wrong type).")
    timeout_seconds: float = Field(
        10.0, gt=0, description="Per-sample limit on a verifier: it runs in a child process of the reward worker, "
        "killed past this (the sample gets the default reward and counts as a timeout failure).",
    )
    max_failure_fraction: float = Field(
        0.5, ge=0, le=1, description="Abort the run when more than this share of the samples of the last "
        "failure_window_steps steps failed to score (1 = never abort).",
    )
    failure_window_steps: int = Field(10, ge=1, description="Steps over which max_failure_fraction is measured.")
    weights: dict[str, float] = Field(
        default_factory=lambda: {"verifier": 1.0},
        description="Reward = sum of weight * source over these sources: verifier, rm (normalized reward-model score), "
        "judge (LLM judge, in [0, 1]), length (-tokens/max_new_tokens), format (1 if format_regex matches). Each "
        "is logged as reward/<source>.",
    )
    rm_path: str | None = Field(None, description="Reward-model directory (`posttrain rm train` writes one) for the rm source.")
    rm_ensemble: list[str] = Field(
        default_factory=list,
        description="More reward-model directories scored beside rm_path in the same actor: the rm source becomes the "
        "mean of all members' normalized scores, and reward/rm_disagreement logs the batch mean of the per-sample std "
        "across members (alarm rm_disagreement). Empty = one reward model.",
    )
    rm_cpus: float = Field(0.25, gt=0, description="Logical CPUs reserved for the reward-model actor.")
    format_regex: str = Field(r"\d+", description="Regex the whole stripped completion must match for format = 1.")
    log_gold: bool = Field(False, description="Log the task's hidden gold score (reward/gold; built-in addition only).")
    judge: JudgeConfig = Field(default_factory=lambda: JudgeConfig())
    functions: list[RewardFunctionConfig] = Field(
        default_factory=list,
        description="Reward functions from user code, each {name, fn, weight}: batch fn(prompts, completions, **columns) "
        "-> list[float|None] (TRL's form) or per-sample fn(prompt, completion, **columns) -> float|None, async or not; "
        "None = does not apply (left out of the mean). Each adds weight * score, runs in a child process of the "
        "reward worker under timeout_seconds, and is logged as reward/<name>. Built-in: fn: math_answer (final "
        "answers of math word problems, math-verify). See docs/rewards.md.",
    )
    strict_resume: bool = Field(
        False, description="--resume refuses (instead of warning) when a reward function's source file changed since "
        "the checkpoint (sha256).",
    )

    @model_validator(mode="after")
    def _check_sources(self) -> "RewardConfig":
        unknown = sorted(set(self.weights) - set(SOURCES))
        if unknown:
            raise ValueError(f"reward.weights: unknown source(s) {unknown}; use any of {list(SOURCES)} (reward "
                             "functions take their weight in reward.functions)")
        seen: set[str] = set()
        for i, f in enumerate(self.functions):
            if not re.fullmatch(r"[A-Za-z0-9_.-]+", f.name) or f.name in (*SOURCES, "gold", "rm_disagreement"):
                raise ValueError(f"reward.functions.{i}.name={f.name!r}: use letters, digits, '_', '.' or '-', and "
                                 f"not a built-in source name ({', '.join(SOURCES)}, gold, rm_disagreement)")
            if f.name in seen:
                raise ValueError(f"reward.functions.{i}.name={f.name!r} is used twice; each function needs its own name")
            seen.add(f.name)
        if self.weights.get("rm") and not self.rm_path:
            raise ValueError("reward.weights has an 'rm' weight but reward.rm_path is not set; point it at a "
                             "reward-model directory (`posttrain rm train` writes one)")
        if self.rm_ensemble and not self.weights.get("rm"):
            raise ValueError("reward.rm_ensemble is set but reward.weights has no 'rm' weight; add one (e.g. "
                             "{rm: 1.0}) and set reward.rm_path to the first member")
        if self.weights.get("judge") and not self.judge.url:
            raise ValueError("reward.weights has a 'judge' weight but reward.judge.url is not set")
        return self
