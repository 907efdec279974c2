"""The RLAIF judge against a real vLLM OpenAI-compatible server (started once for the module on 127.0.0.1 with
the random tiny model and an API key): cache hits on a second pass, failures counted per sample for a parser that
cannot parse, a timeout and a wrong key, and the key sent but never written."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from posttrain.config import load_config
from posttrain.rewards.judge import JudgeReward, cache_key, fill_template, make_judge, parse_score
from posttrain.errors import PosttrainError

KEY = "sk-test-4f1c9e"  # what the server demands; must reach it, and never a file
TEMPLATE = "{prompt}{completion}"
# Renders only the message contents: the char tokenizer has no chat template of its own.
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def test_parse_score_and_template_by_hand():
    assert parse_score("s7s7", r"(\d)", 0, 9) == (pytest.approx(7 / 9), None)
    assert parse_score("score: 7.5/10", r"(-?\d+(?:\.\d+)?)", 0, 10) == (0.75, None)
    value, err = parse_score("zzz", r"(\d)", 0, 9)
    assert value is None and "no score" in err
    value, err = parse_score("42", r"(\d+)", 0, 10)
    assert value is None and "outside" in err
    assert fill_template('{prompt} -> {completion} {"json": 1}', "a", "b") == 'a -> b {"json": 1}'
    assert cache_key("p", "c", "m", "t") != cache_key("p", "c", "m", "t2") != cache_key("p", "c", "m2", "t")


def test_missing_key_env_is_a_user_error(tmp_path, monkeypatch):
    monkeypatch.delenv("POSTTRAIN_TEST_NO_SUCH_KEY", raising=False)
    cfg = load_config(None, ["reward.judge.url=http://127.0.0.1:1/v1", "reward.judge.api_key_env=POSTTRAIN_TEST_NO_SUCH_KEY"])
    with pytest.raises(PosttrainError, match="POSTTRAIN_TEST_NO_SUCH_KEY is not set"):
        make_judge(cfg, tmp_path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def judge_server(tmp_path_factory, tiny_model_dir):
    tmp = tmp_path_factory.mktemp("judge")
    (tmp / "chat.jinja").write_text(CHAT_TEMPLATE)
    port = _free_port()
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_HOST_IP="127.0.0.1", VLLM_ENABLE_V1_MULTIPROCESSING="0",
               OMP_NUM_THREADS="1")
    log = open(tmp / "server.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", tiny_model_dir,
         "--served-model-name", "judge", "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "128",
         "--dtype", "float32", "--enforce-eager", "--chat-template", str(tmp / "chat.jinja"), "--api-key", KEY],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.time() + 240
        while True:
            try:
                req = urllib.request.Request(url + "/models", headers={"Authorization": f"Bearer {KEY}"})
                urllib.request.urlopen(req, timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"vLLM server did not start: {(tmp / 'server.log').read_text()[-2000:]}")
                time.sleep(0.1)
        yield url, tmp
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _judge_cfg(url: str, *extra: str):
    return load_config(None, [f"reward.judge.url={url}", "reward.judge.model=judge", f"reward.judge.template={TEMPLATE}",
                              r"reward.judge.score_regex=(\d)", "reward.judge.score_min=0", "reward.judge.score_max=9",
                              "reward.judge.retries=1", "reward.judge.backoff_s=0.05",
                              "reward.judge.api_key_env=POSTTRAIN_TEST_JUDGE_KEY", "reward.default=-1", *extra])


PAIRS = [(f"{a}+{b}=", c) for a, b in [(12, 34), (5, 77), (301, 9), (48, 48)] for c in ("46", "x", "1000")]


def test_judge_scores_caches_and_counts_failures(judge_server, tmp_path, monkeypatch):
    url, server_dir = judge_server
    monkeypatch.setenv("POSTTRAIN_TEST_JUDGE_KEY", KEY)
    cfg = _judge_cfg(url)
    judge = make_judge(cfg, tmp_path)
    first = judge.results(PAIRS)
    # every request reached the server with the key (it answers 401 without it) and got a reply
    assert all(r.reply is not None for r in first), [r.error for r in first]
    for r in first:  # the parser's verdict, redone by hand from the reply
        m = re.search(r"\d", r.reply)
        assert (r.error is None) == (m is not None)
        assert r.reward == (pytest.approx(int(m.group()) / 9) if m else -1.0)
    assert sum(r.error is None for r in first) >= 1, [r.reply for r in first]
    assert judge.requests == len(PAIRS) and judge.cache_hits == 0
    first_failures = judge.failures

    second = judge.results(PAIRS)  # the same samples again: all from the cache, no request
    assert judge.requests == len(PAIRS) and judge.cache_hits == len(PAIRS) and all(r.cached for r in second)
    assert [r.reward for r in second] == [r.reward for r in first]
    hit_rate = judge.cache_hits / judge.lookups
    assert hit_rate == 0.5  # 12 misses then 12 hits
    judge.close()

    # a new judge on the same cache file with a parser that cannot parse: every sample fails, no request made
    bad = make_judge(_judge_cfg(url, "reward.judge.score_regex=SCORE=(\\d)"), tmp_path)
    results = bad.results(PAIRS)
    assert bad.requests == 0 and bad.cache_hits == len(PAIRS)
    assert bad.failures == len(PAIRS) and all(r.reward == -1.0 and "no score" in r.error for r in results)
    bad.close()

    # the key went in the Authorization header only: not in the cache, not in repr, not in the run dir
    for f in tmp_path.rglob("*"):
        if f.is_file():
            assert KEY.encode() not in f.read_bytes(), f
    assert KEY not in repr(judge)
    print(f"\njudge: first pass {len(PAIRS)} requests, {first_failures} parse failures; second pass cache hit rate "
          f"{hit_rate:.2f} overall (12/12 on the second pass); bad parser {len(PAIRS)}/{len(PAIRS)} failures")


def test_judge_timeouts_and_a_wrong_key_are_failures_per_sample(judge_server, tmp_path, monkeypatch):
    url, _ = judge_server
    monkeypatch.setenv("POSTTRAIN_TEST_JUDGE_KEY", KEY)
    slow = make_judge(_judge_cfg(url, "reward.judge.timeout_s=0.0005"), tmp_path / "a")
    results = slow.results(PAIRS[:3])
    assert slow.failures == 3 and all(r.reward == -1.0 and "failed" in r.error for r in results)
    assert slow.requests == 3 * 2  # one try + one retry each
    slow.close()

    monkeypatch.setenv("POSTTRAIN_TEST_JUDGE_KEY", "sk-wrong")
    denied = make_judge(_judge_cfg(url), tmp_path / "b")
    results = denied.results(PAIRS[:2])
    assert denied.failures == 2 and all("401" in r.error for r in results)
    assert denied.requests == 2  # 401 is not retried
    denied.close()


@pytest.mark.integration
def test_judge_as_a_reward_source_in_the_loop(judge_server, tmp_path, monkeypatch, tiny_model_dir):
    """Two GRPO steps on real Ray + vLLM rollout with the judge as the reward: reward/judge is logged every step,
    is the reward, and the judge's replies land in the run's cache."""
    import sqlite3

    from posttrain.loop import train
    from posttrain.tracking import read_metrics

    url, _ = judge_server
    monkeypatch.setenv("POSTTRAIN_TEST_JUDGE_KEY", KEY)
    cfg = _judge_cfg(url, f"runs_dir={tmp_path}", "name=judged", f"model.path={tiny_model_dir}", "reward.weights={judge: 1.0}",
                     "train.steps=2", "algorithm.prompts_per_step=4", "algorithm.group_size=4", "algorithm.kl_coef=0",
                     "task.heldout_size=16", "eval.every=0", "checkpoint.every=0", "logging.progress=false")
    train(cfg, progress=False)
    steps = [m for m in read_metrics(cfg.run_dir) if "time/step" in m]
    assert [m["step"] for m in steps] == [1, 2]
    for m in steps:
        assert m["reward_mean"] == pytest.approx(m["reward/judge"], abs=1e-6)
        assert m["reward/verifier"] is not None and m["reward_failures"] <= 16
    rows = sqlite3.connect(str(cfg.run_dir / "judge-cache.sqlite")).execute("SELECT COUNT(*) FROM replies").fetchone()[0]
    assert 1 <= rows <= 2 * 16
