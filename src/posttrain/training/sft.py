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

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import torch

from posttrain.algorithms.common import masked_mean, token_logprobs
from posttrain.models.loading import PromptEncoder, load_causal_lm
from posttrain.training.batch import head_logprobs, split_head
from posttrain.training.heldout import greedy_accuracy
from posttrain.tasks import load_task
from posttrain.training.recipe import batch_indices, optimizer_step, run_recipe, save_model_dir

if TYPE_CHECKING:
    from posttrain.config import RunConfig, SFTConfig
    from posttrain.tasks.base import Problem, Task

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


# Below this many bytes of float32 [B, T, V] logits the loss takes them whole: no more than one 512-token chunk of a
# real vocabulary's head holds (49,152 words: 96 MiB), and every small-vocabulary SFT (the tiny demo and test models)
# keeps the path its fixtures were tuned on (docs/numerics.md: the learning tests a different warm model broke).
WHOLE_LOGITS_MAX_BYTES = 64 * 2**20


def sft_batch_loss(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   loss_mask: torch.Tensor) -> torch.Tensor:
    """`sft_loss` of `model` on one right-padded batch ([B, T] each). Where the batch's [B, T, V] float32 logits
    would exceed WHOLE_LOGITS_MAX_BYTES and the LM head splits off (training/batch.py::split_head), without them: the
    head and log-softmax run over the N target tokens only, in chunks (`head_logprobs`), so at most
    [HEAD_CHUNK_TOKENS, V] exists at a time. The same value and gradient as the whole computation
    (tests/test_chunked_logprobs.py, float64)."""
    split = split_head(model)
    if split is None or input_ids.numel() * split[1].out_features * 4 <= WHOLE_LOGITS_MAX_BYTES:
        return sft_loss(model(input_ids=input_ids, attention_mask=attention_mask).logits, input_ids, loss_mask)
    body, head = split
    hidden = body(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
    targets = loss_mask[:, 1:] != 0  # position t predicts token t + 1
    logp, _ = head_logprobs(head, hidden[:, :-1][targets], input_ids[:, 1:][targets])
    return -logp.sum() / max(int(targets.sum()), 1)


def warmup_lr(step: int, lr: float, warmup_steps: int) -> float:
    """Linear warm-up from lr/warmup_steps to lr over `warmup_steps` optimizer steps, then constant (the run stops on
    a held-out target, not at a planned length, so there is no decay horizon to aim at)."""
    return lr * min(1.0, (step + 1) / warmup_steps) if warmup_steps > 0 else lr


# ---------------------------------------------------------------- the loop, shared with SFT on traces


def sft_steps(model, examples: Sequence[tuple[list[int], list[int]]], pad_id: int, sft: "SFTConfig",
              seed: int) -> Iterator[tuple[int, float]]:
    """The SFT inner loop (also run_sft_traces'): AdamW on every weight, batches of `sft.batch_size` examples in a
    seeded order, `sft.warmup_steps` of linear warm-up, the loss on the tokens whose loss mask is 1 only. `examples`
    are (token ids, 0/1 loss mask) rows: how a problem or a trace becomes one is the caller's. Yields (step, loss)
    after each optimizer step, up to `sft.max_steps`; leaving the loop early stops training."""
    input_ids, loss_mask = pack_examples(examples, pad_id)
    # From the examples, not from `!= pad`: tokenizers without a pad token reuse EOS as pad (see load_tokenizer).
    lengths = torch.tensor([len(ids) for ids, _ in examples])
    batches = batch_indices(len(examples), sft.batch_size, torch.Generator().manual_seed(seed))
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(params, lr=sft.lr, weight_decay=WEIGHT_DECAY)
    model.train()
    for step in range(sft.max_steps):
        idx = next(batches)
        width = int(lengths[idx].max())
        ids, mask = input_ids[idx, :width], loss_mask[idx, :width]
        attention = (torch.arange(width)[None, :] < lengths[idx, None]).long()
        for group in optimizer.param_groups:
            group["lr"] = warmup_lr(step, sft.lr, sft.warmup_steps)
        loss = sft_batch_loss(model, ids, attention, mask)
        optimizer_step(optimizer, loss, params, MAX_GRAD_NORM)
        yield step + 1, loss.item()


# ---------------------------------------------------------------- the run: setup -> train -> save (recipe.py)


@dataclass
class SFTSetup:
    cfg: "RunConfig"
    base_model_dir: str | Path
    out_dir: str | Path
    started: float                                  # perf_counter at the start of setup
    model: Any
    tokenizer: Any
    encoder: PromptEncoder
    task: "Task"                                    # train and held-out problems
    examples: list[tuple[list[int], list[int]]]     # the training split, encoded (encode_sft_example)


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
    return run_recipe(cfg, lambda: setup_sft(cfg, base_model_dir, out_dir), lambda run: train_sft(run, on_eval),
                      save_sft)


def setup_sft(cfg: "RunConfig", base_model_dir: str | Path, out_dir: str | Path) -> SFTSetup:
    """Loads the base model (float32), its tokenizer and the task, and encodes the training split."""
    started = time.perf_counter()
    model, tok = load_causal_lm(base_model_dir, dtype="float32", field="sft base model")
    encoder = PromptEncoder(tok, mode=cfg.model.chat_template)
    task = load_task(cfg.task, cfg.seed)
    examples = [encode_sft_example(encoder, p) for p in task.train]
    return SFTSetup(cfg, base_model_dir, out_dir, started, model, tok, encoder, task, examples)


def train_sft(run: SFTSetup, on_eval: Callable[[int, float], None] | None = None) -> SFTResult:
    """`sft_steps` until the first held-out evaluation at or above the target, or `sft.max_steps`; the result
    without its wall time (save_sft adds it)."""
    cfg, sft = run.cfg, run.cfg.sft
    history: list[tuple[int, float]] = []
    accuracy, reached, step = 0.0, False, 0
    for step, _ in sft_steps(run.model, run.examples, run.tokenizer.pad_token_id, sft, cfg.seed):
        if step % sft.eval_every == 0 or step == sft.max_steps:
            accuracy, _ = greedy_accuracy(run.model, run.encoder, run.task, run.task.heldout,
                                          max_new_tokens=cfg.eval.max_new_tokens)
            history.append((step, accuracy))
            if on_eval is not None:
                on_eval(step, accuracy)
            if accuracy >= sft.target_accuracy:
                reached = True
                break
    return SFTResult(steps=step, heldout_accuracy=accuracy, wall_seconds=0.0, history=history,
                     out_dir=str(run.out_dir), reached_target=reached)


def save_sft(run: SFTSetup, result: SFTResult) -> SFTResult:
    """Writes the model + tokenizer and `sft.json` (provenance) to `out_dir`; returns the result with its wall time."""
    cfg = run.cfg
    save_model_dir(run.model, run.tokenizer, run.out_dir, provenance={
        "base_model": str(run.base_model_dir), "seed": cfg.seed, "task": cfg.task.model_dump(),
        "sft": cfg.sft.model_dump(), "steps": result.steps, "heldout_accuracy": result.heldout_accuracy,
        "history": result.history, "reached_target": result.reached_target,
    })
    result.wall_seconds = time.perf_counter() - run.started
    return result
