"""The python sandbox with real namespaces and real limits: each hostile program is contained (the run returns
within its limits, nothing escapes, no process outlives it) and reported with the reason that stopped it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest

from posttrain.config import TaskConfig
from posttrain.sandbox import SandboxLimits, python_output_match, run_python
from posttrain.tasks import Problem, load_task

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _sandbox_processes() -> set[int]:
    """Pids running as the sandbox user (nobody)."""
    return {p.pid for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == 65534}


@pytest.fixture(autouse=True)
def no_leftovers():
    """A program's processes are all gone after its run: none running as nobody that were not there before (a
    multi-turn run's tool server, rollout/tool_sandbox.py, also runs as nobody, for as long as its run)."""
    before = _sandbox_processes()
    yield
    if os.geteuid() == 0:  # the kernel ends a killed PID namespace's processes asynchronously: allow it 3 s
        deadline = time.monotonic() + 3
        while _sandbox_processes() - before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _sandbox_processes() - before == set()


def test_a_well_behaved_program_runs_and_may_use_its_scratch_dir():
    r = run_python("open('notes.txt', 'w').write('21')\nprint(2 * int(open('notes.txt').read()))")
    assert (r.reason, r.returncode, r.stdout) == ("ok", 0, "42\n")


def test_infinite_loop_stops_at_the_cpu_limit():
    r = run_python("while True:\n    pass", SandboxLimits(cpu_seconds=1, wall_seconds=20))
    assert r.reason == "cpu_limit" and r.seconds < 20, r


def test_a_program_that_sleeps_forever_stops_at_the_wall_clock_limit():
    r = run_python("import time\ntime.sleep(3600)", SandboxLimits(wall_seconds=1))
    assert r.reason == "timeout" and r.seconds < 5, r


def test_fork_bomb_hits_the_process_limit():
    r = run_python("import os\nwhile True:\n    os.fork()", SandboxLimits(max_processes=8, wall_seconds=10))
    assert r.reason == "process_limit", r
    assert "BlockingIOError" in r.stderr


def test_memory_hog_hits_the_memory_limit():
    r = run_python("chunks = []\nwhile True:\n    chunks.append(bytearray(16 * 2**20))", SandboxLimits(memory_mb=128))
    assert r.reason == "memory_limit" and "MemoryError" in r.stderr, r


def test_writes_outside_the_scratch_dir_are_denied(tmp_path):
    # world-writable places (only the read-only mounts stop these), then the user's own files
    targets = [Path("/tmp/posttrain-escape.txt"), Path("/dev/shm/posttrain-escape.txt"), tmp_path / "escape.txt",
               Path(SRC) / "escape.py"]
    for target in targets:
        r = run_python(f"open({str(target)!r}, 'w').write('pwned')")
        assert r.reason == "write_denied", (target, r)
        assert "Read-only file system" in r.stderr or "Permission denied" in r.stderr
        assert not target.exists()


def test_socket_connect_is_denied_and_reaches_nobody():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(3)
    port = server.getsockname()[1]
    accepted = []
    t = threading.Thread(target=lambda: accepted.append(_try_accept(server)))
    t.start()
    r = run_python(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)")
    t.join()
    server.close()
    assert r.reason == "network_denied" and "Network is unreachable" in r.stderr, r
    assert accepted == [False]


def _try_accept(server: socket.socket) -> bool:
    try:
        server.accept()[0].close()
        return True
    except OSError:
        return False


def test_output_is_capped_and_the_environment_holds_no_secrets(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-secret-123")
    r = run_python("import os\nprint(sorted(os.environ))\nprint('x' * 10_000_000)", SandboxLimits(max_file_mb=0.5))
    assert r.reason == "file_size_limit" and "File too large" in r.stderr
    assert "OPENAI_API_KEY" not in r.stdout and "sk-test" not in r.stdout + r.stderr


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/bin/python3"), reason="needs root to become nobody")
def test_without_root_an_unprivileged_user_namespace_confines_the_same_way():
    code = (
        "import json\nfrom posttrain.sandbox import run_python\n"
        "progs = ['print(1)', \"open('/tmp/posttrain-escape', 'w')\", 'import os\\nwhile True: os.fork()',\n"
        "         \"import socket; socket.create_connection(('127.0.0.1', 9), timeout=2)\"]\n"
        "print(json.dumps([run_python(p).reason for p in progs]))"
    )
    # the system python (the venv may not be readable by nobody) with only this checkout's posttrain on its path
    out = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "/usr/bin/python3", "-c",
                          code], capture_output=True, text=True, timeout=120, cwd="/", env={"PYTHONPATH": SRC,
                                                                                             "PATH": "/usr/bin:/bin"})
    if "No module named" in out.stderr:
        pytest.skip(f"the system python cannot import posttrain as nobody: {out.stderr[-200:]}")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == ["ok", "write_denied", "process_limit", "network_denied"]
    assert not Path("/tmp/posttrain-escape").exists()


def test_python_verifier_scores_programs_by_their_output(tmp_path):
    rows = [{"prompt": f"print {i}*3", "answer": str(3 * i)} for i in range(6)]
    f = tmp_path / "code.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = load_task(TaskConfig(name="jsonl", path=str(f), heldout_size=2, reward="python"), seed=0)
    p = Problem("r", "print 4*3", "12")
    assert task.score(p, "print(4 * 3)") == 1.0
    assert task.score(p, "print(13)") == 0.0
    assert task.score(p, "while True: pass") == 0.0  # a limit earns nothing, like a wrong answer
    assert python_output_match("ok", "import sys; print('ok'); sys.exit(1)") == 0.0  # a crash is not a pass

