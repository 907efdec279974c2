"""`RolloutWorker`: one rollout engine in one process, the unit Ray places on the cluster.

It is a plain class so it can be tested without Ray; the caller makes it an actor, with the engine's
environment in the actor's runtime_env (vLLM reads it when the engine starts, in the actor's process):

    actor_cls = ray.remote(num_cpus=1, runtime_env={"env_vars": rollout_worker_env(kv_cache_gb=1)})(RolloutWorker)
    worker = actor_cls.remote("vllm", model_dir, {"kv_cache_gb": 1})
    completions = ray.get(worker.generate.remote(prompts, SamplingSpec(n=8), seeds))

Weights travel through Ray's object store as an array payload or safetensors bytes (models/weights.py; put
them once with `ray.put` and pass the ref to every worker).

Threads: Ray gives the actor OMP_NUM_THREADS = its num_cpus. On the shared 2-core test machine one OMP thread
generated ~8x faster than two (~5,000-6,500 vs ~700 tok/s on the 1m model), so an engine run outside Ray
should also get OMP_NUM_THREADS set before torch is first imported.
"""

from __future__ import annotations

import math
import os
import threading
import time

from posttrain.remote.faults import maybe_wedge
from posttrain.remote.stacks import ActorProcess
from posttrain.rollout.engine import Completion, SamplingSpec
from posttrain.rollout.engines import make_engine


def engine_threads(cfg) -> int:
    """CPU threads for each rollout engine of the run config `cfg` (rollout.engine_threads; see its description).
    On 2 cores, 94M model, synchronous loop: 2 threads generate in 0.40 s what 1 does in 0.61 s
    (benchmarks/step_ratios.py); engines that run beside other busy threads keep 1 (OpenMP threads that wait on
    a busy core stall)."""
    r = cfg.rollout
    if r.engine_threads is not None:
        return r.engine_threads
    alone = not r.asynchronous and r.num_workers == 1 and r.num_workers_max is None
    return cfg.topology.torch_threads if alone else 1


def behaviour_logprobs_mode(cfg) -> str:
    """Which logprobs the engines return with each sampled token (engine.py): "sampled", those of the distribution
    actually sampled from (temperature, top_p), whenever the loss uses them as the behaviour policy's (an
    asynchronous rollout, or algorithm.rollout_correction); else "raw" (the trainer recomputes its own)."""
    uses_behaviour = cfg.rollout.asynchronous or cfg.algorithm.rollout_correction.mode != "none"
    return "sampled" if uses_behaviour else "raw"


def rollout_worker_env(kv_cache_gb: float, threads: int | None = None) -> dict[str, str]:
    """env_vars for a rollout worker actor's runtime_env. kv_cache_gb: vLLM's CPU KV cache in GiB (whole GiB);
    threads: the engine's OpenMP threads (None: Ray's, the actor's num_cpus rounded up)."""
    return {
        **({"OMP_NUM_THREADS": str(threads)} if threads is not None else {}),
        # The engine runs inside the actor process: starts in ~10-20 s instead of ~30 s, and a weight update is
        # a function call rather than a message to an EngineCore child process.
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": str(max(1, math.ceil(kv_cache_gb))),
        # The actor talks to nobody but its own engine; loopback avoids picking a wrong interface.
        "VLLM_HOST_IP": "127.0.0.1",
        "RAY_USAGE_STATS_ENABLED": "0",
        "TOKENIZERS_PARALLELISM": "false",  # tokenizers' own thread pool only contends with the engine's
    }


class RolloutWorker(ActorProcess):
    """Owns one engine (`engine_kind` "vllm" or "hf") on `model_dir`; `engine_kwargs` go to `make_engine`.

    With partial rollouts the actor is threaded (Ray max_concurrency=2, orchestration/roles.py) so that
    `interrupt()` runs while `generate` does; the engine itself takes one call at a time (a lock), whatever the
    actor's concurrency."""

    def __init__(self, engine_kind: str, model_dir: str, engine_kwargs: dict | None = None):
        self.engine = make_engine(engine_kind, model_dir, **(engine_kwargs or {}))
        self._engine_lock = threading.Lock()

    def generate(self, prompts: list[list[int]], spec: SamplingSpec, seeds: list[int]) -> list[list[Completion]]:
        maybe_wedge("generate")  # a recovery test's hang (remote/faults.py); nothing otherwise
        with self._engine_lock:
            return self.engine.generate(prompts, spec, seeds)

    def interrupt(self) -> None:
        """Cuts the interruptible generate now running short (partial rollouts: rollout/partial.py); its unfinished
        completions come back "aborted". Never waits for the engine."""
        if hasattr(self.engine, "interrupt"):
            self.engine.interrupt()

    def update_weights(self, payload) -> float:
        """Loads new weights in place from safetensors bytes or an array payload (models/weights.py); returns
        the seconds it took inside this process."""
        start = time.perf_counter()
        with self._engine_lock:
            self.engine.update_weights(payload)
        return time.perf_counter() - start

    def completion_logprobs(self, prompt: list[int], completion: list[int]) -> list[float]:
        with self._engine_lock:
            return self.engine.completion_logprobs(prompt, completion)

    def pid(self) -> int:
        return os.getpid()
