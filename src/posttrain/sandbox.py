"""Running model-written Python in a sandbox, for the "python" verifier (task.reward=python: a completion is a
program; its reward is 1 when what it prints equals the row's answer).

Each program runs in a fresh subprocess with
- its own network namespace (only a loopback that is down: every connect fails),
- its own mount namespace in which every mount is read-only except a fresh scratch directory (its working dir),
- its own PID namespace (killing its first process ends every process it started),
- RLIMIT_CPU (CPU seconds), RLIMIT_AS (address space), RLIMIT_NPROC (processes), RLIMIT_FSIZE (bytes per file,
  which also caps what it prints: stdout and stderr are files),
- no environment but PATH (no API keys), `python -I -S` (standard library only), and a wall-clock timeout.
As root the namespaces come from `unshare` and the program runs as `nobody` (root ignores RLIMIT_NPROC); without
root an unprivileged user namespace (`unshare --user --map-root-user`) provides them. When neither works the
verifier refuses to run with SandboxUnavailable instead of running model output unconfined.
"""

from __future__ import annotations

import functools
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from posttrain.errors import PosttrainError

# Inside the namespaces, as (namespace) root: keep scratch writable, make every other mount read-only, refuse to
# go on if one stays writable, then run the program (not exec: this shell is PID 1, whose death ends them all).
CONFINE_SH = r"""
S="$1"; shift
mount --make-rprivate / && mount --bind "$S" "$S" || { echo "posttrain-sandbox: mount namespace unusable" >&2; exit 97; }
for m in $(awk '{print $2}' /proc/self/mounts | sort -r -u); do
  [ "$m" = "$S" ] || mount -o remount,bind,ro "$m" 2>/dev/null || true
done
# the last line of a mount point is the mount on top (those under it are out of reach)
left=$(awk -v s="$S" '{o[$2] = $4} END {for (m in o) if (m != s && o[m] !~ /^ro/) print m}' /proc/self/mounts)
[ -z "$left" ] || { echo "posttrain-sandbox: could not make read-only: $left" >&2; exit 97; }
cd "$S" || exit 97
"$@"
rc=$?
exit $rc
"""
CONFINE_FAILED = 97
SANDBOX_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}  # nothing else: no API keys, no PYTHONPATH

REASONS = ("ok", "error", "timeout", "cpu_limit", "memory_limit", "process_limit", "file_size_limit",
           "write_denied", "network_denied")


class SandboxUnavailable(PosttrainError):
    """Neither root nor unprivileged user namespaces: model output cannot be confined on this machine."""


@dataclass(frozen=True)
class SandboxLimits:
    wall_seconds: float = 10.0   # killed past this, whatever it is doing
    cpu_seconds: int = 2         # RLIMIT_CPU per process
    memory_mb: int = 256         # RLIMIT_AS per process
    max_processes: int = 16      # RLIMIT_NPROC: processes of the sandbox user at once
    max_file_mb: float = 1.0     # RLIMIT_FSIZE: largest file it may write, stdout and stderr included


@dataclass
class SandboxResult:
    reason: str          # one of REASONS: "ok" (exit 0), "error" (other failure), or the limit/denial that hit
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float


