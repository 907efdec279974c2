"""The zero-signal alarm: a run whose steps carry no learning signal must never train on nothing silently. A step
has no signal when no group's rewards differ (GRPO-family advantages are all zero; for algorithms without groups,
when every reward of the batch is equal) or when every sample's reward failed. A run that had a signal and whose
rewards then stopped differing at its best mean reward so far has converged, not stalled: such steps do not count
(one whose rewards stopped differing below its best has collapsed, and they do). After `alarms.no_signal_steps` such
steps in a row the run says so on the progress line, in metrics.jsonl (`alarm/no_signal`) and through ops.notify
(`no_signal`), and stops with EXIT_NO_SIGNAL unless `alarms.no_signal_action: warn`. `posttrain probe` answers the
same question before a run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

# sysexits.h EX_NOPERM is 77; here: "this config gives the algorithm nothing to learn from" (posttrain probe's
# no-signal verdict and the in-loop alarm). Distinct from 2 (bad input), 75 (preempted) and 76 (capacity).
EXIT_NO_SIGNAL = 77


class NoLearningSignal(Exception):
    """Raised by the loop when the alarm stops the run; the CLI exits with EXIT_NO_SIGNAL."""


@dataclass
class NoSignalWatch:
    """Counts consecutive steps without a learning signal (module docstring); `steps` 0 turns it off. `action`:
    alarms.no_signal_action; `notify(event, **fields)` and `log(text)`: the run's notifier and progress line."""

    steps: int
    action: str = "stop"
    notify: Callable = lambda event, **fields: None
    log: Callable = print
    in_a_row: int = 0
    had_signal: bool = False
    best_reward: float = float("-inf")  # the best step mean reward so far

    def after_step(self, record: dict, samples: int) -> str | None:
        """Feeds one step's metrics record; when the alarm fires, adds `alarm/no_signal` to the record, says so
        (the notification once per streak) and returns the message if the run must stop."""
        message = self.observe(record["signal_share"], record["reward_failures"], samples, record["reward_mean"])
        if message is None:
            return None
        record["alarm/no_signal"] = {"steps": self.in_a_row, "action": self.action}
        self.log(f"alarm: {message}" + ("" if self.action == "stop" else " (alarms.no_signal_action=warn: going on)"))
        if self.in_a_row == self.steps:
            self.notify("no_signal", step=record["step"], steps=self.in_a_row, action=self.action, message=message)
        return message if self.action == "stop" else None

    def observe(self, signal_share: float, failures: int, samples: int, reward_mean: float = 0.0) -> str | None:
        """The alarm's message once `steps` steps in a row had no signal (and at every such step after), else None."""
        converged = self.had_signal and reward_mean >= self.best_reward - 1e-9 and failures < samples
        empty = (signal_share == 0.0 and not converged) or failures >= samples
        self.had_signal = self.had_signal or signal_share > 0.0
        self.best_reward = max(self.best_reward, reward_mean)
        self.in_a_row = self.in_a_row + 1 if empty else 0
        if not self.steps or self.in_a_row < self.steps:
            return None
        why = ("every sample's reward failed" if failures >= samples
               else "no group's rewards differed, so every advantage was zero")
        return (f"no learning signal for {self.in_a_row} steps in a row: {why}; the policy is not being trained "
                "(run `posttrain probe` on this config for what to change: easier prompts, partial credit, SFT "
                "first, a larger group_size, more tokens)")
