"""The run page of a multi-turn run: each step's episodes as conversations (tool calls and results set apart,
escaped), and the episode/* metrics as plots; a single-turn run's page has none of it."""

from __future__ import annotations

import json
import re

from posttrain.rollout.episode_metrics import episode_metrics
from posttrain.view import build_page, read_run

from test_view_page import _step, _write_run

EPISODES = {
    "0/p0/0": {"turns": [
        {"role": "assistant", "text": 'let me add <tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>',
         "tokens": 21, "tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}},
                                      {"error": "malformed", "text": "<tool_call>{oops</tool_call>"}]},
        {"role": "tool", "text": "5", "tokens": 6,
         "tool_results": [{"name": "add", "content": "5", "error": None, "seconds": 0.012}]},
        {"role": "assistant", "text": "The answer is 5.", "tokens": 7}],
        "end_reason": "answered", "tokens": 44, "tool_calls": 2},
    "0/p0/1": {"turns": [
        {"role": "assistant", "text": "<tool_call>{\"name\": \"add\"}</tool_call>", "tokens": 12,
         "tool_calls": [{"name": "add", "arguments": {}}]},
        {"role": "tool", "text": "missing a, b", "tokens": 5,
         "tool_results": [{"name": "add", "content": "add() missing 'a' & 'b'", "error": "bad_arguments", "seconds": 0.001}]}],
        "end_reason": "max_turns", "tokens": 27, "tool_calls": 1},
}


def _multi_turn_run(tmp_path):
    metrics = [json.dumps(_step(s, 0.5, **episode_metrics(list(EPISODES.values())))) + "\n" for s in (1, 2)]
    samples = [{"step": 1, "samples": [["0/p0/0", "The answer is 5.", 1.0], ["0/p0/1", "", 0.0]], "episodes": EPISODES}]
    return read_run(_write_run(tmp_path, metrics, samples=samples))


def test_episodes_render_as_conversations_with_tool_blocks(tmp_path):
    run = _multi_turn_run(tmp_path)
    assert sorted(run.episodes) == [1] and sorted(run.episodes[1]) == ["0/p0/0", "0/p0/1"]
    html = build_page(run)
    section = html.split("Sample completions")[1]
    assert 'data-episodes-step="1"' in section and "data-samples-step" not in section
    first = re.search(r'<div class="episode" data-episode="0/p0/0" data-end="answered">.*?(?=<div class="episode" |</div></section>)',
                      section, re.S).group(0)
    assert "ended: answered · reward 1 · 44 tokens (prompt included) · 2 tool calls" in first
    assert [r for r in re.findall(r'data-role="(\w+)"', first)] == ["assistant", "tool", "assistant"]
    assert "assistant · 21 tokens" in first and "tool · 6 tokens" in first
    # the policy's own <tool_call> text is escaped, never markup
    assert "<tool_call>" not in section and "&lt;tool_call&gt;{&quot;name&quot;: &quot;add&quot;" in first
    assert '<div class="tool-call" data-tool="add"><b>tool call add</b><pre>{&quot;a&quot;: 2, &quot;b&quot;: 3}</pre>' in first
    assert ('<div class="tool-call bad" data-tool-error="malformed"><b>tool call: malformed</b>'
            "<pre>&lt;tool_call&gt;{oops&lt;/tool_call&gt;</pre>") in first
    assert '<div class="tool-result" data-tool="add" data-tool-error=""><b>result of add · 0.012 s</b><pre>5</pre>' in first
    second = section.split('data-episode="0/p0/1"')[1]
    assert 'data-end="max_turns"' in section and "ended: max_turns · reward 0" in second
    assert ('<div class="tool-result bad" data-tool="add" data-tool-error="bad_arguments"><b>result of add · '
            "error: bad_arguments · 0.001 s</b><pre>add() missing &#x27;a&#x27; &amp; &#x27;b&#x27;</pre>") in second


def test_episode_metrics_are_plotted(tmp_path):
    html = build_page(_multi_turn_run(tmp_path))
    for chart in ("episodes", "tool-calls", "episode-end", "episode-tokens"):
        assert f'data-chart="{chart}"' in html, chart

    def last(chart: str, series: str) -> float:
        svg = re.search(rf'<svg class="chart" data-chart="{chart}".*?</svg>', html).group(0)
        return float(re.search(rf'data-series="{re.escape(series)}" data-points="2" data-last="([^"]+)"', svg).group(1))

    # 3 calls: add (valid), malformed, bad_arguments; 2 episodes, 3 assistant turns, 44 + 27 tokens
    assert last("tool-calls", "episode/tool_call_validity") == 1 / 3
    assert last("tool-calls", "episode/tool_errors/malformed") == 1 / 3
    assert last("tool-calls", "episode/tool_errors/bad_arguments") == 1 / 3
    assert last("episode-end", "episode/end/answered") == 0.5 and last("episode-end", "episode/end/max_turns") == 0.5
    assert last("episodes", "episode/turns") == 1.5 and last("episodes", "episode/tool_calls") == 1.5
    assert last("episode-tokens", "episode/tokens") == 35.5 and last("episode-tokens", "episode/sampled_tokens") == 20.0


def test_an_error_kind_missing_at_a_step_is_plotted_as_zero(tmp_path):
    clean = episode_metrics([{"turns": [{"role": "assistant", "text": "", "tokens": 3,
                                         "tool_calls": [{"name": "add", "arguments": {}}]},
                                        {"role": "tool", "text": "3", "tokens": 2,
                                         "tool_results": [{"name": "add", "content": "3", "error": None}]}],
                              "end_reason": "answered", "tokens": 7}])
    noisy = episode_metrics(list(EPISODES.values()))
    lines = [json.dumps(_step(1, 0.1, **noisy)) + "\n", json.dumps(_step(2, 0.2, **clean)) + "\n"]
    html = build_page(read_run(_write_run(tmp_path, lines)))
    assert 'data-series="episode/tool_errors/malformed" data-points="2" data-last="0.0"' in html
    assert 'data-series="episode/end/max_turns" data-points="2" data-last="0.0"' in html


def test_a_single_turn_run_has_no_episode_parts(tmp_path):
    samples = [{"step": 1, "samples": [["0/p0/0", "<tool_call>", 1.0]]}]
    run = read_run(_write_run(tmp_path, [json.dumps(_step(1, 0.5)) + "\n"], samples=samples))
    html = build_page(run)
    assert run.episodes == {} and "data-episodes-step" not in html and 'class="episode"' not in html
    assert not re.search(r'data-chart="(episodes|tool-calls|episode-end|episode-tokens)"', html)
    assert "<td><pre>&lt;tool_call&gt;</pre></td>" in html
