"""Packed training (training/packing.py, `train.packing`) against padding to the longest: the trainer's forward +
backward and the reference's forward, alternated over several rounds, at four length mixes on the repo's 4M and
94M shapes. Writes benchmarks/results/packing.json. Three variants:
  padded        today's path (`train.packing=false`): [B, L] rows, the head over [B, T] completion positions
  padded_head   padded rows, the head and softmax over the trained tokens only (`batch.trained_token_logprobs`):
                the head lever alone, without packing
  packed        `train.packing=true`: packed rows and the head over the trained tokens only

    .venv/bin/python benchmarks/packing.py            # ~2.5 min on 2 cores (also run by `make bench`)
    .venv/bin/python benchmarks/packing.py --mixes uniform --sizes 4m --rounds 1     # a quick look

Bodies: the tiny-model factory's "4m" and "80m" shapes (4.2M and 94.4M parameters outside the embeddings; the
94M of benchmarks/head_positions.py), Qwen2-style, random weights and token ids (timing only). Vocabularies as in
perf.py's workloads: the addition mixes on the 46-token character tokenizer's models (`build_tiny_model`, the
head is cheap), the others with untied 32,000-token embeddings (as dense30; the head is a large share). Length
mixes (prompt tokens + completion tokens per sequence):
  addition_random  the addition task's prompts (character tokens) and what an untrained policy samples on its
                   46-token vocabulary: stop at EOS with p = 1/46 per token, cut at 32 (perf.json's addition
                   workload, mean completion 21.4 tokens)
  addition_trained the same prompts, completions of answer + EOS (a trained policy: 3-5 tokens)
  long_tail        ~30-token prompts, completions log-normal (median 16 tokens, sigma 1.2) cut to 1..192
  uniform          30-token prompts, 32-token completions: nothing to pack (packing must not be slower)
Rows per batch: 32 at 4M (perf.py's 8 prompts x 4 completions), 16 at 94M. One timed call per phase and variant
per round, the order rotated; medians over 5 rounds at 4M, 3 at 94M.
"""

from __future__ import annotations

import argparse
import math
import random
import tempfile
import time
from pathlib import Path

import torch
from common import median, round_order
# the same models, machine record and timer as the head-positions benchmark (benchmarks/ is on the path when run)
from head_positions import PAD, SIZES, VOCAB, build_model, machine, timed, write_results

from posttrain.models.tiny import TINY_SIZES
from posttrain.training.batch import completion_logprobs, pack, trained_token_logprobs
from posttrain.training.packing import pack_rows

RESULTS = Path(__file__).resolve().parent / "results" / "packing.json"
ROWS = {"4m": 32, "94m": 16}
ROUNDS = {"4m": 5, "94m": 3}  # a 94M long-tail round takes ~10 s
MIXES = ("addition_random", "addition_trained", "long_tail", "uniform")


def model_for(mix: str, shape: str, workdir: Path):
    """The addition mixes' character-tokenizer model, or the 32,000-token one."""
    if not mix.startswith("addition"):
        return build_model(shape), VOCAB
    from posttrain.models.loading import load_causal_lm
    from posttrain.models.tiny import build_tiny_model

    model, tok = load_causal_lm(build_tiny_model(workdir / shape, shape, seed=0), "float32")
    return model, len(tok)


def lengths(mix: str, rows: int, seed: int) -> list[tuple[int, int]]:
    """(prompt tokens, completion tokens) per sequence."""
    from posttrain.tasks.addition import AdditionTask

    rng = random.Random(f"{mix}/{seed}")
    if mix in ("addition_random", "addition_trained"):
        problems = AdditionTask(train_size=rows, heldout_size=1, seed=seed).train[:rows]
        if mix == "addition_trained":
            return [(len(p.prompt), len(p.answer) + 1) for p in problems]
        # tokens until EOS (p = 1/46 each), at most 32: a geometric draw, cut
        return [(len(p.prompt), min(32, 1 + int(math.log(1 - rng.random()) / math.log(1 - 1 / 46))))
                for p in problems]
    if mix == "long_tail":
        return [(rng.randint(26, 34), max(1, min(192, round(rng.lognormvariate(math.log(16), 1.2)))))
                for _ in range(rows)]
    if mix == "uniform":
        return [(30, 32)] * rows
    raise SystemExit(f"--mixes: unknown mix {mix!r}; choose from {', '.join(MIXES)}")


def batches(mix: str, rows: int, seed: int, vocab: int = VOCAB):
    """The same sequences padded and packed (random token ids)."""
    g = torch.Generator().manual_seed(seed)
    sizes = lengths(mix, rows, seed)
    prompts = [torch.randint(1, vocab, (p,), generator=g).tolist() for p, _ in sizes]
    completions = [torch.randint(1, vocab, (c,), generator=g).tolist() for _, c in sizes]
    return pack(prompts, completions, PAD), pack(prompts, completions, PAD, packed_rows=True)


