"""Webhook notifications (`ops.notify`): the run tells people what happened to it (started, finished, failed with
the command that resumes it, preempted, an alarm, a regressed gate) without anyone watching the terminal.

`Notifier.emit(event, **fields)` only puts the event on a bounded queue; a daemon thread POSTs it as JSON to every
webhook that wants it, with a per-request timeout and retries with exponential backoff (connection errors,
timeouts, HTTP 429 and 5xx; any other HTTP error will not heal by retrying). So the training loop never waits on a
webhook, and a webhook that is down costs nothing but a warning. One thread for all webhooks: events are few (a
handful per hour), so a slow webhook delaying another's delivery by seconds is cheaper than a thread each.

Nothing secret leaves: every body goes through tracking/redaction.py (secret-named keys, passwords in URLs, the
values of secret-looking environment variables, and the webhook URLs themselves), and a webhook URL is logged
and recorded as scheme://host only (a Slack URL is its own credential). Each outcome (delivered, failed after N
tries, dropped, unsent at exit) is a line of runs/<name>/notifications.jsonl, with the body that was sent.

Bodies: slack {"text": "posttrain run <name>: <event> · key: value · ..."}; generic {"event", "run", "time",
"fields": {...}}. Docs: docs/reliability.md, Notifications."""

from __future__ import annotations

import json
import math
import os
import queue
import sys
import threading
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from http.client import HTTPException
from pathlib import Path
from urllib.parse import urlsplit

from posttrain.config.ops import EVENTS
from posttrain.tracking.redaction import redact, redact_text, secret_env_values

RECORD_FILE = "notifications.jsonl"
# Events waiting for the sender. A run emits a few per hour, so a full queue means the webhooks have been failing
# for a long time: newer events are then dropped (counted, warned), never waited for.
QUEUE_SIZE = 256
# close() waits at most this long for the queue to drain: a dead webhook must not hold the process's exit (a
# preempted run's scheduler is counting down its grace period).
CLOSE_TIMEOUT_S = 10.0
MAX_VALUE_CHARS = 500  # of one field in the Slack line (a traceback-long error stays readable)
_STOP = object()


def url_host(url: str) -> str:
    """scheme://host[:port], the only part of a webhook URL ever logged (its path and query may be the secret)."""
    p = urlsplit(url)
    return f"{p.scheme}://{p.hostname}" + (f":{p.port}" if p.port else "")


def _jsonable(v):
    """A JSON-safe copy: non-finite floats -> None, tuples -> lists, anything else unknown -> str."""
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if v is None or isinstance(v, (bool, int, str)):
        return v
    return str(v)


def _fmt(key: str, v) -> str:
    if isinstance(v, float):
        text = f"{v:.4g}"
    elif isinstance(v, (dict, list)):
        text = json.dumps(v, separators=(",", ":"))
    else:
        text = " ".join(str(v).split())  # one line
    text = text if len(text) <= MAX_VALUE_CHARS else text[:MAX_VALUE_CHARS] + "…"
    return f"`{text}`" if key == "resume" else text  # a command to copy


def slack_text(run: str, event: str, fields: dict) -> str:
    """One readable line: the run, the event, then each field that is set."""
    facts = " · ".join(f"{k.replace('_', ' ')}: {_fmt(k, v)}" for k, v in fields.items() if v is not None)
    return f"posttrain run {run}: {event}" + (f" · {facts}" if facts else "")


