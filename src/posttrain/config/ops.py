"""The run config's operations section: who is told what happens to a run while nobody watches it (webhook
notifications, tracking/notify.py). Part of the one run config (config/__init__.py re-exports these classes)."""

from __future__ import annotations

import difflib
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, model_validator

from posttrain.config.base import _Section

# Every event a run can notify about. Declared here, in one place, so that a config naming one that later work
# emits (node loss, hangs) is valid today, and a misspelt one is an error, not a webhook that never fires.
EVENTS = {
    "run_started": "the run started or resumed",
    "run_finished": "the run finished (steps, held-out accuracy before/after, wall time, final checkpoint)",
    "run_failed": "the run failed (the error, and the command that resumes it)",
    "run_preempted": "SIGTERM: checkpoint written, exit 75 (the step, and the command that resumes it)",
    "node_lost": "a Ray node left the cluster",
    "node_recovered": "capacity came back and the run goes on",
    "hang_detected": "a remote call ran far past its recent median",
    "hang_recovered": "the hung actor was restarted and its work redone",
    "alarm_fired": "a reward-hacking alarm fired (alarms.rules)",
    "no_signal": "no learning signal for alarms.no_signal_steps steps in a row (no group's rewards differ, or every "
                 "reward failed)",
    "no_progress": "the learning monitor found the reward not rising over alarms.no_progress_steps steps (the "
                   "likely cause and its figure)",
    "gate_regressed": "the in-loop eval gate found a checkpoint significantly worse than the previous or the best",
}
SLACK_HOST = "hooks.slack.com"


def _host(url: str) -> str | None:
    """The URL's host, or None when it has none or cannot be parsed (a bad port, an unclosed '[')."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number
        return parts.hostname
    except ValueError:
        return None


class NotifyTarget(_Section):
    """One webhook: where to POST, which events, in which body format."""

    url: str = Field(description="http(s) URL the JSON is POSTed to. Treated as a secret (a Slack URL is one): only "
                     "its scheme and host are ever logged.")
    events: list[str] = Field(default_factory=lambda: ["all"],
                              description=f"Events sent to it, or [all]: {', '.join(EVENTS)}.")
    format: Literal["slack", "generic"] = Field(
        "generic", description="slack: {\"text\": one line}; generic: {event, run, time, fields}. Unset: slack "
        f"when the host is {SLACK_HOST}, else generic.",
    )

    @model_validator(mode="before")
    @classmethod
    def _format_from_host(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("format") is None and isinstance(data.get("url"), str):
            data = {**data, "format": "slack" if _host(data["url"]) == SLACK_HOST else "generic"}
        return data


class OpsConfig(_Section):
    """Operations: notifications about the run's lifecycle (see docs/reliability.md, Notifications)."""

    notify: list[NotifyTarget] = Field(
        default_factory=list,
        description="Webhooks, each {url, events, format}: url http(s) (a secret: only its host is logged); events "
        f"a list of {', '.join(EVENTS)}, or [all] (the default); format slack ({{text}}) or generic ({{event, run, "
        f"time, fields}}), unset: slack when the host is {SLACK_HOST}, else generic. Sent from a background thread "
        "(never blocks training) with retries and backoff; secrets are redacted from every body; each outcome is "
        "recorded in runs/<name>/notifications.jsonl. Empty = none. See docs/reliability.md.",
    )
    notify_timeout_s: float = Field(5.0, gt=0, description="Per-request timeout of a webhook POST (seconds).")
    notify_retries: int = Field(3, ge=0, description="Retries after a failed POST (connection error, timeout, HTTP 429 "
                                "or 5xx); other HTTP errors are not retried.")
    notify_backoff_s: float = Field(1.0, ge=0, description="First retry delay (seconds); doubles each retry.")
    watchdog: bool = Field(True, description="Hang detection: a remote call (generate, reward, reference, train, "
                           "sync, eval) running far past its recent median is a hang: every actor's Python stacks go "
                           "to runs/<name>/hangs/<step>/, the hung actor is restarted and its work redone.")
    hang_factor: float = Field(5.0, description="A call is hung when it runs longer than hang_factor x the median of "
                               "its kind's recent durations (and at least hang_min_seconds). Must be > 1.")
    hang_min_seconds: float = Field(60.0, gt=0, description="No call is called hung before this many seconds.")
    hang_cold_seconds: float = Field(900.0, gt=0, description="The bound for a kind of call with fewer than 3 "
                                     "measured durations (the first generate compiles kernels; a first step is slow).")
    capacity_wait_s: float = Field(300.0, ge=0, description="When roles are lost (a node died, a trainer rank hung) "
                                   "and the cluster cannot hold the plan any more, wait this long for capacity to "
                                   "come back and resume from the last checkpoint in process; then exit 76 naming "
                                   "what is missing (resume with --resume once capacity is back).")

    @model_validator(mode="after")
    def _check_targets(self) -> "OpsConfig":
        if self.hang_factor <= 1:
            raise ValueError(f"ops.hang_factor={self.hang_factor}: must be > 1 (a call is hung when it runs "
                             "hang_factor times longer than its recent median); 5 is a good start")
        allowed = ["all", *EVENTS]
        for i, t in enumerate(self.notify):
            scheme, host = t.url.partition("://")[0].lower() if "://" in t.url else "", _host(t.url)
            if scheme not in ("http", "https") or not host:
                # the URL itself is not echoed: a webhook URL is a secret
                what = f"scheme {scheme!r}" if scheme else "no scheme"
                raise ValueError(f"ops.notify.{i}.url is not an http(s) URL with a host ({what}"
                                 f"{'' if host else ', no valid host:port'}); a webhook URL looks like "
                                 "https://hooks.slack.com/services/... or http://host:port/path")
            if not t.events:
                raise ValueError(f"ops.notify.{i}.events is empty: list the events to send, or [all]")
            for name in t.events:
                if name not in allowed:
                    close = difflib.get_close_matches(name, allowed, n=1)
                    tip = f" (did you mean '{close[0]}'?)" if close else ""
                    raise ValueError(f"ops.notify.{i}.events: unknown event {name!r}{tip}; allowed: {', '.join(allowed)}")
        return self
