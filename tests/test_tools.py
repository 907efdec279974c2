"""Tools from user functions: their schemas, the start checks' errors, parsing the policy's calls, and running calls
in the real persistent sandbox (no mocks): results for every outcome, confinement, and recovery after a kill."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from posttrain.errors import PosttrainError
from posttrain.rollout.tool_calls import BadToolCall, ToolCall, parse_tool_calls
from posttrain.rollout.tool_sandbox import ToolRunner
from posttrain.rollout.tools import check_arguments, check_tools, parse_docstring

FIX = Path(__file__).resolve().parent / "fixtures" / "multiturn"
CALC, HOSTILE, BAD, CLASH = (str(FIX / f) for f in ("calc_tools.py", "hostile_tools.py", "bad_tools.py",
                                                      "clash_tools.py"))
SRC = str(Path(__file__).resolve().parents[1] / "src")


# ---------------------------------------------------------------------------------------------- schemas


def test_schema_of_a_typed_documented_function():
    (tool,) = check_tools([f"{CALC}:describe"])
    assert tool.name == "describe" and tool.file == CALC and len(tool.sha256) == 64
    assert tool.schema == {"type": "function", "function": {
        "name": "describe",
        "description": "Every supported kind of parameter.",
        "parameters": {"type": "object", "properties": {
            "name": {"type": "string", "description": "what to call it."},
            "count": {"type": "integer", "description": "how many; a description that goes on over two lines."},
            "ratio": {"type": "number"},
            "flags": {"type": "array", "items": {"type": "string"}},
            "options": {"type": "object"},
            "verbose": {"type": "boolean"},
            "unit": {"type": "string", "enum": ["m", "km"], "description": "the unit."},
            "note": {"type": "string", "nullable": True},
            "scores": {"type": "array", "items": {"type": "number"}, "nullable": True},
        }, "required": ["name", "count", "ratio", "flags", "options"]}}}


def test_schema_of_the_calculator_is_what_the_chat_template_takes():
    calc, search = check_tools([f"{CALC}:calculate", f"{CALC}:search"])
    assert calc.schema["function"] == {
        "name": "calculate", "description": "Evaluates an arithmetic expression and returns the result.",
        "parameters": {"type": "object", "required": ["expression"], "properties": {
            "expression": {"type": "string", "description": 'Python arithmetic, e.g. "3 * (4 + 5)".'}}}}
    assert search.schema["function"]["description"] == "Looks a topic up in a small encyclopedia."


def test_docstring_without_args_section():
    assert parse_docstring("One line.\n\nMore text.\n") == ("One line.", {})
    assert parse_docstring(None) == ("", {})


@pytest.mark.parametrize("symbol, says", [
    ("no_hints", "parameter 'query' has no type hint"),
    ("takes_kwargs", "parameter **options cannot be given by a tool call"),
    ("odd_hint", "parameter 'point' has an unsupported type hint tuple[int, int]"),
    ("NOT_A_FUNCTION", "is a int, not a function"),
    ("Searcher", "is a type, not a function"),
])
def test_a_tool_that_cannot_be_described_is_refused_naming_field_file_and_symbol(symbol, says):
    with pytest.raises(PosttrainError) as e:
        check_tools([f"{CALC}:calculate", f"{BAD}:{symbol}"])
    text = str(e.value)
    assert text.startswith("rollout.tools.1"), text
    assert BAD in text and symbol in text and says in text, text


def test_two_tools_of_one_name_are_refused_naming_both():
    with pytest.raises(PosttrainError) as e:
        check_tools([f"{CALC}:calculate", f"{CALC}:search", f"{CLASH}:calculate"])
    text = str(e.value)
    assert "rollout.tools.2: two tools are named 'calculate'" in text
    assert f"{CALC}:calculate" in text and "(rollout.tools.0)" in text and f"{CLASH}:calculate" in text


def test_a_missing_tool_file_names_the_field():
    with pytest.raises(PosttrainError, match=r"rollout.tools.0: .*does not exist"):
        check_tools([str(FIX / "nope.py") + ":calculate"])


def test_arguments_are_checked_against_the_schema():
    (tool,) = check_tools([f"{CALC}:describe"])
    ok = {"name": "a", "count": 2, "ratio": 1, "flags": ["x"], "options": {}}
    assert check_arguments(tool.schema, ok) is None  # an int is a number
    assert check_arguments(tool.schema, {**ok, "note": None, "unit": "km"}) is None
    assert check_arguments(tool.schema, {"name": "a"}) == "missing 'count', 'ratio', 'flags', 'options'"
    assert check_arguments(tool.schema, {**ok, "colour": 1}).startswith("unexpected 'colour' (it takes name, count")
    assert check_arguments(tool.schema, {**ok, "count": True}) == "'count' must be an integer, got boolean True"
    assert check_arguments(tool.schema, {**ok, "count": 2.5}) == "'count' must be an integer, got number 2.5"
    assert check_arguments(tool.schema, {**ok, "flags": ["x", 3]}) == \
        "'flags' must be an array of strings, got array ['x', 3]"
    assert check_arguments(tool.schema, {**ok, "unit": "mi"}) == "'unit' must be one of 'm', 'km', got string 'mi'"
    assert check_arguments(tool.schema, {**ok, "name": None}) == "'name' must be a string, got null None"


# ---------------------------------------------------------------------------------------------- parsing


def test_hermes_calls():
    text = ('Let me compute.\n<tool_call>\n{"name": "calculate", "arguments": {"expression": "2+2"}}\n</tool_call>\n'
            '<tool_call>{"name": "search", "arguments": "{\\"key\\": \\"paris\\"}", "id": "c1"}</tool_call>')
    assert parse_tool_calls(text, "hermes") == [ToolCall("calculate", {"expression": "2+2"}),
                                                ToolCall("search", {"key": "paris"})]
    assert parse_tool_calls("The answer is 4.", "hermes") == []


def test_hermes_malformed_calls():
    (bad,) = parse_tool_calls('<tool_call>{"name": "calculate", "arguments": {"expression": }</tool_call>', "hermes")
    assert isinstance(bad, BadToolCall) and bad.kind == "malformed" and "not valid JSON" in bad.why
    good, unclosed = parse_tool_calls('<tool_call>{"name": "a", "arguments": {}}</tool_call> then '
                                      '<tool_call>{"name": "b"', "hermes")
    assert good == ToolCall("a", {})
    assert unclosed.kind == "malformed" and "never closed" in unclosed.why and unclosed.text.startswith("<tool_call>")
    (no_name,) = parse_tool_calls('<tool_call>{"arguments": {}}</tool_call>', "hermes")
    assert "no \"name\"" in no_name.why
    (bad_args,) = parse_tool_calls('<tool_call>{"name": "a", "arguments": [1]}</tool_call>', "hermes")
    assert "must be a JSON object, got list" in bad_args.why
    (bad_str,) = parse_tool_calls('<tool_call>{"name": "a", "arguments": "{oops"}</tool_call>', "hermes")
    assert "is a string that is not JSON" in bad_str.why


def test_json_calls():
    assert parse_tool_calls(' {"name": "search", "arguments": {"key": "x"}} ', "json") == [
        ToolCall("search", {"key": "x"})]
    assert parse_tool_calls('[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"k": 1}}]', "json") == [
        ToolCall("a", {}), ToolCall("b", {"k": 1})]
    assert parse_tool_calls("The answer is 4.", "json") == []
    assert parse_tool_calls('{"answer": 4}', "json") == []  # JSON, but not a call: an answer
    (bad,) = parse_tool_calls('{"name": "a", "arguments": 3}', "json")
    assert isinstance(bad, BadToolCall)
    with pytest.raises(PosttrainError, match="unknown parser 'xml'"):
        parse_tool_calls("", "xml")


# ---------------------------------------------------------------------------------------------- running, confined


@pytest.fixture(scope="module")
def runner():
    tools = check_tools([f"{CALC}:calculate", f"{CALC}:search", f"{CALC}:shout"]
                        + [f"{HOSTILE}:{n}" for n in ("connect", "write_file", "sleep", "hog", "crash", "whoami")])
    r = ToolRunner(tools, timeout_s=2.0, memory_mb=256)
    yield r
    r.close()


def _one(runner, name, **arguments):
    (result,) = runner.run([ToolCall(name, arguments)])
    return result


def test_results_of_good_and_bad_calls(runner):
    ok, unknown, bad, raised, shout = runner.run([
        ToolCall("calculate", {"expression": "3 * (4 + 5)"}), ToolCall("serch", {"key": "x"}),
        ToolCall("calculate", {}), ToolCall("calculate", {"expression": "1/0"}), ToolCall("shout", {"text": "hi"})])
    assert (ok.name, ok.content, ok.error) == ("calculate", "27", None)
    assert unknown.error == "unknown_tool" and unknown.content == (
        "error: unknown tool 'serch'; available: calculate, connect, crash, hog, search, shout, sleep, whoami, "
        "write_file")
    assert bad.error == "bad_arguments" and bad.content == "error: bad arguments for calculate: missing 'expression'"
    assert raised.error == "exception"
    assert raised.content == "error: calculate raised ZeroDivisionError: division by zero"
    assert shout.content == "HI"  # an async tool
    (malformed,) = runner.run(parse_tool_calls("<tool_call>{nope</tool_call>", "hermes"))
    assert malformed.error == "malformed"
    assert malformed.content.startswith("error: malformed tool call: the <tool_call> block is not valid JSON")
    assert ok.record() == {"name": "calculate", "content": "27", "error": None, "seconds": round(ok.seconds, 4)}


def test_a_slow_tool_is_killed_at_its_timeout_and_the_next_call_works(runner):
    start = time.monotonic()
    r = _one(runner, "sleep", seconds=30)
    assert (r.error, r.content) == ("timeout", "error: sleep timed out after 2 s")
    assert time.monotonic() - start < 5
    assert _one(runner, "search", key="paris").content == "Paris is the capital of France."


def test_a_memory_hog_gets_an_error_result_and_the_server_recovers(runner):
    r = _one(runner, "hog", mb=4000)
    assert (r.error, r.content) == ("limit", "error: hog ran out of memory (limit 256 MB)")
    assert _one(runner, "hog", mb=10).content == "allocated 10 MB"


def test_a_crash_is_an_error_result_and_a_restart(runner):
    r = _one(runner, "crash")
    assert (r.error, r.content) == ("exception", "error: crash crashed the tool process (exit code 3)")
    assert _one(runner, "calculate", expression="6*7").content == "42"


def test_a_tool_cannot_open_a_network_connection(runner):
    with socket.socket() as server:  # a listener on this machine's loopback: the call returns before we look
        server.bind(("127.0.0.1", 0))
        server.listen()
        r = _one(runner, "connect", port=server.getsockname()[1])
        server.setblocking(False)
        with pytest.raises(BlockingIOError):  # nothing waits to be accepted: no connection reached it
            server.accept()
    assert r.error == "exception" and "Network is unreachable" in r.content, r


def test_a_tool_writes_only_in_its_scratch_dir(runner, tmp_path):
    assert _one(runner, "write_file", path="notes.txt", text="kept").content == "kept"
    for target in (Path("/tmp/posttrain-tool-escape.txt"), tmp_path / "escape.txt", Path(SRC) / "escape.py",
                   Path("/dev/shm/posttrain-tool-escape.txt")):
        r = _one(runner, "write_file", path=str(target), text="pwned")
        assert r.error == "exception", (target, r)
        assert "Read-only file system" in r.content or "Permission denied" in r.content, r
        assert not target.exists()


def test_a_tool_runs_without_privileges_or_secrets(runner, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-secret")  # set after the server started: not inherited anyway
    seen = json.loads(_one(runner, "whoami").content)
    assert "OPENAI_API_KEY" not in seen["env"] and set(seen["env"]) <= {"PATH", "LANG", "PWD", "OLDPWD"}
    assert seen["cwd"].endswith("/scratch")
    if os.geteuid() == 0:
        assert seen["uid"] == 65534


def test_per_call_overhead_of_the_persistent_server(runner):
    calls = [ToolCall("calculate", {"expression": "1+1"})] * 200
    start = time.perf_counter()
    results = runner.run(calls)
    per_call = (time.perf_counter() - start) / len(calls)
    assert all(r.content == "2" for r in results)
    assert per_call < 0.005, f"{per_call * 1000:.2f} ms per call"


def test_a_tool_file_that_does_not_import_inside_the_sandbox_fails_at_start(monkeypatch):
    monkeypatch.setenv("POSTTRAIN_TEST_API_KEY", "sk-test")  # the driver has it; the sandbox has only PATH
    tools = check_tools([str(FIX / "env_tools.py") + ":lookup"])
    with pytest.raises(PosttrainError) as e:
        ToolRunner(tools, timeout_s=2.0, memory_mb=256)
    text = str(e.value)
    assert text.startswith("rollout.tools.0: importing ") and "env_tools.py" in text, text
    assert "RuntimeError: needs an API key" in text and "(inside the tool sandbox)" in text, text


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/bin/python3"), reason="needs root to become nobody")
def test_without_root_the_server_runs_in_a_user_namespace_with_no_capabilities():
    code = (
        "import json\nfrom posttrain.rollout.tools import check_tools\n"
        "from posttrain.rollout.tool_calls import ToolCall\nfrom posttrain.rollout.tool_sandbox import ToolRunner\n"
        f"tools = check_tools([{HOSTILE!r} + ':write_file', {HOSTILE!r} + ':connect'])\n"
        "with ToolRunner(tools, 5.0, 256) as r:\n"
        "    out = r.run([ToolCall('write_file', {'path': 'a.txt', 'text': 'ok'}),\n"
        "                 ToolCall('write_file', {'path': '/tmp/posttrain-tool-escape', 'text': 'x'}),\n"
        "                 ToolCall('connect', {'port': 9})])\n"
        "print(json.dumps([(x.error, x.content) for x in out]))"
    )
    out = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "/usr/bin/python3", "-c",
                          code], capture_output=True, text=True, timeout=120, cwd="/",
                         env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"})
    if "No module named" in out.stderr:
        pytest.skip(f"the system python cannot import posttrain as nobody: {out.stderr[-200:]}")
    assert out.returncode == 0, out.stderr
    (ok, written, net) = json.loads(out.stdout)
    assert ok == [None, "ok"]
    assert written[0] == "exception" and "Read-only file system" in written[1]
    assert net[0] == "exception" and "Network is unreachable" in net[1]
    assert not Path("/tmp/posttrain-tool-escape").exists()
