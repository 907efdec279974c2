"""The engine's own limit: vLLM's `LLM.generate` called directly (no Ray, no posttrain) on the same token-id batches
the posttrain run generated, with the same sampling parameters (n per prompt, max tokens, temperature 1, one
seed per prompt, the sampled token's logprob returned as posttrain asks). Run by benchmarks/perf.py in a child
process with the rollout actor's environment (one OMP thread, in-process engine).

    python benchmarks/perf_raw_vllm.py SPEC.json OUT.json

SPEC: {"model", "batches": [[token ids per prompt] per step], "seeds": [[seed per prompt] per step], "n",
"max_new_tokens", "max_model_len", "warmup", "passes"}. OUT: seconds and generated tokens per batch over `passes`
passes of the batches (the first `warmup` batches excluded).
"""

from __future__ import annotations

import json
import sys
import time

from common import write_json


def main(spec_path: str, out_path: str) -> int:
    spec = json.loads(open(spec_path).read())
    from vllm import LLM, SamplingParams

    t = time.perf_counter()
    llm = LLM(model=spec["model"], dtype="float32", seed=0, max_model_len=spec["max_model_len"], enforce_eager=True,
              logprobs_mode="raw_logprobs", load_format="safetensors",
              enable_chunked_prefill=False)  # as posttrain's engine on CPU: seeded samples need whole prefills
    start_s = time.perf_counter() - t
    seconds, tokens = [], []
    passes = [(p, s) for _ in range(spec["passes"]) for p, s in zip(spec["batches"], spec["seeds"])]
    for i, (prompts, seeds) in enumerate(passes):
        params = [SamplingParams(n=spec["n"], max_tokens=spec["max_new_tokens"], temperature=1.0, top_p=1.0,
                                 seed=s, logprobs=0, detokenize=False) for s in seeds]
        t = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        dt = time.perf_counter() - t
        if i >= spec["warmup"]:
            seconds.append(dt)
            tokens.append(sum(len(o.token_ids) for out in outs for o in out.outputs))
    write_json(out_path, {"seconds": seconds, "tokens": tokens, "engine_start_s": start_s}, indent=None, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:3]))
