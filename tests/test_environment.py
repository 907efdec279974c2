"""Environments from user classes, run in a real child process: the start checks' errors, per-episode state across
reset and steps, async episodes awaited together, failures confined to their episodes, a timeout, and contract
breaks reported as errors naming the file, class and method."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from posttrain.errors import PosttrainError
from posttrain.rollout.environment import EnvFailure, EnvironmentHost, EpisodeState, check_environment

ENVS = str(Path(__file__).resolve().parent / "fixtures" / "multiturn" / "envs.py")


def _row(i, **columns):
    return {"id": str(i), "prompt": f"prompt {i}", "answer": "", **columns}


def _assistant(text):
    return {"role": "assistant", "content": text}


@pytest.fixture
def host(request):
    hosts = []

    def make(cls, timeout_s=10.0):
        hosts.append(EnvironmentHost(f"{ENVS}:{cls}", timeout_s))
        return hosts[-1]

    yield make
    for h in hosts:
        h.close()


# ---------------------------------------------------------------------------------------------- start checks


def test_check_environment_returns_its_source():
    src = check_environment(f"{ENVS}:Counting")
    assert (src.spec, src.file, src.name, len(src.sha256)) == (f"{ENVS}:Counting", ENVS, "Counting", 64)


@pytest.mark.parametrize("symbol, says", [
    ("not_a_class", "is a function, not a class"),
    ("NoStep", "has no step method"),
    ("NeedsConfig", "cannot be constructed without arguments (missing a required argument: 'difficulty')"),
    ("Missing", "has no symbol 'Missing'"),
])
def test_an_unusable_environment_is_refused_naming_field_file_and_class(symbol, says):
    with pytest.raises(PosttrainError) as e:
        check_environment(f"{ENVS}:{symbol}")
    text = str(e.value)
    assert text.startswith("rollout.environment: ") and ENVS in text and symbol in text and says in text, text


def test_a_class_that_no_longer_loads_in_the_child_is_an_error_naming_it(tmp_path):
    env = EnvironmentHost(f"{tmp_path}/gone.py:Env", 10.0)
    with pytest.raises(PosttrainError, match=r"rollout.environment: .*gone.py:Env.*the file .*gone.py does not exist"):
        env.reset([("a", _row("a"))])
    env.close()


# ---------------------------------------------------------------------------------------------- running


def test_per_episode_state_across_reset_and_steps(host):
    env = host("Counting")
    rows = [_row(i) for i in range(3)]
    first = env.reset([(r["id"], r) for r in rows])
    assert first[1] == [{"role": "system", "content": "count"}, {"role": "user", "content": "prompt 1"}]
    for turn in range(3):
        out = env.step([(r["id"], EpisodeState(r, [], turn), _assistant(f"a{turn}")) for r in rows[:2]])
        assert out == [([{"role": "user", "content": f"{i} step {turn + 1} turn {turn} saw a{turn}"}], 1.0, turn == 2)
                       for i in range(2)]
    # episode 2 was never stepped: its own count starts at 1
    (third,) = env.step([("2", EpisodeState(rows[2], [], 0), _assistant("late"))])
    assert third[0][0]["content"] == "2 step 1 turn 0 saw late"
    env.end(["0"])
    (gone,) = env.step([("0", EpisodeState(rows[0], [], 3), _assistant("x"))])
    assert isinstance(gone, EnvFailure) and "has no instance" in gone.text


def test_async_episodes_are_awaited_together_with_their_own_state(host):
    env = host("AsyncCounting")
    rows = [_row(i, level=f"L{i}") for i in range(3)]
    assert env.reset([(r["id"], r) for r in rows]) == [[{"role": "user", "content": f"prompt {i} (L{i})"}]
                                                       for i in range(3)]
    for turn in range(2):
        start = time.perf_counter()
        out = env.step([(r["id"], EpisodeState(r, [], turn), _assistant(f"{r['id']}.{turn}")) for r in rows])
        assert time.perf_counter() - start < 0.8  # 3 x 0.3 s one after the other would be 0.9 s
        expected = ["|".join([str(i)] + [f"{i}.{t}" for t in range(turn + 1)]) for i in range(3)]
        assert out == [([{"role": "user", "content": e}], (turn + 2) / 10, False) for e in expected]


def test_an_exception_fails_only_its_episode(host):
    env = host("RaisesForOne")
    rows = [_row("a"), _row("bad"), _row("c")]
    env.reset([(r["id"], r) for r in rows])
    out = env.step([(r["id"], EpisodeState(r, [], 0), _assistant("42")) for r in rows])
    assert out[0] == out[2] == ([], 0.5, True)
    assert isinstance(out[1], EnvFailure)
    assert out[1].text == f"{ENVS}:RaisesForOne.step raised ValueError: cannot grade '42'"


def test_a_call_past_its_timeout_fails_its_episodes_and_the_process_restarts(host):
    env = host("Slow", timeout_s=1.0)
    rows = [_row("slow"), _row("fine"), _row("later")]
    env.reset([(r["id"], r) for r in rows])
    start = time.monotonic()
    out = env.step([(r["id"], EpisodeState(r, [], 0), _assistant("x")) for r in rows[:2]])
    assert time.monotonic() - start < 5
    assert all(isinstance(o, EnvFailure) for o in out)
    assert "step of 2 episode(s) ran longer than 1 s (rollout.environment_timeout_seconds)" in out[0].text
    # "later" was reset before the restart: its instance is gone; a new episode works in the fresh process
    (lost,) = env.step([("later", EpisodeState(rows[2], [], 0), _assistant("x"))])
    assert isinstance(lost, EnvFailure) and "has no instance" in lost.text
    assert env.reset([("new", _row("new"))]) == [[{"role": "user", "content": "prompt new"}]]
    assert env.step([("new", EpisodeState(_row("new"), [], 0), _assistant("x"))]) == [([], None, True)]


def test_a_method_that_takes_its_process_down_fails_its_episodes(host):
    env = host("Slow")
    env.reset([("exit", _row("exit"))])
    (out,) = env.step([("exit", EpisodeState(_row("exit"), [], 0), _assistant("x"))])
    assert isinstance(out, EnvFailure) and "took its process down (exit code 7)" in out.text


@pytest.mark.parametrize("kind, method, says", [
    ("reset-str", "reset", "returned 'hello': expected a list of messages"),
    ("pair", "step", "returned ([], True): expected a tuple (messages, reward, done)"),
    ("done-str", "step", "returned ([], None, 'yes'): done 'yes' is not a bool"),
    ("reward-str", "step", "returned ([], '1.0', True): the reward '1.0' is not a finite number or None"),
    ("no-content", "step", "the message {'role': 'user'} is not a dict with str 'role' and 'content'"),
])
def test_a_contract_breaking_return_is_an_error_naming_file_class_and_method(host, kind, method, says):
    env = host("BrokenReturn")
    row = _row(1, broken=kind)
    with pytest.raises(PosttrainError) as e:
        env.reset([("1", row)])
        env.step([("1", EpisodeState(row, [], 0), _assistant("x"))])
    text = str(e.value)
    assert text.startswith(f"rollout.environment: {ENVS}:BrokenReturn.{method} returned"), text
    assert says in text, text


def test_the_built_in_chat_environment_runs_in_process():
    env = EnvironmentHost(None, 1.0)
    assert env.child is None
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert env.reset([("a", _row("a")), ("b", {**_row("b"), "prompt": messages})]) == [
        [{"role": "user", "content": "prompt a"}], messages]
    assert env.step([("a", EpisodeState(_row("a"), [], 0), _assistant("hello"))]) == [([], None, True)]
    start = time.perf_counter()
    for _ in range(1000):
        env.step([("a", EpisodeState(_row("a"), [], 0), _assistant("hello"))])
    assert (time.perf_counter() - start) / 1000 < 0.001
    env.close()
