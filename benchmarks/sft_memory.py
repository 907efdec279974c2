"""SFT's peak memory on a real vocabulary: one SFT optimizer step (forward, backward, AdamW) on SmolLM2-135M-Instruct
(vocabulary 49,152) through SFT's loss as it runs on such a batch (`sft_batch_loss` above WHOLE_LOGITS_MAX_BYTES:
the LM head and log-softmax over the target tokens only, in chunks of HEAD_CHUNK_TOKENS) against the whole-logits
loss (`sft_loss` on the model's [B, T, V] logits). Each side runs in a fresh child process; the number is the
child's peak RSS (ru_maxrss) above its RSS once the model is loaded, and the loss both sides computed (equal within
float32 rounding). Writes benchmarks/results/sft_memory.json (docs/real-models.md quotes it).

    .venv/bin/python benchmarks/sft_memory.py /tmp/smol        # an HF dir (posttrain model import), ~2 min

The batch: B rows of T token ids drawn from the vocabulary (seeded), the first 32 of each row a prompt (no loss),
the rest its completion; right-padded rows are not needed for a peak (every row is T long)."""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

from common import lscpu, machine, write_json

RESULTS = Path(__file__).resolve().parent / "results" / "sft_memory.json"
PROMPT_TOKENS = 32


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def one_step(model_dir: str, side: str, rows: int, tokens: int, threads: int) -> dict:
    """In this process: load, one SFT step through `side` ("chunked" or "whole"), the peak above the loaded model."""
    import torch

    import posttrain.training.sft as sft_module
    from posttrain.models.loading import load_causal_lm
    from posttrain.training.recipe import optimizer_step

    torch.set_num_threads(threads)
    model, _ = load_causal_lm(model_dir)
    model.train()
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (rows, tokens), generator=generator)
    attention = torch.ones_like(ids)
    mask = torch.ones_like(ids)
    mask[:, :PROMPT_TOKENS] = 0
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5)
    loaded = rss_mb()
    if side == "chunked":
        sft_module.WHOLE_LOGITS_MAX_BYTES = 0  # the chunked head whatever the batch (at 16 x 160 it is taken anyway)
        loss = sft_module.sft_batch_loss(model, ids, attention, mask)
    else:
        loss = sft_module.sft_loss(model(input_ids=ids, attention_mask=attention).logits, ids, mask)
    optimizer_step(optimizer, loss, params, 1.0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"side": side, "loaded_mb": round(loaded), "peak_mb": round(peak),
            "above_loaded_gb": round((peak - loaded) / 1024, 2),
            "loss": float(loss), "vocabulary": model.config.vocab_size}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=160)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--child", choices=["chunked", "whole"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(one_step(args.model_dir, args.child, args.rows, args.tokens, args.threads)))
        return
    sides = {}
    for side in ("whole", "chunked"):
        out = subprocess.run([sys.executable, __file__, args.model_dir, "--child", side, "--rows", str(args.rows),
                              "--tokens", str(args.tokens), "--threads", str(args.threads)],
                             capture_output=True, text=True, check=True)
        sides[side] = json.loads(out.stdout.strip().splitlines()[-1])
        print(sides[side])
    logits_gb = args.rows * args.tokens * sides["whole"]["vocabulary"] * 4 / 2**30  # one [B, T, V] float32 tensor
    cpu = [line for line in lscpu() if line.split(":")[0] in ("Model name", "CPU family", "Model")]
    write_json(RESULTS, {"machine": machine("torch", "transformers", lscpu=cpu), "model": Path(args.model_dir).name,
                         "batch": f"{args.rows} x {args.tokens} tokens", "threads": args.threads,
                         "whole_logits_gb_float32": round(logits_gb, 2), "sides": sides,
                         "saved_gb": round(sides["whole"]["above_loaded_gb"] - sides["chunked"]["above_loaded_gb"], 2)})
    print(f"peak above the loaded model: whole logits {sides['whole']['above_loaded_gb']} GB, chunked head "
          f"{sides['chunked']['above_loaded_gb']} GB -> {RESULTS}")


if __name__ == "__main__":
    main()
