"""Running the policy's tool calls confined, in one persistent sandboxed server per `ToolRunner`.

Calls are frequent (hundreds per RL step) and a fresh sandbox per call costs ~50-100 ms to start, so the sandbox
of sandbox.py is set up once and a server inside it answers calls over pipes (JSON lines):
- namespaces, mounts and limits as there: no network (a loopback that is down), every mount read-only except a
  scratch directory (its working dir, kept while the server lives), RLIMIT_AS = rollout.tool_memory_mb,
  RLIMIT_NPROC, RLIMIT_FSIZE, no environment but PATH, `python -I` (site-packages allowed so tools can import
  installed libraries; user site and PYTHONPATH ignored);
- the server imports the user's tool files (the user's code: trusted at import), then drops its privileges for
  good before the first call (as root: becomes `nobody`; in a user namespace: drops every capability), so what the
  policy writes into a call's arguments never runs with the power to remount or to bring the network up;
- before each call it sets its soft RLIMIT_CPU to the CPU time used so far + the call's budget (SIGXCPU ends that
  call only); the parent waits `timeout_s` wall-clock seconds for the answer, then kills the whole sandbox and
  starts a fresh one for the next call. A call that crashes the server (os._exit, a segfault) or runs out of
  memory is an error result, and the server is restarted too.
Unknown tools and arguments that do not fit the schema are answered in the parent without running anything.
Calls of one `run` execute one after the other; tool output on stdout/stderr is discarded. Every module the
server needs is imported at the top of this file, before the drop: as nobody, the interpreter's own directory may
be unreadable (a pyenv under /root).
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import inspect
import json
import math
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
import weakref
from dataclasses import dataclass
from pathlib import Path

from posttrain.errors import PosttrainError
from posttrain.sandbox import (CONFINE_FAILED, SANDBOX_ENV, SandboxLimits, SandboxUnavailable, confined_command,
                               isolation_prefix, set_limits)
from posttrain.rollout.tool_calls import BadToolCall, ToolCall
from posttrain.rollout.tools import ToolSource, check_arguments
from posttrain.usercode import load_callable, split_spec

NOBODY = 65534
START_TIMEOUT_S = 60.0     # the server's start: namespaces, the interpreter, the user's tool files
MAX_CONTENT_CHARS = 100_000  # longer results are cut (the episode's token budget is the real bound)
# The server's lifetime CPU ceiling (hard RLIMIT_CPU): past it the kernel kills it and a fresh one starts.
SERVER_CPU_S = 86_400
_BOOT = ("import sys; sys.path.insert(0, sys.argv[1]); "
         "from posttrain.rollout.tool_sandbox import serve; serve(sys.argv[2:])")
_SRC = str(Path(__file__).resolve().parents[2])  # the directory holding this posttrain package


@dataclass(frozen=True)
class ToolResult:
    name: str            # the tool called ("" for a malformed call)
    content: str         # what the policy sees in the tool message: the return value, or "error: ..." it can read
    error: str | None    # one of tool_calls.TOOL_ERROR_KINDS, None on success
    seconds: float       # wall-clock, parent side, validation and IPC included

    def record(self) -> dict:
        return {"name": self.name, "content": self.content, "error": self.error, "seconds": round(self.seconds, 4)}

    def message(self) -> dict:
        return {"role": "tool", "name": self.name, "content": self.content}


class ToolRunner:
    """The rollout worker's side: validates calls and sends the valid ones to its confined server, one at a time
    (not thread-safe: one episode runner drives it). `timeout_s`: wall-clock (and CPU) seconds per call;
    `memory_mb`: the server's address space. Starts the server now: SandboxUnavailable when this machine cannot
    confine it, PosttrainError when a tool file does not import inside it. The first call after a kill (timeout,
    crash, out of memory) starts a fresh server and counts its start (~0.1-0.3 s) in its `seconds`."""

    def __init__(self, tools: list[ToolSource], timeout_s: float, memory_mb: int, max_processes: int = 16,
                 max_file_mb: float = 16.0):
        self.tools = {t.name: t for t in tools}
        self.timeout_s, self.memory_mb = timeout_s, memory_mb
        self.limits = SandboxLimits(wall_seconds=timeout_s, cpu_seconds=SERVER_CPU_S, memory_mb=memory_mb,
                                    max_processes=max_processes, max_file_mb=max_file_mb)
        self._server: _Server | None = None
        self._ensure_server()  # now, so a tool file that fails to import inside the sandbox fails at start

    def run(self, calls: list[ToolCall | BadToolCall]) -> list[ToolResult]:
        return [self._run_one(c) for c in calls]

    def _run_one(self, call: ToolCall | BadToolCall) -> ToolResult:
        start = time.perf_counter()

        def result(name: str, content: str, error: str | None) -> ToolResult:
            return ToolResult(name, content, error, time.perf_counter() - start)

        if isinstance(call, BadToolCall):
            return result("", f"error: malformed tool call: {call.why}", call.kind)
        tool = self.tools.get(call.name)
        if tool is None:
            return result(call.name, f"error: unknown tool {call.name!r}; available: {', '.join(sorted(self.tools))}",
                          "unknown_tool")
        why = check_arguments(tool.schema, call.arguments)
        if why is not None:
            return result(call.name, f"error: bad arguments for {call.name}: {why}", "bad_arguments")
        server = self._ensure_server()
        status, reply = server.call({"name": call.name, "arguments": call.arguments, "cpu_s": self.timeout_s},
                                    self.timeout_s)
        if status == "ok" and reply.get("restart"):
            self._stop_server()  # out of memory: its heap is suspect, start afresh
        if status == "ok" and reply.get("error") is None:
            return result(call.name, reply["content"], None)
        if status == "ok":
            return result(call.name, f"error: {call.name} {reply['content']}", reply["error"])
        self._stop_server()
        if status == "timeout":
            return result(call.name, f"error: {call.name} timed out after {self.timeout_s:g} s", "timeout")
        return result(call.name, f"error: {call.name} crashed the tool process ({reply})", "exception")

    def _ensure_server(self) -> _Server:
        if self._server is None:
            self._server = _Server([_absolute(t) for t in self.tools.values()], self.limits)
        return self._server

    def _stop_server(self) -> None:
        if self._server is not None:
            self._server.kill()
            self._server = None

    def close(self) -> None:
        self._stop_server()

    def __enter__(self) -> ToolRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _absolute(tool: ToolSource) -> str:
    """The tool's spec with its file's absolute path: the server's working directory is its scratch dir."""
    where = split_spec(tool.spec, "rollout.tools")[0]
    is_file = where.endswith(".py") or "/" in where or "\\" in where
    return f"{Path(tool.file).resolve()}:{tool.name}" if is_file else tool.spec


