"""episode/* metrics of a step's multi-turn episodes, against numbers worked out by hand."""

from __future__ import annotations

import pytest

from posttrain.rollout.episode_metrics import call_outcomes, episode_metrics
from posttrain.rollout.trajectory import Episode, Turn


def _turn(role: str, tokens: int, **extra) -> dict:
    return {"role": role, "text": f"{role} text", "tokens": tokens, **extra}


def _result(name: str | None, error: str | None = None) -> dict:
    return {"name": name, "content": "out", "error": error, "seconds": 0.01}


MALFORMED = {"error": "malformed", "text": "<tool_call>{bad"}
EPISODES = [
    # prompt 10; a valid call and a malformed one the environment does not answer; then an answer. 10+5+8+3 = 26
    {"turns": [_turn("assistant", 5, tool_calls=[{"name": "calc", "arguments": {"x": 1}}, MALFORMED]),
               _turn("tool", 8, tool_results=[_result("calc")]),
               _turn("assistant", 3)], "end_reason": "answered", "tokens": 26, "tool_calls": 2},
    # prompt 12; a call that times out, then one naming an unknown tool. 12+4+6+4+2 = 28
    {"turns": [_turn("assistant", 4, tool_calls=[{"name": "search", "arguments": {}}]),
               _turn("tool", 6, tool_results=[_result("search", "timeout")]),
               _turn("assistant", 4, tool_calls=[{"name": "nope", "arguments": {}}]),
               _turn("tool", 2, tool_results=[_result("nope", "unknown_tool")])],
     "end_reason": "max_turns", "tokens": 28, "tool_calls": 2},
    # prompt 9; answers at once. 9+7 = 16
    {"turns": [_turn("assistant", 7)], "end_reason": "answered", "tokens": 16, "tool_calls": 0},
    # prompt 5; a malformed call the environment does answer (one result per call), and bad arguments. 5+2+3 = 10
    {"turns": [_turn("assistant", 2, tool_calls=[MALFORMED, {"name": "calc", "arguments": {"y": 2}}]),
               _turn("tool", 3, tool_results=[_result(None, "malformed"), _result("calc", "bad_arguments")])],
     "end_reason": "max_total_tokens", "tokens": 10, "tool_calls": 2},
]


def test_each_call_gets_one_outcome():
    assert call_outcomes(EPISODES[0]["turns"]) == ["ok", "malformed"]  # the lone result pairs with the call that parsed
    assert call_outcomes(EPISODES[1]["turns"]) == ["timeout", "unknown_tool"]
    assert call_outcomes(EPISODES[3]["turns"]) == ["malformed", "bad_arguments"]  # by position, not counted twice
    # the episode ended (max_turns) before the tools ran: the call that parsed is not run, the malformed one stays so
    last = _turn("assistant", 3, tool_calls=[{"name": "calc", "arguments": {}}, MALFORMED])
    assert call_outcomes([last]) == ["not_run", "malformed"]


def test_calls_never_run_are_neither_valid_nor_errors():
    m = episode_metrics([{"turns": [_turn("assistant", 3, tool_calls=[{"name": "calc", "arguments": {}}, MALFORMED])],
                          "end_reason": "max_turns", "tokens": 8, "tool_calls": 2}])
    # The parsed call never ran (max_turns): out of both rates. The malformed one is judged without running: 1 of 1.
    assert (m["episode/tool_call_validity"], m["episode/tool_error_rate"], m["episode/tool_errors/malformed"]) == (0.0, 1.0, 1.0)


def test_episode_metrics_by_hand():
    m = episode_metrics(EPISODES)
    # 6 calls over 4 episodes; 5 of them failed: malformed x2, timeout, unknown_tool, bad_arguments
    assert m == pytest.approx({
        "episode/turns": 6 / 4,                      # assistant turns 2 + 2 + 1 + 1
        "episode/tool_calls": 6 / 4,
        "episode/tokens": (26 + 28 + 16 + 10) / 4,   # 20.0
        "episode/sampled_tokens": (8 + 8 + 7 + 2) / 4,  # 6.25
        "episode/tool_call_validity": 1 / 6,
        "episode/tool_error_rate": 5 / 6,
        "episode/tool_errors/malformed": 2 / 6,
        "episode/tool_errors/timeout": 1 / 6,
        "episode/tool_errors/unknown_tool": 1 / 6,
        "episode/tool_errors/bad_arguments": 1 / 6,
        "episode/end/answered": 2 / 4,
        "episode/end/max_turns": 1 / 4,
        "episode/end/max_total_tokens": 1 / 4,
    })


def test_no_tool_calls_and_no_episodes():
    m = episode_metrics([EPISODES[2]])
    assert m["episode/tool_call_validity"] is None and m["episode/tool_error_rate"] is None
    assert not any(k.startswith("episode/tool_errors/") for k in m)
    assert m["episode/tool_calls"] == 0 and m["episode/end/answered"] == 1.0
    assert episode_metrics([]) == {}


def test_reads_what_episode_record_writes():
    ep = Episode("0/p/0", seed=1, messages=[], prompt_ids=[1, 2, 3])
    ep.turns = [Turn("assistant", "<tool_call>{}", [4, 5], tool_calls=[{"name": "calc", "arguments": {}}]),
                Turn("tool", "2", [6], tool_results=[_result("calc", "exception")]),
                Turn("assistant", "2", [7, 8, 9])]
    ep.end_reason = "answered"
    m = episode_metrics([ep.record()])
    assert (m["episode/tokens"], m["episode/sampled_tokens"], m["episode/turns"]) == (9, 5, 2)
    assert (m["episode/tool_call_validity"], m["episode/tool_errors/exception"]) == (0.0, 1.0)
