"""model.dtype=bfloat16 against float32 on a real model: the per-token logprob gap (nats/token) of sampled chat
completions, the training forward + backward time of one batch in each dtype, and how much of a pure-bfloat16
AdamW step survives rounding. Writes benchmarks/results/bf16_gap.json (docs/real-models.md quotes it).

    .venv/bin/python benchmarks/bf16_gap.py /tmp/smol          # SmolLM2-135M-Instruct as an HF dir, ~3 min, 2 threads

The completions (16 chat prompts, up to 48 tokens sampled at temperature 1 by the float32 model, seeded) are scored
by the trainer's own path (pack + completion_logprobs, which take the log-softmax in float32 whatever the weights'
dtype), once with the weights in float32 and once in bfloat16. Timing: one warm-up, then float32 and bfloat16
alternated over `--rounds` (5) rounds of (logprobs.sum()).backward() on the whole batch; the median is reported.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from common import median, write_json

from posttrain.machine import cpu_flags, describe_machine, has_native_bf16
from posttrain.models.loading import PromptEncoder, load_causal_lm
from posttrain.training.batch import completion_logprobs, pack

RESULTS = Path(__file__).resolve().parent / "results" / "bf16_gap.json"
PROMPTS = [
    "What is the capital of France?", "Write a haiku about the sea.", "Explain photosynthesis in one sentence.",
    "What is 17 times 23?", "Give me three tips for better sleep.", "Translate 'good morning' into Spanish.",
    "Who wrote Pride and Prejudice?", "Name a prime number greater than 50.", "What does a CPU do?",
    "Describe a cat to someone who has never seen one.", "Why is the sky blue?", "Suggest a name for a bakery.",
    "What is the boiling point of water in Fahrenheit?", "Summarise the plot of Romeo and Juliet.",
    "How many legs does a spider have?", "Write a Python function that reverses a string.",
]
NEW_TOKENS = 48


def sample_completions(model, tok, prompts: list[list[int]], seed: int) -> list[list[int]]:
    """One batched generate (prompts left-padded), each completion cut after its first end-of-sequence token."""
    torch.manual_seed(seed)
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    rows = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=True, temperature=1.0,
                          top_p=1.0, top_k=0, pad_token_id=tok.pad_token_id)[:, width:].tolist()
    return [r[: r.index(tok.eos_token_id) + 1] if tok.eos_token_id in r else r for r in rows]


def fwd_bwd_seconds(model, batch) -> float:
    model.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    completion_logprobs(model, batch).sum().backward()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    f32, tok = load_causal_lm(args.model_dir, "float32")
    bf16, _ = load_causal_lm(args.model_dir, "bfloat16")
    enc = PromptEncoder(tok)
    prompts = [enc.encode(p) for p in PROMPTS]
    with torch.no_grad():
        completions = sample_completions(f32, tok, prompts, args.seed)
    batch = pack(prompts, completions, tok.pad_token_id)
    mask = batch.completion_mask.bool()
    with torch.no_grad():
        lp32, lp16 = completion_logprobs(f32, batch), completion_logprobs(bf16, batch)
    gap = (lp16.double() - lp32.double()).abs()[mask]
    seq_gap = ((lp16.double() - lp32.double()) * batch.completion_mask).sum(1).abs()  # |log ratio| per sequence

    f32.train(), bf16.train()
    fwd_bwd_seconds(f32, batch), fwd_bwd_seconds(bf16, batch)  # warm-up (oneDNN picks its kernels)
    times = {"float32": [], "bfloat16": []}
    for _ in range(args.rounds):
        times["float32"].append(fwd_bwd_seconds(f32, batch))
        times["bfloat16"].append(fwd_bwd_seconds(bf16, batch))

    # AdamW's first update is lr * g / (|g| + eps) ~ lr * sign(g) per element: the share of bfloat16 weights that
    # this update moves at all (the rest round back to the same bfloat16 value and the step is lost).
    survives = {}
    for lr in (1e-6, 1e-5, 1e-4, 3e-4):
        moved = total = 0
        for p in bf16.parameters():
            if p.grad is None:
                continue
            step = lr * p.grad.float() / (p.grad.float().abs() + 1e-8)
            moved += ((p.float() - step).to(torch.bfloat16) != p).sum().item()
            total += p.numel()
        survives[f"{lr:g}"] = moved / total

    machine = describe_machine()
    result = {
        "model_dir": args.model_dir, "threads": args.threads, "prompts": len(PROMPTS),
        "completion_tokens": int(mask.sum()), "batch_shape": list(batch.input_ids.shape),
        "logprob_gap_nats_per_token": {"mean": gap.mean().item(), "max": gap.max().item(),
                                       "p99": gap.quantile(0.99).item()},
        "sequence_log_ratio_abs": {"mean": seq_gap.mean().item(), "max": seq_gap.max().item()},
        "fwd_bwd_seconds_median": {k: median(v) for k, v in times.items()},
        "fwd_bwd_seconds": times,
        "bf16_adamw_first_step_share_of_weights_moved": survives,
        "cpu": machine["cpu"], "native_bf16": has_native_bf16(cpu_flags()),
        "torch_cpu_capability": machine["torch_cpu_capability"], "torch": machine["torch"],
    }
    write_json(RESULTS, result)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