class _Server:
    """One confined server process and its pipes; started in __init__ (raises when it cannot start)."""

    def __init__(self, specs: list[str], limits: SandboxLimits):
        isolation_prefix()  # SandboxUnavailable before anything is written
        self.work = Path(tempfile.mkdtemp(prefix="posttrain-tools-"))
        scratch = self.work / "scratch"
        scratch.mkdir()
        root = os.geteuid() == 0
        if root:
            os.chown(scratch, NOBODY, NOBODY)
            os.chmod(self.work, 0o711)  # nobody reaches scratch/ through it; the stderr file stays root's
        cmd = confined_command(scratch, [sys.executable, "-I", "-c", _BOOT, _SRC, "nobody" if root else "capabilities",
                                         json.dumps(specs)])
        self._buf = b""
        with open(self.work / "stderr", "wb") as err:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, cwd=self.work,
                                         env=SANDBOX_ENV, preexec_fn=functools.partial(set_limits, limits))
        self._finalizer = weakref.finalize(self, _kill, self.proc, self.work)
        line = self._read_line(time.monotonic() + START_TIMEOUT_S)
        hello = json.loads(line) if line else {}
        if hello.get("ready"):
            if hello.get("note"):
                warnings.warn(f"rollout.tools: {hello['note']}", stacklevel=3)
            return
        try:
            self.proc.wait(5)  # it closed its end: let it finish writing stderr
        except subprocess.TimeoutExpired:
            pass
        stderr = (self.work / "stderr").read_bytes()[-4000:].decode(errors="replace").strip()
        self.kill()
        if self.proc.returncode == CONFINE_FAILED and stderr.startswith("posttrain-sandbox:"):
            raise SandboxUnavailable(f"the tool sandbox could not confine its server: {stderr}")
        if "fatal" in hello:
            raise (SandboxUnavailable if hello.get("sandbox") else PosttrainError)(hello["fatal"])
        raise PosttrainError(f"rollout.tools: the sandboxed tool server did not start (exit code "
                             f"{self.proc.returncode}): {stderr[-2000:] or 'no output'}")

    def call(self, request: dict, timeout_s: float) -> tuple[str, object]:
        """("ok", the server's reply), ("timeout", None) or ("died", why)."""
        try:
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return "died", self._exit_text()
        line = self._read_line(time.monotonic() + timeout_s)
        if line is None:
            return "timeout", None
        if not line:
            return "died", self._exit_text()
        return "ok", json.loads(line)

    def _exit_text(self) -> str:
        try:
            code = self.proc.wait(5)
        except subprocess.TimeoutExpired:
            return "no answer"
        return f"killed by signal {code - 128}" if code > 128 else f"exit code {code}"

    def _read_line(self, deadline: float) -> bytes | None:
        """The next line from the server; None past `deadline`, b"" when it closed its end."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return b""
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def kill(self) -> None:
        self._finalizer()


def _kill(proc: subprocess.Popen, work: Path) -> None:
    """Ends a server and removes its directory; also at exit for a runner never closed (weakref.finalize)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # unshare and the namespace's PID 1: the kernel ends the rest
    except ProcessLookupError:
        pass
    proc.wait()
    proc.stdin.close()
    proc.stdout.close()
    shutil.rmtree(work, ignore_errors=True)


