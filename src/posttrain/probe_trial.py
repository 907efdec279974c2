"""`posttrain probe CONFIG --trial N`: which learning rate learns? N real steps from the config's start at the
config's learning rate and at others (a third and three times it by default, `--factors`), each a short run of
its own (runs/<name>-trial-lr<lr>/), each with its training reward's OLS slope per step and the slope's 95%
confidence interval (evals/progress_stats.py), and a recommendation: of the rates whose reward rose (one-sided
p < 0.05), the one with the largest lower confidence bound; none rose: say so, and what the learning monitor named
at each rate. Costs about 3 x N steps plus three starts; the report says how long it took."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from posttrain.config import RunConfig
from posttrain.evals.progress_stats import Trend, diagnose, t_upper_tail, trend

FACTORS = (1 / 3, 1.0, 3.0)
ALPHA = 0.05


def t_quantile(q: float, df: int) -> float:
    """The t with P(T > t) = 1 - q for Student's t with df degrees of freedom (bisection on t_upper_tail)."""
    lo, hi = -1e3, 1e3
    for _ in range(200):
        mid = (lo + hi) / 2
        if t_upper_tail(mid, df) > 1 - q:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def slope_ci(got: Trend, level: float = 0.95) -> tuple[float, float]:
    """The two-sided `level` confidence interval of a trend's slope; (-inf, inf) under 3 points."""
    if got.n < 3 or math.isinf(got.se):
        return (-math.inf, math.inf)
    half = t_quantile(1 - (1 - level) / 2, got.n - 2) * got.se
    return (got.slope - half, got.slope + half)


@dataclass(frozen=True)
class Arm:
    """One trial rate: its rewards per step, their trend, the slope's 95% interval and the monitor's cause."""

    lr: float
    rewards: list[float]
    trend: Trend
    ci: tuple[float, float]
    cause: str  # what the learning monitor's diagnosis names over the arm's steps ("" when the reward rose)
    seconds: float

    @property
    def learned(self) -> bool:
        return self.trend.rises(ALPHA)


def arm_of(lr: float, records: list[dict], seconds: float) -> Arm:
    rewards = [r["reward_mean"] for r in records]
    got = trend(rewards)
    cause = "" if got.rises(ALPHA) else diagnose(records, ALPHA).kind
    return Arm(lr, rewards, got, slope_ci(got), cause, seconds)


def recommend(arms: list[Arm]) -> tuple[Arm | None, str]:
    """The arm to use and the verdict line (module docstring)."""
    learned = [a for a in arms if a.learned]
    if not learned:
        named = "; ".join(f"lr {a.lr:.3g}: {a.cause}" for a in arms)
        return None, (f"no learning rate tried raised the reward in {arms[0].trend.n} steps ({named}): see "
                      "docs/evals.md 'Is it learning?' for each cause, or try more steps")
    best = max(learned, key=lambda a: a.ci[0])
    which = ", ".join(f"{a.lr:.3g}" for a in learned)
    return best, f"learned at lr {which}; use algorithm.lr={best.lr:.3g} (the largest lower bound of the slope)"


def arm_config(cfg: RunConfig, lr: float, steps: int) -> RunConfig:
    """The run of one arm: the config's own, at `lr`, N steps, under its own name, no evals nor checkpoints
    between, the monitor off (the trial reads the slope itself)."""
    over = {"name": f"{cfg.name}-trial-lr{lr:.3g}", "algorithm": {"lr": lr, "lr_schedule": "constant"},
            "train": {"steps": steps}, "eval": {"every": 0}, "checkpoint": {"every": 0},
            "alarms": {"no_progress_steps": 0}, "logging": {"progress": False}}
    data = cfg.model_dump()
    for key, value in over.items():
        data[key] = {**data[key], **value} if isinstance(value, dict) else value
    return type(cfg).model_validate(data)


def run_trial(cfg: RunConfig, steps: int, factors=FACTORS, log=print) -> list[Arm]:
    """Runs each arm (the loop, in this process) and returns them in the order of `factors`."""
    from posttrain.loop import train
    from posttrain.run_files import remove_run
    from posttrain.tracking import read_metrics

    arms = []
    for factor in factors:
        arm_cfg = arm_config(cfg, cfg.algorithm.lr * factor, steps)
        remove_run(arm_cfg.run_dir)
        t0 = time.perf_counter()
        train(arm_cfg, progress=False)
        records = [m for m in read_metrics(arm_cfg.run_dir) if "time/step" in m]
        arms.append(arm_of(arm_cfg.algorithm.lr, records, time.perf_counter() - t0))
        log(arm_line(arms[-1]))
    return arms


def arm_line(arm: Arm) -> str:
    lo, hi = arm.ci
    return (f"lr {arm.lr:.3g}: reward {arm.rewards[0]:.3f} -> {arm.rewards[-1]:.3f} over {len(arm.rewards)} steps, "
            f"slope {arm.trend.slope:+.3g}/step, 95% CI [{lo:+.3g}, {hi:+.3g}], one-sided p {arm.trend.p:.2g}"
            + ("" if arm.learned else f", not learning: {arm.cause}") + f" ({arm.seconds:.0f} s)")

