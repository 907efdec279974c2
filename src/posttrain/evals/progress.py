"""The learning monitor: a run whose reward does not rise says so within `alarms.no_progress_steps` steps, and what
to try. After every step from the N-th on, the training reward's OLS trend (evals/progress_stats.py) is tested
over the last N steps and over the whole run so far; the run counts as learning while either rises at one-sided
ALPHA (a run that rose and then levelled off keeps its rise in the second). When neither rises while some group
has a signal (without any, the zero-signal alarm speaks, evals/no_signal.py, unless an update of the window jumped:
a learning rate too high can wipe the signal out in one step), or when the training reward rises
and the held-out accuracy of the window's evals does not (a held-out/training gap), the alarm fires: the likely
cause, with the figure behind it, goes into the step's metrics record (`alarm/no_progress`), onto the progress
line (when it first fires and whenever the cause changes) and once to ops.notify (`no_progress`); the first step it
fired goes into summary.json (`no_progress`). `alarms.no_progress_action: stop` ends the run there with a
checkpoint and EXIT_NO_PROGRESS. A resumed run replays its metrics.jsonl into the history first (`replay`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from posttrain.evals.progress_stats import Cause, diagnose, heldout_gap, policy_cause, trend

# sysexits.h EX_CONFIG is 78: "the run learns nothing with these settings" (the reward has a signal, the settings
# do not turn it into learning). Distinct from 77 (no signal at all), 75 (preempted), 76 (capacity) and 2.
EXIT_NO_PROGRESS = 78
ALPHA = 0.05  # one-sided level of "the reward rises"
# What the monitor keeps of each step's record (a run's whole history: a few floats per step).
KEYS = ("step", "reward_mean", "signal_share", "update_ratio", "entropy", "clip_fraction", "kl", "truncated_share",
        "eval/heldout_accuracy")


class NoProgress(Exception):
    """Raised by the loop when the monitor stops the run; the CLI exits with EXIT_NO_PROGRESS."""


@dataclass
class ProgressWatch:
    """Watches the run's metrics for learning (module docstring); `steps` 0 turns it off. `action`:
    alarms.no_progress_action; `notify(event, **fields)` and `log(text)`: the run's notifier and progress line."""

    steps: int
    action: str = "warn"
    notify: Callable = lambda event, **fields: None
    log: Callable = print
    history: list[dict] = field(default_factory=list)
    first: dict | None = None  # {step, cause, figure} of the first firing
    last_kind: str | None = None

    def after_step(self, record: dict) -> str | None:
        """Feeds one step's metrics record; when the alarm fires, adds `alarm/no_progress` to the record, says so
        and returns the message if the run must stop."""
        self.history.append({k: record.get(k) for k in KEYS})
        cause = self.observe()
        if cause is None:
            return None
        record["alarm/no_progress"] = {"cause": cause.kind, "figure": cause.figure, "steps": self.steps,
                                       "action": self.action}
        message = f"not learning over the last {self.steps} steps: {cause.message}"
        if self.first is None:
            self.first = {"step": record["step"], "cause": cause.kind, "figure": cause.figure}
            self.notify("no_progress", step=record["step"], steps=self.steps, cause=cause.kind, figure=cause.figure,
                        action=self.action, message=message)
        if cause.kind != self.last_kind:
            self.log(f"alarm: {message}"
                     + ("" if self.action == "stop" else " (alarms.no_progress_action=warn: going on)"))
        self.last_kind = cause.kind
        return message if self.action == "stop" else None

    def observe(self) -> Cause | None:
        """The likely cause when the last `steps` steps did not learn (module docstring), else None."""
        if not self.steps or len(self.history) < self.steps:
            return None
        window = self.history[-self.steps:]
        rewards = [r["reward_mean"] for r in self.history]
        if trend(rewards[-self.steps:]).rises(ALPHA) or trend(rewards).rises(ALPHA):
            return heldout_gap(window, ALPHA)
        if not any(r["signal_share"] for r in window):
            # no signal at all is the zero-signal alarm's case, unless an update of the window jumped (a learning
            # rate too high can wipe the signal out in one step: that is the cause to name)
            jumped = policy_cause(window)
            return jumped if jumped is not None and jumped.kind == "jumps" else None
        return diagnose(window, ALPHA)

    def replay(self, records: list[dict]) -> None:
        """A resumed run's steps so far (metrics.jsonl as the resume left it), fed to the history without firing
        again; the first firing among them is kept for summary.json."""
        for record in records:
            if "time/step" not in record:  # eval and checkpoint lines
                continue
            self.history.append({k: record.get(k) for k in KEYS})
            fired = record.get("alarm/no_progress")
            if isinstance(fired, dict):
                if self.first is None:
                    self.first = {"step": record["step"], "cause": fired.get("cause"), "figure": fired.get("figure")}
                self.last_kind = fired.get("cause")

    def summary(self) -> dict:
        return {"no_progress": self.first}