# ---------------------------------------------------------------------------------------------- in the sandbox


class _CpuLimit(BaseException):
    """Raised by the SIGXCPU handler; a BaseException so a tool's `except Exception` does not swallow it."""


def _on_xcpu(signum, frame):
    raise _CpuLimit


def _closed_ancestor(path: str) -> str | None:
    """The highest directory above `path` that others (nobody) may not enter, or None."""
    parts = Path(path).parts
    for i in range(1, len(parts)):
        d = os.path.join(*parts[:i])
        if not os.stat(d).st_mode & 0o001:
            return d
    return None


def _expose(paths: list[str]) -> None:
    """Before becoming nobody: a directory that others may not enter (/root, 0700, holding a pyenv or a conda) above
    what the interpreter reads is covered by a read-only tmpfs into which only those paths are bound back, read-only.
    Without it a tool's lazy import (numpy's submodules, `encodings.idna` for a socket) fails as nobody; the rest
    of that directory stays hidden from the tools."""
    real = sorted({os.path.realpath(p) for p in paths if os.path.exists(p)})
    kept = [p for p in real if not any(p.startswith(q + os.sep) for q in real if q != p)]
    by_ancestor: dict[str, list[str]] = {}
    for p in kept:
        ancestor = _closed_ancestor(p)
        if ancestor is not None:
            by_ancestor.setdefault(ancestor, []).append(p)

    libc = ctypes.CDLL(None, use_errno=True)
    bind, remount, read_only = 4096, 32, 1  # MS_BIND, MS_REMOUNT, MS_RDONLY

    def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
        # libc, not mount(8): it would resolve /proc/self/fd/N to a path, which the tmpfs now hides
        if libc.mount(*(None if a is None else a.encode() for a in (source, target, fstype)), flags,
                      None if data is None else data.encode()) != 0:
            raise OSError(ctypes.get_errno(), f"mount {source} on {target}")

    for ancestor, inside in by_ancestor.items():
        fds = {p: os.open(p, os.O_PATH) for p in inside}  # still reachable once the tmpfs hides them
        mount("posttrain-expose", ancestor, "tmpfs", 0, "mode=755,size=1m")
        for p, fd in fds.items():
            if os.path.isdir(f"/proc/self/fd/{fd}"):
                os.makedirs(p, mode=0o755, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(p), mode=0o755, exist_ok=True)
                open(p, "w").close()
            mount(f"/proc/self/fd/{fd}", p, None, bind)
            mount(None, p, None, remount | bind | read_only)
            os.close(fd)
        mount(None, ancestor, None, remount | read_only)


