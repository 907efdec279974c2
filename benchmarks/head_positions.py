"""The LM head at completion positions only (training/batch.py::completion_logits) against the old full forward (the
head over every prompt + completion position, then gathered), on Qwen2-style models with a 32,000-token vocabulary:
(a) the reference forward (no grad) and (b) the policy's training forward + backward, old and new alternated over
three rounds. Writes benchmarks/results/head_positions.json.

    .venv/bin/python benchmarks/head_positions.py                          # ~2.5 min, 1 torch thread
    .venv/bin/python benchmarks/head_positions.py --rows 4m=8 --rows 94m=2 --rounds 1   # a quick look

Bodies: the tiny-model factory's "4m" and "80m" shapes (4.2M and 94.4M parameters outside the embeddings: the 4M
and 94M of the issue), with untied input and output embeddings of 32,000 x hidden each (20.6M and 143.6M in all).
Random weights and token ids: timing only, no tokenizer. One timed call per phase and variant per round; rows
default to 64 at 4M and 16 at 94M so the whole run fits in ~2.5 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import common
import torch
from common import loadavg, median, round_order, write_json

from posttrain.algorithms.common import token_entropy, token_logprobs
from posttrain.models.tiny import TINY_SIZES
from posttrain.training.batch import completion_logits, full_forward_completion_logits, pack, split_head

RESULTS = Path(__file__).resolve().parent / "results" / "head_positions.json"
VOCAB = 32_000
SIZES = {"4m": "4m", "94m": "80m"}  # label here -> TINY_SIZES shape
PROMPT_TOKENS = (26, 34)  # each prompt's length drawn uniformly from this range: ~30 tokens
COMPLETION_TOKENS = 32
PAD = 0


def build_model(shape: str):
    from transformers import AutoModelForCausalLM, Qwen2Config

    hidden, layers, heads, kv_heads, inter = TINY_SIZES[shape]
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, intermediate_size=inter, max_position_embeddings=128,
                         tie_word_embeddings=False, rms_norm_eps=1e-6, pad_token_id=PAD)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def random_batch(rows: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(PROMPT_TOKENS[0], PROMPT_TOKENS[1] + 1, (rows,), generator=g).tolist()
    prompts = [torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in lengths]
    completions = [torch.randint(1, VOCAB, (COMPLETION_TOKENS,), generator=g).tolist() for _ in range(rows)]
    return pack(prompts, completions, PAD)


def logits_fn(variant: str):
    return completion_logits if variant == "new" else full_forward_completion_logits


def reference_forward(model, batch, variant: str) -> torch.Tensor:
    """What ReferenceModel.logprobs computes: [B, T] logprobs, no grad."""
    with torch.no_grad():
        return token_logprobs(logits_fn(variant)(model, batch), batch.targets) * batch.completion_mask


def train_forward_backward(model, batch, variant: str, advantages: torch.Tensor) -> None:
    """The trainer's single-pass step without the optimizer: logprobs and (detached) entropy, a policy-gradient
    loss (token mean of -A * logp), backward."""
    logits = logits_fn(variant)(model, batch)
    mask = batch.completion_mask
    lp = token_logprobs(logits, batch.targets) * mask
    token_entropy(logits.detach())
    loss = -(lp * advantages[:, None]).sum() / mask.sum()
    model.zero_grad(set_to_none=True)
    loss.backward()


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(label: str, rows: int, rounds: int) -> dict:
    shape = SIZES[label]
    model = build_model(shape)
    assert split_head(model) is not None
    batch = random_batch(rows, seed=1)
    advantages = torch.randn(rows, generator=torch.Generator().manual_seed(2))
    total = sum(p.numel() for p in model.parameters())
    embeddings = model.get_input_embeddings().weight.numel() + model.get_output_embeddings().weight.numel()

    model.eval()
    # Same numbers both ways (here, at 32k vocabulary), and one untimed call per variant and phase to warm up.
    diff = float((reference_forward(model, batch, "new") - reference_forward(model, batch, "old")).abs().max())
    model.train()
    for variant in ("old", "new"):
        train_forward_backward(model, batch, variant, advantages)

    per_round = []
    for r in range(rounds):
        order = round_order(("old", "new"), r)  # alternate who goes first against drift
        row = {"order": list(order)}
        model.eval()
        for v in order:
            row[f"reference_{v}_s"] = timed(lambda: reference_forward(model, batch, v))
        model.train()
        for v in order:
            row[f"train_{v}_s"] = timed(lambda: train_forward_backward(model, batch, v, advantages))
        for phase in ("reference", "train"):
            row[f"{phase}_new_over_old"] = row[f"{phase}_new_s"] / row[f"{phase}_old_s"]
        per_round.append({k: (round(x, 4) if isinstance(x, float) else x) for k, x in row.items()})
        print(label, per_round[-1], flush=True)

    medians = {k: round(median(p[k] for p in per_round), 4)
               for k in per_round[0] if k != "order"}
    L, T = batch.input_ids.shape[1], batch.targets.shape[1]
    return {
        "body_shape": f"TINY_SIZES[{shape!r}] (hidden, layers, heads, kv_heads, intermediate) = {TINY_SIZES[shape]}",
        "params_total": total, "params_outside_embeddings": total - embeddings, "vocab": VOCAB,
        "rows": rows, "prompt_tokens": list(PROMPT_TOKENS), "completion_tokens": COMPLETION_TOKENS,
        "padded_length": L, "head_positions_old": rows * L, "head_positions_new": rows * T,
        "max_abs_logprob_diff_new_vs_old": diff,
        "rounds": per_round, "medians": medians,
    }


def machine(threads: int) -> dict:
    return common.machine(torch_threads=threads, transformers=common.library_version("transformers"),
                          loadavg_1_5_15_min_at_start=loadavg())


def write_results(out: dict, path: Path, t0: float) -> None:
    """Stamps the wall seconds since `t0` and the load at the end on `out`, and writes it as JSON to `path`."""
    out["wall_seconds"] = round(time.perf_counter() - t0, 1)
    out["machine"]["loadavg_1_5_15_min_at_end"] = loadavg()
    write_json(path, out, indent=2)
    print(f"wrote {path} ({out['wall_seconds']} s)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", action="append", default=[], metavar="SIZE=N",
                    help="rows per batch for a size (default 4m=64, 94m=16)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--note", default="")
    args = ap.parse_args()
    rows = {"4m": 64, "94m": 16} | {k: int(v) for k, v in (s.split("=") for s in args.rows)}
    torch.set_num_threads(args.threads)
    out = {"machine": machine(args.threads), "note": args.note}
    t0 = time.perf_counter()
    out["sizes"] = {label: measure(label, rows[label], args.rounds) for label in SIZES}
    write_results(out, RESULTS, t0)


if __name__ == "__main__":
    main()
