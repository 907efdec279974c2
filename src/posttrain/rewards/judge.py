"""RLAIF: a reward from an LLM judge behind an OpenAI-compatible /v1/chat/completions endpoint (vLLM's server,
a hosted API, ...). The judge sees `template` with {prompt} and {completion} filled in; `score_regex` pulls a
number out of its reply, mapped from [score_min, score_max] to [0, 1].

Replies are cached on disk (sqlite) by (prompt, completion, judge model, template), so a repeated sample costs no
request; the parser runs on every read, so changing it needs no new requests. A request that times out or fails
is retried with exponential backoff; a sample whose request or parse still fails gets the default reward and is
counted (`failures`). The API key is read once from the env var named in the config and only ever put in the
Authorization header: never in the cache, errors or logs.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

RETRY_STATUS = {408, 429, 500, 502, 503, 504}


@dataclass
class JudgeResult:
    reward: float
    error: str | None = None   # why this sample got the default reward
    cached: bool = False        # the reply came from the cache
    reply: str | None = None    # the judge's reply text, None when the request failed


def cache_key(prompt: str, completion: str, model: str, template: str) -> str:
    return hashlib.sha256(json.dumps([prompt, completion, model, template]).encode()).hexdigest()


def fill_template(template: str, prompt: str, completion: str) -> str:
    """Replaces {prompt} and {completion}; other braces are left alone (templates often show JSON)."""
    return template.replace("{prompt}", prompt).replace("{completion}", completion)


def parse_score(reply: str, pattern: str, lo: float, hi: float) -> tuple[float | None, str | None]:
    """(reward in [0, 1], None) or (None, why): group 1 (or the whole match) of the first match of `pattern`,
    mapped linearly from [lo, hi]; a score outside [lo, hi] is an error, not clipped."""
    m = re.search(pattern, reply)
    if m is None:
        return None, f"no score in judge reply {reply[:80]!r}"
    text = m.group(1) if m.groups() else m.group(0)
    try:
        value = float(text)
    except ValueError:
        return None, f"judge score {text!r} is not a number"
    if not lo <= value <= hi:
        return None, f"judge score {value} outside [{lo}, {hi}]"
    return (value - lo) / (hi - lo), None


class ReplyCache:
    """sqlite key -> reply text. Used from one thread (the caller's)."""

    def __init__(self, path: str | Path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(path))
        self.db.execute("CREATE TABLE IF NOT EXISTS replies (key TEXT PRIMARY KEY, reply TEXT NOT NULL)")

    def get(self, key: str) -> str | None:
        row = self.db.execute("SELECT reply FROM replies WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def put_many(self, items: list[tuple[str, str]]) -> None:
        self.db.executemany("INSERT OR REPLACE INTO replies VALUES (?, ?)", items)
        self.db.commit()

    def close(self) -> None:
        self.db.close()


class JudgeReward:
    """Scores (prompt, completion) pairs with the judge. Counters: requests (HTTP attempts), lookups, cache_hits,
    failures (samples given the default)."""

    def __init__(self, jcfg, cache_path: str | Path, api_key: str | None = None, default: float = 0.0,
                 concurrency: int = 8):
        self.cfg = jcfg
        self.url = jcfg.url.rstrip("/") + "/chat/completions"
        self._api_key = api_key
        self.default = default
        self.cache = ReplyCache(cache_path)
        self.concurrency = concurrency
        self.requests = self.lookups = self.cache_hits = self.failures = 0

    def __repr__(self) -> str:  # never shows the key
        return f"JudgeReward(url={self.url!r}, model={self.cfg.model!r})"

    def _ask(self, message: str) -> str:
        """The judge's reply text; raises after the last retry fails."""
        body = json.dumps({"model": self.cfg.model, "messages": [{"role": "user", "content": message}],
                           "max_tokens": self.cfg.max_tokens, "temperature": 0.0}).encode()
        headers = {"Content-Type": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        delay = self.cfg.backoff_s
        for attempt in range(self.cfg.retries + 1):
            self.requests += 1
            try:
                req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
                with urllib.request.urlopen(req, timeout=self.cfg.timeout_s) as resp:
                    return json.loads(resp.read())["choices"][0]["message"]["content"] or ""
            except urllib.error.HTTPError as e:
                err: Exception = RuntimeError(f"judge HTTP {e.code}")
                if e.code not in RETRY_STATUS:
                    raise err from None
            except (urllib.error.URLError, TimeoutError, OSError) as e:
                err = RuntimeError(f"judge request failed: {getattr(e, 'reason', e)}")
            if attempt < self.cfg.retries:
                time.sleep(delay)
                delay *= 2
        raise err

    def _ask_safely(self, message: str) -> tuple[str | None, str | None]:
        try:
            return self._ask(message), None
        except Exception as e:  # noqa: BLE001 — any failure of one sample becomes that sample's error
            return None, str(e)

    def results(self, pairs: list[tuple[str, str]]) -> list[JudgeResult]:
        c = self.cfg
        keys = [cache_key(p, x, c.model, c.template) for p, x in pairs]
        replies: dict[str, str | None] = {}
        errors: dict[str, str] = {}
        cached = set()
        for k in keys:
            self.lookups += 1
            if k in replies or k in cached:
                self.cache_hits += 1
                continue
            hit = self.cache.get(k)
            if hit is not None:
                self.cache_hits += 1
                cached.add(k)
                replies[k] = hit
        todo = {k: fill_template(c.template, p, x) for k, (p, x) in zip(keys, pairs) if k not in replies}
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            answers = list(pool.map(self._ask_safely, todo.values()))
        for k, (reply, err) in zip(todo, answers):
            replies[k] = reply
            if err:
                errors[k] = err
        self.cache.put_many([(k, r) for k, r in replies.items() if r is not None and k in todo])
        out = []
        for k in keys:
            reply = replies.get(k)
            if reply is None:
                out.append(JudgeResult(self.default, errors.get(k, "no reply")))
            else:
                value, err = parse_score(reply, c.score_regex, c.score_min, c.score_max)
                out.append(JudgeResult(self.default if value is None else value, err, k in cached, reply))
        self.failures += sum(r.error is not None for r in out)
        return out

    def score(self, pairs: list[tuple[str, str]]) -> list[float]:
        return [r.reward for r in self.results(pairs)]

    def close(self) -> None:
        self.cache.close()


def make_judge(cfg, run_dir: str | Path) -> JudgeReward:
    """The judge of a run config, with its key read from the environment here (the edge) and the cache under the
    run directory unless reward.judge.cache names one."""
    import os

    from posttrain.errors import PosttrainError

    j = cfg.reward.judge
    key = None
    if j.api_key_env:
        key = os.environ.get(j.api_key_env)
        if not key:
            raise PosttrainError(f"reward.judge.api_key_env: environment variable {j.api_key_env} is not set",
                                 hint=f"export {j.api_key_env}=<key>, or unset reward.judge.api_key_env")
    return JudgeReward(j, j.cache or Path(run_dir) / "judge-cache.sqlite", key, cfg.reward.default)