def _drop_privileges(mode: str) -> None:
    """For good, before the first call: "nobody" (real root: become uid/gid 65534, which clears every capability)
    or "capabilities" (root of an unprivileged user namespace: clear the bounding set and every capability). Then
    no_new_privs, and a check that no capability is left."""
    libc = ctypes.CDLL(None, use_errno=True)
    if mode == "nobody":
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    else:
        for cap in range(64):
            libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP; fails past the last capability, which is fine
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
        if libc.capset(header, (ctypes.c_uint32 * 6)()) != 0:
            raise OSError(ctypes.get_errno(), "capset")
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    status = Path("/proc/self/status").read_text()
    left = [ln for ln in status.splitlines() if ln.startswith(("CapEff", "CapPrm")) and int(ln.split()[1], 16)]
    if left:
        raise OSError(f"capabilities left after dropping them: {left}")


def _call(fn, arguments: dict, cpu_s: float) -> dict:
    """One call: {"content": str} or {"error": kind, "content": why (after the tool's name)}."""
    used = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
    hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    resource.setrlimit(resource.RLIMIT_CPU, (min(hard, math.ceil(used + cpu_s)), hard))
    try:
        value = fn(**arguments)
        if inspect.isawaitable(value):
            value = asyncio.run(value)
        content = value if isinstance(value, str) else json.dumps(value, default=str)
        if len(content) > MAX_CONTENT_CHARS:
            content = content[:MAX_CONTENT_CHARS] + f"... [cut at {MAX_CONTENT_CHARS} characters]"
        return {"content": content}
    except _CpuLimit:
        return {"error": "limit", "content": f"used more than {cpu_s:g} s of CPU"}
    except MemoryError:
        limit = resource.getrlimit(resource.RLIMIT_AS)[0] // 2**20
        return {"error": "limit", "content": f"ran out of memory (limit {limit} MB)", "restart": True}
    except BaseException as e:  # noqa: BLE001 — the tool may raise anything, SystemExit included
        return {"error": "exception", "content": f"raised {type(e).__name__}: {e}"[:2000]}
    finally:
        resource.setrlimit(resource.RLIMIT_CPU, (hard, hard))


def serve(argv: list[str]) -> None:
    """The server's main, inside the sandbox: argv = [privilege mode, JSON list of tool specs]. Answers one JSON
    line per request line on stdin until stdin closes; the first line out is {"ready": true} or {"fatal": why}."""
    mode, specs = argv[0], json.loads(argv[1])
    out = os.fdopen(os.dup(1), "w", buffering=1)  # the protocol's own copy: fd 1 goes to /dev/null below
    try:
        fns = {}
        for i, spec in enumerate(specs):
            sym, fn = load_callable(spec, f"rollout.tools.{i}")
            fns[sym.name] = fn
    except PosttrainError as e:
        out.write(json.dumps({"fatal": f"{e} (inside the tool sandbox)"}) + "\n")
        return
    try:
        if mode == "nobody":
            _expose([sys.base_prefix, sys.prefix, *sys.path, *(os.path.dirname(f.__code__.co_filename)
                                                                for f in fns.values())])
        _drop_privileges(mode)
    except OSError as e:
        out.write(json.dumps({"fatal": f"the tool sandbox could not drop its privileges: {e}", "sandbox": True}) + "\n")
        return
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    sys.stdout = sys.stderr = open(os.devnull, "w")
    signal.signal(signal.SIGXCPU, _on_xcpu)
    stdlib = os.path.dirname(os.__file__)
    note = None if os.access(stdlib, os.R_OK | os.X_OK) else (
        f"the sandboxed tools run as nobody, who cannot read {stdlib} (the interpreter's standard library): a "
        "tool's import of a standard module not already imported when its file loaded will fail; import what the "
        "tools need at the top of their files, or install Python where every user can read it")
    out.write(json.dumps({"ready": True, "note": note}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        reply = _call(fns[request["name"]], request["arguments"], request["cpu_s"])
        out.write(json.dumps(reply) + "\n")
        if reply.get("restart"):
            return
