"""The numbers `posttrain probe` reports, as pure functions of the sampled rewards: pass@1 and pass@K, the share of
groups with a learning signal, each reward source's distribution, and the verdict with its next steps. The
sampling and scoring around them is probe.py."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# A run whose groups carry a signal less often than this learns slowly: most of each step is thrown away.
WEAK_SIGNAL_SHARE = 0.25
# Past this pass@1 most groups are all-correct: little left to learn.
TOO_EASY_PASS1 = 0.9
# Past this share of completions cut at max_new_tokens, the reward may be judging unfinished answers.
MANY_CUT_SHARE = 0.3


def groups_of(values: list[float], k: int) -> list[list[float]]:
    if len(values) % k:
        raise ValueError(f"{len(values)} values do not split into groups of {k}")
    return [values[i:i + k] for i in range(0, len(values), k)]


def signal_share(rewards: list[float], k: int) -> float:
    """Share of prompts whose k rewards are not all equal: GRPO's advantages are zero for the others."""
    groups = groups_of(rewards, k)
    return sum(max(g) - min(g) > 1e-12 for g in groups) / len(groups)


def pass_at(successes: list[bool], k: int) -> tuple[float, float]:
    """(pass@1, pass@k) from k samples per prompt: the mean success rate, and the share of prompts with at least
    one success among their k samples."""
    groups = groups_of([float(s) for s in successes], k)
    return sum(sum(g) / k for g in groups) / len(groups), sum(max(g) > 0 for g in groups) / len(groups)


def expected_signal_share(successes: list[bool], k: int, group_size: int) -> float:
    """For a pass/fail reward: the expected share of groups of `group_size` with a signal, from each prompt's
    measured success rate p: 1 - p^G - (1 - p)^G (a group has a signal unless all pass or all fail)."""
    rates = [sum(g) / k for g in groups_of([float(s) for s in successes], k)]
    return sum(1 - p ** group_size - (1 - p) ** group_size for p in rates) / len(rates)


@dataclass
class SourceStats:
    mean: float
    std: float
    minimum: float
    maximum: float
    nonzero: float  # share of the scored samples with a non-zero score
    scored: int     # samples it applied to (a function's None leaves a sample out)


def source_stats(values: list[float | None]) -> SourceStats | None:
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return None
    mean = sum(xs) / len(xs)
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))
    return SourceStats(mean, std, min(xs), max(xs), sum(x != 0 for x in xs) / len(xs), len(xs))


@dataclass
class Verdict:
    name: str                 # "no-signal", "reward-fails", "weak-signal", "too-easy", "ok"
    summary: str
    next_steps: list[str] = field(default_factory=list)


def verdict(signal: float, pass1: float, cut: float, failure_share: float, k: int) -> Verdict:
    """What the probe's numbers say about training this config, with concrete next steps."""
    more_tokens = (f"raise rollout.max_new_tokens: {100 * cut:.0f}% of the completions were cut before they ended"
                   if cut > MANY_CUT_SHARE else None)
    if failure_share >= 1.0:
        return Verdict("reward-fails", "the reward failed on every sample: nothing can be learned from it",
                       ["fix the reward (the failures are listed below)"])
    if signal == 0.0:
        steps = [s for s in (
            more_tokens,
            "make the prompts easier (or mix in easier ones) until some samples succeed",
            "give partial credit: a reward that grades near misses (format, the right kind of answer) varies "
            "within a group where pass/fail does not",
            "warm-start with SFT on solved examples (`posttrain sft`) so the policy succeeds sometimes",
            f"sample more per prompt (a larger algorithm.group_size; this probe used K={k})",
        ) if s]
        return Verdict("no-signal", f"no prompt's {k} samples differ in reward: GRPO would train on nothing", steps)
    steps = [s for s in (more_tokens,) if s]
    if signal < WEAK_SIGNAL_SHARE:
        return Verdict("weak-signal", f"only {100 * signal:.0f}% of the prompts' samples differ in reward: learning "
                       "will be slow", steps + ["keep algorithm.skip_zero_variance_groups on, raise group_size, or "
                                                "add partial credit"])
    if pass1 > TOO_EASY_PASS1:
        return Verdict("too-easy", f"pass@1 is {100 * pass1:.0f}%: little is left to learn on these prompts",
                       steps + ["use harder prompts, or evaluate whether training is needed at all"])
    return Verdict("ok", f"{100 * signal:.0f}% of the prompts carry a learning signal: RL should work", steps)


def trainer_peak_text(measured_gb: float, predicted_gb: float | None) -> str:
    """'trainer peak 3.10 GB measured, 2.90 GB predicted (-6%)': the measured peak resident memory beside the
    planner's prediction, the gap as a share of the measurement."""
    text = f"trainer peak {measured_gb:.2f} GB measured"
    if predicted_gb is None or measured_gb <= 0:
        return text
    return text + f", {predicted_gb:.2f} GB predicted ({100 * (predicted_gb - measured_gb) / measured_gb:+.0f}%)"