@functools.lru_cache(maxsize=1)
def isolation_prefix() -> tuple[str, ...]:
    """The unshare command line for this machine (root or an unprivileged user namespace), probed once."""
    unshare = shutil.which("unshare")
    if unshare is None:
        raise SandboxUnavailable("the python sandbox needs util-linux `unshare`, which is not on PATH",
                                 hint="install util-linux, or use a task whose verifier does not run code")
    base = (unshare, "--net", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc")
    prefix = base if os.geteuid() == 0 else (unshare, "--user", "--map-root-user", *base[1:])
    probe = subprocess.run([*prefix, "true"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        raise SandboxUnavailable(
            "the python sandbox cannot create its namespaces here: not root, and unprivileged user namespaces "
            f"are refused ({probe.stderr.strip() or probe.returncode})",
            hint="run as root, or allow user namespaces (sysctl kernel.unprivileged_userns_clone=1 / "
            "user.max_user_namespaces>0); model output is never run unconfined",
        )
    return prefix


def set_limits(limits: SandboxLimits) -> None:
    """preexec_fn: runs in the child between fork and exec; the limits carry over to every process it starts.
    Shared with the tool server (rollout/tool_sandbox.py)."""
    os.setsid()
    fsize = int(limits.max_file_mb * 2**20)
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_mb * 2**20,) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if os.geteuid() == 0:
        resource.setrlimit(resource.RLIMIT_NPROC, (limits.max_processes,) * 2)  # counted for `nobody`
    else:  # counted for this user, whose other processes count too
        ours = sum(1 for p in Path("/proc").iterdir() if p.name.isdigit() and _owner(p) == os.getuid())
        resource.setrlimit(resource.RLIMIT_NPROC, (ours + limits.max_processes,) * 2)


def _owner(p: Path) -> int | None:
    try:
        return p.stat().st_uid
    except OSError:
        return None


def confined_command(scratch: Path, argv: list[str]) -> list[str]:
    """The command line that runs `argv` in the namespaces, every mount read-only but `scratch` (its working dir);
    it exits CONFINE_FAILED with a "posttrain-sandbox: ..." line on stderr when it cannot confine."""
    return [*isolation_prefix(), "sh", "-c", CONFINE_SH, "posttrain-sandbox", str(scratch), *argv]


def run_python(code: str, limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    """Runs `code` (a Python program) confined as described above; returns what happened and why it stopped."""
    isolation_prefix()  # SandboxUnavailable before anything is written
    work = Path(tempfile.mkdtemp(prefix="posttrain-sandbox-"))
    scratch, out_dir = work / "scratch", work / "out"
    scratch.mkdir()
    out_dir.mkdir()
    (scratch / "main.py").write_text(code)
    run_as: list[str] = []
    if os.geteuid() == 0:
        nobody = 65534
        os.chown(scratch, nobody, nobody)
        os.chown(scratch / "main.py", nobody, nobody)
        run_as = ["setpriv", f"--reuid={nobody}", f"--regid={nobody}", "--clear-groups", "--no-new-privs"]
    os.chmod(work, 0o711)  # nobody must reach scratch/ through it; out/ stays root's
    cmd = confined_command(scratch, [*run_as, sys.executable, "-I", "-S", "main.py"])
    start = time.perf_counter()
    timed_out = False
    try:
        with open(out_dir / "stdout", "wb") as out, open(out_dir / "stderr", "wb") as err:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=work,
                                    env=SANDBOX_ENV, preexec_fn=functools.partial(set_limits, limits))
            try:
                proc.wait(timeout=limits.wall_seconds)
            except subprocess.TimeoutExpired:
                timed_out = True
                os.killpg(proc.pid, signal.SIGKILL)  # unshare and the namespace's PID 1: the kernel ends the rest
                proc.wait()
        stdout = (out_dir / "stdout").read_bytes()[:65536].decode(errors="replace")
        stderr = (out_dir / "stderr").read_bytes()[-65536:].decode(errors="replace")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    seconds = time.perf_counter() - start
    if proc.returncode == CONFINE_FAILED and stderr.startswith("posttrain-sandbox:"):
        raise SandboxUnavailable(f"the python sandbox could not confine the program: {stderr.strip()}")
    return SandboxResult(classify(proc.returncode, stderr, timed_out), proc.returncode, stdout, stderr, seconds)


def classify(returncode: int | None, stderr: str, timed_out: bool) -> str:
    """Why a sandboxed program stopped, from its exit status and the last lines of its stderr."""
    tail = stderr[-2000:]
    if timed_out:
        return "process_limit" if "BlockingIOError" in tail else "timeout"
    if returncode == 0:
        return "ok"
    if returncode in (128 + signal.SIGXCPU, 128 + signal.SIGKILL, -signal.SIGXCPU, -signal.SIGKILL):
        return "cpu_limit"
    for needle, reason in (("MemoryError", "memory_limit"), ("BlockingIOError", "process_limit"),
                           ("Resource temporarily unavailable", "process_limit"),
                           ("File too large", "file_size_limit"), ("Read-only file system", "write_denied"),
                           ("PermissionError", "write_denied"), ("Network is unreachable", "network_denied"),
                           ("Cannot assign requested address", "network_denied"),
                           ("gaierror", "network_denied"), ("Temporary failure in name resolution", "network_denied")):
        if needle in tail:
            return reason
    return "error"


def python_output_match(answer: str, completion: str) -> float:
    """The "python" verifier: 1.0 when the completion, run as a program in the sandbox, prints exactly `answer`
    (surrounding whitespace ignored), else 0.0. A program that hits a limit earns 0, like a wrong answer."""
    result = run_python(completion)
    return 1.0 if result.reason == "ok" and result.stdout.strip() == answer.strip() else 0.0