def build_body(fmt: str, run: str, event: str, when: str, fields: dict, secrets: list[str]) -> dict:
    fields = redact(fields, secrets)
    if fmt == "slack":
        text = redact_text(slack_text(run, event, fields), secrets)  # again over the line as sent: cheap insurance
        # escaped last, as Slack's mrkdwn asks (so '<redacted>' shows as typed, not as a link)
        return {"text": text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")}
    return redact({"event": event, "run": run, "time": when, "fields": fields}, secrets)


def post_json(url: str, body: dict, timeout_s: float) -> int:
    """POSTs body as JSON; the HTTP status (2xx) or an exception (urllib.error.HTTPError for >= 400)."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "User-Agent": "posttrain"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        resp.read()
        return resp.status


def _describe(e: BaseException, timeout_s: float) -> str:
    if isinstance(e, urllib.error.HTTPError):
        return f"HTTP {e.code}"
    reason = getattr(e, "reason", e)  # URLError wraps the socket error
    if isinstance(reason, TimeoutError):
        return f"no answer within ops.notify_timeout_s={timeout_s:g}"
    return f"{type(reason).__name__}: {reason}"


class Notifier:
    """Built once per run (`from_config`); `emit` from the driver, `close` on every exit path. With no webhooks
    configured it is a no-op (no thread, no file)."""

    def __init__(self, run: str, targets: list, record_path: Path, timeout_s: float = 5.0, retries: int = 3,
                 backoff_s: float = 1.0, secret_values: list[str] = (), warn=None):
        self.run, self.targets, self.record_path = run, list(targets), Path(record_path)
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        # the webhook URLs are secrets too: a field that happens to hold one is redacted
        self.secrets = sorted({*secret_values, *(t.url for t in self.targets)}, key=len, reverse=True)
        self.warn = warn or (lambda m: print(m, file=sys.stderr, flush=True))
        self.dropped = 0
        self._closed = False
        self._lock = threading.Lock()  # notifications.jsonl is appended by the sender and by close()
        self._queue: queue.Queue = queue.Queue(maxsize=QUEUE_SIZE)
        self._thread = None
        if self.targets:
            self._thread = threading.Thread(target=self._send_loop, name="posttrain-notify", daemon=True)
            self._thread.start()

    @classmethod
    def from_config(cls, cfg, environ=None, warn=None) -> "Notifier":
        ops = cfg.ops
        return cls(cfg.name, ops.notify, cfg.run_dir / RECORD_FILE, ops.notify_timeout_s, ops.notify_retries,
                   ops.notify_backoff_s, secret_env_values(os.environ if environ is None else environ), warn)

    # ------------------------------------------------------------------ the driver's side

    def emit(self, event: str, **fields) -> None:
        """Queues `event` for the webhooks that want it and returns at once; never raises."""
        try:
            if event not in EVENTS:  # a bug in the caller, but a notification is never worth a failed run
                self.warn(f"notify: unknown event {event!r} not sent")
                return
            if self._closed or not any(event in t.events or "all" in t.events for t in self.targets):
                return
            item = (event, datetime.now(timezone.utc).isoformat(timespec="seconds"), _jsonable(fields))
            self._queue.put_nowait(item)
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 100 == 0:
                self.warn(f"notify: {self.dropped} event(s) dropped ({event} the latest): the webhooks are not "
                          f"keeping up (queue of {QUEUE_SIZE}); see {self.record_path}")
        except Exception as e:  # noqa: BLE001 - notifications must never end the run
            self.warn(f"notify: {event} not sent ({type(e).__name__}: {e})")

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Sends what is queued, waiting at most `timeout` seconds; what is left is recorded as unsent."""
        if self._thread is None or self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + timeout
        try:
            self._queue.put(_STOP, timeout=timeout)
        except queue.Full:
            pass
        self._thread.join(max(0.0, deadline - time.monotonic()))
        left = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not _STOP:
                left.append(item)
        for event, when, _ in left:
            self._record({"time": when, "event": event, "outcome": "unsent", "error": f"run ended; close waited {timeout:g} s"})
        if self.dropped:
            self._record({"time": datetime.now(timezone.utc).isoformat(timespec="seconds"), "outcome": "dropped",
                          "count": self.dropped})
        if left or self.dropped:
            self.warn(f"notify: {len(left)} event(s) unsent at exit, {self.dropped} dropped; see {self.record_path}")

    # ------------------------------------------------------------------ the sender thread

    def _send_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            event, when, fields = item
            for t in self.targets:
                if event in t.events or "all" in t.events:
                    try:
                        self._deliver(t, event, when, fields)
                    except Exception as e:  # noqa: BLE001 - a bug here must not stop later notifications
                        self.warn(f"notify: {event} to {url_host(t.url)} failed ({type(e).__name__})")

    def _deliver(self, target, event: str, when: str, fields: dict) -> None:
        body = build_body(target.format, self.run, event, when, fields, self.secrets)
        start, tries, status, error = time.monotonic(), 0, None, None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            tries += 1
            try:
                status, error = post_json(target.url, body, self.timeout_s), None
                break
            except urllib.error.HTTPError as e:
                status, error = e.code, _describe(e, self.timeout_s)
                if e.code != 429 and e.code < 500:
                    break
            except (OSError, HTTPException) as e:  # refused, unreachable, timed out (URLError is an OSError)
                status, error = None, _describe(e, self.timeout_s)
        host = url_host(target.url)
        error = redact_text(error, self.secrets) if error else None
        self._record({"time": when, "event": event, "target": host, "format": target.format,
                      "outcome": "delivered" if error is None else "failed", "tries": tries, "status": status,
                      "error": error, "seconds": round(time.monotonic() - start, 3), "body": body})
        if error:
            self.warn(f"notify: {event} to {host} failed after {tries} {'try' if tries == 1 else 'tries'} ({error}); "
                      f"see {self.record_path}")

    def _record(self, rec: dict) -> None:
        try:
            with self._lock:
                self.record_path.parent.mkdir(parents=True, exist_ok=True)
                with self.record_path.open("a") as f:
                    f.write(json.dumps(rec) + "\n")
        except OSError as e:
            self.warn(f"notify: cannot write {self.record_path} ({e.strerror})")
