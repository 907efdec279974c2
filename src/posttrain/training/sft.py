"""SFT warm start: supervised fine-tuning on the task's training split until the held-out greedy accuracy reaches a
target, so that RL starts from a policy that sometimes solves the task (GRPO learns nothing from groups that all
score 0) but leaves it room to improve.

    from posttrain.config import load_config
    from posttrain.training.sft import run_sft
    result = run_sft(load_config(), "runs/demo/base-model", "runs/demo/sft-model")

Plain torch + transformers, in-process (no Ray). Learning on tiny models comes in a sudden jump after a plateau of
unpredictable length, so a fixed step count lands anywhere: we stop at the first evaluation at or above
`sft.target_accuracy` (capped at `sft.max_steps`). Deterministic given `seed`.

Measured on the "1m" tiny model, addition, defaults (2 cores, 0.13-0.16 s/step): held-out accuracy sits at 1-5%
for hundreds of steps, then jumps ~10-17 points per 50 steps; seed 0 reached 22% at step 1000 (162 s), seed 2
36% at step 850 (19% at 800); seed 1 was still at 9% when capped at 1,800 steps.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import torch

from posttrain.algorithms.common import masked_mean, token_logprobs
from posttrain.training.heldout import greedy_accuracy
from posttrain.models.loading import PromptEncoder, load_causal_lm
from posttrain.tasks import load_task

if TYPE_CHECKING:
    from posttrain.config import RunConfig
    from posttrain.tasks.base import Problem

WEIGHT_DECAY = 0.01   # torch's AdamW default; the measured recipe used it
MAX_GRAD_NORM = 1.0   # guards the tiny model against the occasional spike around its sudden jump in accuracy


@dataclass
class SFTResult:
    steps: int                          # optimizer steps taken
    heldout_accuracy: float             # held-out greedy accuracy of the saved model, in [0, 1]
    wall_seconds: float                 # whole run: loading, training, evaluations and saving
    history: list[tuple[int, float]] = field(default_factory=list)  # (step, held-out accuracy) per evaluation
    out_dir: str = ""
    reached_target: bool = False


# ---------------------------------------------------------------- data: pure, no I/O


def encode_sft_example(encoder: PromptEncoder, problem: "Problem") -> tuple[list[int], list[int]]:
    """Token ids of prompt + answer + EOS, and a 0/1 mask that is 1 on the answer and EOS tokens (the targets)."""
    prompt = encoder.encode(problem.prompt)
    answer = list(encoder.tokenizer(problem.answer, add_special_tokens=False)["input_ids"])
    answer.append(encoder.tokenizer.eos_token_id)
    return prompt + answer, [0] * len(prompt) + [1] * len(answer)


def pack_examples(examples: Sequence[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pads examples into (input_ids [N, T], loss_mask [N, T]); padding has loss_mask 0."""
    width = max(len(ids) for ids, _ in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for i, (seq, m) in enumerate(examples):
        ids[i, : len(seq)] = torch.tensor(seq)
        mask[i, : len(m)] = torch.tensor(m)
    return ids, mask


def sft_loss(logits: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood (nats/token) of the tokens where loss_mask is 1, each predicted from the tokens
    before it. logits [B, T, V] from input_ids [B, T]; loss_mask [B, T] marks target tokens (answer + EOS)."""
    logp = token_logprobs(logits[:, :-1], input_ids[:, 1:])
    return -masked_mean(logp, loss_mask[:, 1:])


def batch_indices(num_examples: int, batch_size: int, generator: torch.Generator):
    """Endless stream of index batches: a fresh seeded permutation each epoch, batches never straddle epochs."""
    if batch_size > num_examples:
        batch_size = num_examples
    while True:
        order = torch.randperm(num_examples, generator=generator)
        for start in range(0, num_examples - batch_size + 1, batch_size):
            yield order[start:start + batch_size]


def warmup_lr(step: int, lr: float, warmup_steps: int) -> float:
    """Linear warm-up from lr/warmup_steps to lr over `warmup_steps` optimizer steps, then constant (the run stops on
    a held-out target, not at a planned length, so there is no decay horizon to aim at)."""
    return lr * min(1.0, (step + 1) / warmup_steps) if warmup_steps > 0 else lr


# ---------------------------------------------------------------- the run


def run_sft(
    cfg: "RunConfig",
    base_model_dir: str | Path,
    out_dir: str | Path,
    on_eval: Callable[[int, float], None] | None = None,
) -> SFTResult:
    """Fine-tunes the model in `base_model_dir` on `task.train` (never on `task.heldout`), evaluates held-out greedy
    accuracy every `sft.eval_every` steps, stops at the first evaluation >= `sft.target_accuracy` or at
    `sft.max_steps`, and writes the model + tokenizer to `out_dir` (replaced whole, never left half-written).
    `on_eval(step, accuracy)` is called after each evaluation. Uses `topology.torch_threads` intra-op threads (the
    caller's setting is restored on return): more threads than free cores slows a model this small several-fold."""
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.topology.torch_threads)
    try:
        return _run_sft(cfg, base_model_dir, out_dir, on_eval)
    finally:
        torch.set_num_threads(threads)


def _run_sft(cfg: "RunConfig", base_model_dir, out_dir, on_eval) -> SFTResult:
    t0 = time.perf_counter()
    torch.manual_seed(cfg.seed)
    sft = cfg.sft

    model, tok = load_causal_lm(base_model_dir, dtype="float32", field="sft base model")
    encoder = PromptEncoder(tok, mode=cfg.model.chat_template)
    task = load_task(cfg.task, cfg.seed)
    examples = [encode_sft_example(encoder, p) for p in task.train]
    input_ids, loss_mask = pack_examples(examples, tok.pad_token_id)
    # From the examples, not from `!= pad`: tokenizers without a pad token reuse EOS as pad (see load_tokenizer).
    lengths = torch.tensor([len(ids) for ids, _ in examples])

    generator = torch.Generator().manual_seed(cfg.seed)
    batches = batch_indices(len(task.train), sft.batch_size, generator)
    optimizer = torch.optim.AdamW(model.parameters(), lr=sft.lr, weight_decay=WEIGHT_DECAY)

    history: list[tuple[int, float]] = []
    accuracy, reached, step = 0.0, False, 0
    model.train()
    while step < sft.max_steps:
        idx = next(batches)
        width = int(lengths[idx].max())
        ids, mask = input_ids[idx, :width], loss_mask[idx, :width]
        attention = (torch.arange(width)[None, :] < lengths[idx, None]).long()
        for group in optimizer.param_groups:
            group["lr"] = warmup_lr(step, sft.lr, sft.warmup_steps)
        logits = model(input_ids=ids, attention_mask=attention).logits
        loss = sft_loss(logits, ids, mask)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        optimizer.step()
        step += 1

        if step % sft.eval_every == 0 or step == sft.max_steps:
            accuracy, _ = greedy_accuracy(model, encoder, task, task.heldout, max_new_tokens=cfg.eval.max_new_tokens)
            history.append((step, accuracy))
            if on_eval is not None:
                on_eval(step, accuracy)
            if accuracy >= sft.target_accuracy:
                reached = True
                break

    result = SFTResult(
        steps=step, heldout_accuracy=accuracy, wall_seconds=0.0, history=history, out_dir=str(out_dir),
        reached_target=reached,
    )
    save_model_dir(model, tok, out_dir, provenance={
        "base_model": str(base_model_dir), "seed": cfg.seed, "task": cfg.task.model_dump(), "sft": sft.model_dump(),
        "steps": step, "heldout_accuracy": accuracy, "history": history, "reached_target": reached,
    })
    result.wall_seconds = time.perf_counter() - t0
    return result


def save_model_dir(model, tokenizer, out_dir: str | Path, provenance: dict | None = None) -> Path:
    """Writes an HF directory (safetensors + tokenizer, plus `sft.json` provenance) to a temporary sibling, fsyncs
    it, then renames it into place: a killed run leaves the old directory or the new one, never half of one."""
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp), safe_serialization=True)
    tokenizer.save_pretrained(str(tmp))
    if provenance is not None:
        (tmp / "sft.json").write_text(json.dumps(provenance, indent=2) + "\n")
    for f in tmp.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    if out.exists():
        os.rename(out, old)
    os.rename(tmp, out)
    shutil.rmtree(old, ignore_errors=True)
    return out