VARIANTS = ("padded", "padded_head", "packed")


def logprobs_fn(variant: str):
    return trained_token_logprobs if variant == "padded_head" else completion_logprobs


def reference_forward(model, batch, variant: str) -> torch.Tensor:
    """What ReferenceModel.logprobs computes: [B, T] logprobs, no grad."""
    with torch.no_grad():
        return logprobs_fn(variant)(model, batch)


def train_forward_backward(model, batch, variant: str, advantages: torch.Tensor) -> None:
    """The trainer's single-pass step without the optimizer: logprobs and entropy (as Trainer.train_step asks
    for them), a policy-gradient loss (token mean of -A * logp), backward."""
    lp, _ = logprobs_fn(variant)(model, batch, with_entropy=True)
    loss = -(lp * advantages[:, None]).sum() / batch.completion_mask.sum()
    model.zero_grad(set_to_none=True)
    loss.backward()


def measure(model, vocab: int, mix: str, rows: int, rounds: int) -> dict:
    padded, packed = batches(mix, rows, seed=1, vocab=vocab)
    variants = {"padded": padded, "padded_head": padded, "packed": packed}
    advantages = torch.randn(rows, generator=torch.Generator().manual_seed(2))
    real = int(padded.attention_mask.sum())
    layout = pack_rows(packed.input_ids, packed.attention_mask.sum(1))

    model.eval()
    diff = float((reference_forward(model, packed, "packed") - reference_forward(model, padded, "padded")).abs().max())
    model.train()
    for v, batch in variants.items():  # one untimed call per variant to warm up
        train_forward_backward(model, batch, v, advantages)

    per_round = []
    for r in range(rounds):
        order = round_order(VARIANTS, r)  # rotate who goes first against drift
        row = {"order": list(order)}
        model.eval()
        for v in order:
            row[f"reference_{v}_s"] = timed(lambda: reference_forward(model, variants[v], v))
        model.train()
        for v in order:
            row[f"train_{v}_s"] = timed(lambda: train_forward_backward(model, variants[v], v, advantages))
        for phase in ("reference", "train"):
            for v in ("padded_head", "packed"):
                row[f"{phase}_{v}_over_padded"] = row[f"{phase}_{v}_s"] / row[f"{phase}_padded_s"]
        per_round.append({k: (round(x, 4) if isinstance(x, float) else x) for k, x in row.items()})
        print(mix, per_round[-1], flush=True)

    medians = {k: round(median(p[k] for p in per_round), 4) for k in per_round[0] if k != "order"}
    sequence_lengths = padded.attention_mask.sum(1).tolist()
    return {
        "vocab": vocab, "params_total": sum(p.numel() for p in model.parameters()), "sequences": rows, "sequence_tokens_min_median_max": [min(sequence_lengths),
                                                              median(sequence_lengths),
                                                              max(sequence_lengths)],
        "real_tokens": real,
        "padded_shape": list(padded.input_ids.shape), "packed_shape": list(layout.input_ids.shape),
        "padded_tokens": padded.input_ids.numel(), "packed_tokens": layout.input_ids.numel(),
        "max_abs_logprob_diff_packed_vs_padded": diff,
        "rounds": per_round, "medians": medians,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="4m,94m")
    ap.add_argument("--mixes", default=",".join(MIXES))
    ap.add_argument("--rounds", type=int, default=None, help="rounds per mix (default 5 at 4m, 3 at 94m)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--note", default="")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rounds = {label: args.rounds or n for label, n in ROUNDS.items()}
    out = {"machine": machine(args.threads), "note": args.note, "rows": ROWS, "rounds": rounds, "vocab": VOCAB,
           "row_capacity": "the longest sequence of the batch (packed rows are never longer than padded ones)"}
    t0 = time.perf_counter()
    out["sizes"] = {}
    with tempfile.TemporaryDirectory() as workdir:
        for label in (s for s in args.sizes.split(",") if s):
            if label not in SIZES:
                raise SystemExit(f"--sizes: unknown size {label!r}; choose from {', '.join(SIZES)}")
            shape = SIZES[label]
            mixes = {}
            for mix in (m for m in args.mixes.split(",") if m):
                lengths(mix, 1, 0)  # an unknown mix stops here, before a model is built
                model, vocab = model_for(mix, shape, Path(workdir))
                mixes[mix] = measure(model, vocab, mix, ROWS[label], rounds[label])
            out["sizes"][label] = {
                "body_shape": f"TINY_SIZES[{shape!r}] (hidden, layers, heads, kv_heads, intermediate) = "
                              f"{TINY_SIZES[shape]}",
                "mixes": mixes,
            }
    write_results(out, RESULTS, t0)


if __name__ == "__main__":
    main()
