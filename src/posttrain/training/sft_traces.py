"""SFT on multi-turn traces (conversations with tool calls): the warm start of a tool-using policy.

A trace is chat messages: the prompt's (system, user), then assistant turns and, between them, the tool or user
messages that answered them. It is turned into ids exactly as a multi-turn rollout builds an episode
(rollout/trajectory.py), so the policy is trained on the token sequences it will later be asked to continue:
- the prompt is `ChatRenderer.prompt_ids(first messages)` (tools and generation prompt included);
- an assistant turn is its text tokenized on its own + EOS (what the engine samples when it ends a turn);
- the messages after an assistant turn are `ChatRenderer.delta_ids(history, new, that turn's ids)`.
The loss mask is 1 on assistant tokens (EOS included) and 0 elsewhere, as the RL trainer's mask is.

    from posttrain.training.sft_traces import run_sft_traces
    result = run_sft_traces(cfg, "runs/demo-tools/base-model", "runs/demo-tools/sft-model", traces, tools)

Trains for `sft.max_steps` steps (batches of `sft.batch_size` traces, AdamW at `sft.lr` with `sft.warmup_steps` of
linear warm-up); plain torch + transformers, in-process, deterministic given `seed`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from posttrain.errors import PosttrainError
from posttrain.models.loading import load_causal_lm
from posttrain.rollout.trajectory import ChatRenderer
from posttrain.training.recipe import run_recipe, save_model_dir
from posttrain.training.sft import sft_steps

if TYPE_CHECKING:
    from posttrain.config import RunConfig


@dataclass
class TraceSFTResult:
    steps: int             # optimizer steps taken
    final_loss: float      # mean training loss (nats per assistant token) over the last 10 steps
    wall_seconds: float    # loading, training and saving
    out_dir: str = ""


def encode_trace(renderer: ChatRenderer, messages: Sequence[dict]) -> tuple[list[int], list[int]]:
    """Token ids of one trace and its 0/1 loss mask (1 on assistant tokens and their EOS). Messages after the last
    assistant turn are dropped (nothing is learned from them)."""
    first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), None)
    if first is None or first == 0:
        raise PosttrainError("sft trace: a trace needs prompt messages, then at least one assistant turn",
                             hint=f"got roles {[m['role'] for m in messages]}")
    eos = renderer.tokenizer.eos_token_id
    ids = renderer.prompt_ids(list(messages[:first]))
    mask = [0] * len(ids)
    history, sampled, pending = list(messages[:first]), [], []
    for m in messages[first:]:
        if m["role"] != "assistant":
            pending.append(m)
            continue
        if pending:
            delta = renderer.delta_ids(history, pending, sampled)
            ids += delta
            mask += [0] * len(delta)
            history += pending
            pending = []
        elif sampled:
            raise PosttrainError("sft trace: two assistant turns in a row",
                                 hint="put the tool or user messages that answered the first between them")
        sampled = renderer.encode(m["content"]) + [eos]
        ids += sampled
        mask += [1] * len(sampled)
        history.append(m)
    return ids, mask


@dataclass
class TraceSFTSetup:
    cfg: "RunConfig"
    base_model_dir: str | Path
    out_dir: str | Path
    started: float                               # perf_counter at the start of setup
    model: Any
    tokenizer: Any
    examples: list[tuple[list[int], list[int]]]  # the traces, encoded (encode_trace)


def run_sft_traces(
    cfg: "RunConfig",
    base_model_dir: str | Path,
    out_dir: str | Path,
    traces: Sequence[Sequence[dict]],
    tools: list[dict] | None = None,
    on_step: Callable[[int, float], None] | None = None,
) -> TraceSFTResult:
    """Fine-tunes the model in `base_model_dir` on `traces` (chat messages each, see `encode_trace`) for
    `sft.max_steps` steps and writes model + tokenizer to `out_dir` (replaced whole). `tools`: the JSON schemas the
    chat template shows (as the rollout's). `on_step(step, loss)` after each step. Uses `topology.torch_threads`
    intra-op threads; the caller's setting is restored on return."""
    return run_recipe(cfg, lambda: setup_trace_sft(cfg, base_model_dir, out_dir, traces, tools),
                      lambda run: train_trace_sft(run, on_step), save_trace_sft)


def setup_trace_sft(cfg: "RunConfig", base_model_dir: str | Path, out_dir: str | Path,
                    traces: Sequence[Sequence[dict]], tools: list[dict] | None) -> TraceSFTSetup:
    """Loads the base model (float32) and its tokenizer, and encodes the traces; a trace longer than the model's
    positions is an error."""
    started = time.perf_counter()
    model, tok = load_causal_lm(base_model_dir, dtype="float32", field="sft base model")
    renderer = ChatRenderer(tok, tools, str(base_model_dir))
    examples = [encode_trace(renderer, t) for t in traces]
    longest = max(len(ids) for ids, _ in examples)
    if longest > model.config.max_position_embeddings:
        raise PosttrainError(f"sft trace: a trace is {longest} tokens, longer than the model's "
                             f"max_position_embeddings={model.config.max_position_embeddings}",
                             hint="build the model with a longer max_position_embeddings or shorten the traces")
    return TraceSFTSetup(cfg, base_model_dir, out_dir, started, model, tok, examples)


def train_trace_sft(run: TraceSFTSetup, on_step: Callable[[int, float], None] | None = None) -> list[float]:
    """`sft.max_steps` steps of the SFT loop (sft.sft_steps); the training loss of each."""
    losses: list[float] = []
    for step, loss in sft_steps(run.model, run.examples, run.tokenizer.pad_token_id, run.cfg.sft, run.cfg.seed):
        losses.append(loss)
        if on_step is not None:
            on_step(step, loss)
    run.model.eval()
    return losses


def save_trace_sft(run: TraceSFTSetup, losses: list[float]) -> TraceSFTResult:
    """Writes the model + tokenizer and `sft.json` (provenance) to `out_dir`."""
    cfg = run.cfg
    final_loss = sum(losses[-10:]) / max(1, len(losses[-10:]))
    save_model_dir(run.model, run.tokenizer, run.out_dir, provenance={
        "base_model": str(run.base_model_dir), "seed": cfg.seed, "sft": cfg.sft.model_dump(),
        "traces": len(run.examples), "steps": cfg.sft.max_steps, "final_loss": final_loss,
    })
    return TraceSFTResult(steps=cfg.sft.max_steps, final_loss=final_loss,
                          wall_seconds=time.perf_counter() - run.started, out_dir=str(run.out_dir))
