"""Reward-model training: a scalar head on an HF backbone (AutoModelForSequenceClassification, num_labels=1),
trained with the Bradley-Terry loss on preference pairs, evaluated on held-out pairs every epoch, saved as an HF
directory with the reward mean/std beside it (posttrain_reward.json) for normalization in the loop. With rm.lora the
body trains peft adapters and the head trains whole; rm.out is still a plain HF directory (the adapters merged), with
the adapter in peft's format in rm.out/adapter.

    posttrain rm pairs cfg.yaml            # built-in pairs labelled by the hidden gold function (addition)
    posttrain rm train cfg.yaml            # rm.data -> rm.out

Plain torch + transformers in-process (no Ray), deterministic given `seed`. What reads the saved directory (encoding,
scores, loading) is in rewards/reward_model.py.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch

from posttrain.models.loading import PromptEncoder
from posttrain.rewards.bradley_terry import bradley_terry_loss, mean_margin, pairwise_accuracy, reward_stats
from posttrain.rewards.preferences import PreferencePair, read_preferences
from posttrain.rewards.reward_model import STATS_FILE, encode_sample, load_backbone, scores
from posttrain.training.recipe import optimizer_step, run_recipe, save_model_dir

if TYPE_CHECKING:
    from posttrain.config import RunConfig


@dataclass
class RMResult:
    out_dir: str
    heldout_accuracy: float        # share of held-out pairs ranked right after the last epoch
    heldout_margin: float          # mean r_chosen - r_rejected on held-out pairs
    reward_mean: float             # over the training pairs' completions (both sides), stored for normalization
    reward_std: float
    train_pairs: int
    heldout_pairs: int
    wall_seconds: float
    history: list[dict] = field(default_factory=list)  # per epoch: loss, heldout_accuracy, heldout_margin


def split_heldout(n: int, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(train indices, held-out indices): a seeded shuffle, at least one pair on each side."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    k = min(n - 1, max(1, round(n * fraction)))
    return sorted(order[k:]), sorted(order[:k])


# ---------------------------------------------------------------- the run


def _pair_scores(model, batch, pad_id):
    r = scores(model, [c for c, _, _ in batch] + [r for _, r, _ in batch], pad_id)
    return r[: len(batch)], r[len(batch):]


def evaluate_pairs(model, encoded, pad_id: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(r_chosen [N], r_rejected [N]) without gradients."""
    out_c, out_r = [], []
    with torch.no_grad():
        for i in range(0, len(encoded), batch_size):
            c, r = _pair_scores(model, encoded[i:i + batch_size], pad_id)
            out_c.append(c)
            out_r.append(r)
    return torch.cat(out_c), torch.cat(out_r)


# ---------------------------------------------------------------- the run: setup -> train -> save (recipe.py)


Encoded = tuple[list[int], list[int], float]  # a pair: (prompt + chosen ids, prompt + rejected ids, its margin)


@dataclass
class RMSetup:
    cfg: "RunConfig"
    started: float                 # perf_counter at the start of setup
    model: Any                     # the backbone with its scalar head (with rm.lora: the adapted layers inside)
    tokenizer: Any
    adapters: Any                  # the PeftModel around `model` with rm.lora, else None
    train_set: list[Encoded]
    held_set: list[Encoded]


def train_reward_model(cfg: "RunConfig", log: Callable[[str], None] = lambda m: None,
                       progress: Callable[[int, int, float], None] | None = None) -> RMResult:
    """Trains on cfg.rm.data from cfg.rm.base and writes cfg.rm.out (replaced whole): setup_rm -> train_rm -> save_rm.
    Uses topology.torch_threads intra-op threads (restored on return). progress(done, total, loss) is called after
    each optimizer step."""
    return run_recipe(cfg, lambda: setup_rm(cfg),
                      lambda run: train_rm(run, log, progress or (lambda done, total, loss: None)), save_rm)


def setup_rm(cfg: "RunConfig") -> RMSetup:
    """Reads rm.data, loads the backbone with a scalar head (and its adapters under rm.lora), encodes the pairs and
    splits off the held-out ones."""
    started = time.perf_counter()
    rm = cfg.rm
    pairs: list[PreferencePair] = read_preferences(rm.data)
    model, tok = load_backbone(rm.base, "rm.base")
    adapters = None
    if rm.lora is not None:  # the adapted layers and the head's trained copy now live inside `model`
        from posttrain.models.lora import apply_lora_reward_model

        adapters = apply_lora_reward_model(model, rm.lora, rm.base)
    encoder = PromptEncoder(tok, cfg.model.chat_template)
    max_len = int(getattr(model.config, "max_position_embeddings", 512) or 512)
    encoded = [(encode_sample(encoder, p.prompt, p.chosen, max_len),
                encode_sample(encoder, p.prompt, p.rejected, max_len), p.margin + rm.margin) for p in pairs]
    train_idx, held_idx = split_heldout(len(encoded), rm.heldout_fraction, cfg.seed)
    return RMSetup(cfg, started, model, tok, adapters, [encoded[i] for i in train_idx], [encoded[i] for i in held_idx])


def train_rm(run: RMSetup, log: Callable[[str], None], progress: Callable[[int, int, float], None]) -> list[dict]:
    """rm.epochs epochs over the training pairs in a seeded order, AdamW on the trained weights (with rm.lora the
    adapters and the head), held-out pairwise accuracy and margin after each; returns the per-epoch records."""
    rm, model, pad_id = run.cfg.rm, run.model, run.tokenizer.pad_token_id
    params = [p for p in model.parameters() if p.requires_grad]  # with rm.lora: the adapters and the head
    optimizer = torch.optim.AdamW(params, lr=rm.lr, weight_decay=0.0)
    rng = random.Random(run.cfg.seed)
    history = []
    total_steps, done = rm.epochs * -(-len(run.train_set) // rm.batch_size), 0
    for epoch in range(rm.epochs):
        model.train()
        order = list(range(len(run.train_set)))
        rng.shuffle(order)
        losses = []
        for i in range(0, len(order), rm.batch_size):
            batch = [run.train_set[j] for j in order[i:i + rm.batch_size]]
            r_c, r_r = _pair_scores(model, batch, pad_id)
            loss = bradley_terry_loss(r_c, r_r, torch.tensor([m for _, _, m in batch]), rm.center_coef)
            optimizer_step(optimizer, loss, params, 1.0)
            losses.append(loss.item())
            done += 1
            progress(done, total_steps, losses[-1])
        model.eval()
        h_c, h_r = evaluate_pairs(model, run.held_set, pad_id, 2 * rm.batch_size)
        rec = {"epoch": epoch + 1, "loss": sum(losses) / len(losses), "heldout_accuracy": pairwise_accuracy(h_c, h_r),
               "heldout_margin": mean_margin(h_c, h_r)}
        history.append(rec)
        log(f"epoch {rec['epoch']}: loss {rec['loss']:.4f}, held-out pairwise accuracy {rec['heldout_accuracy']:.3f}, "
            f"mean margin {rec['heldout_margin']:.3f} ({len(run.held_set)} pairs)")
    return history


def save_rm(run: RMSetup, history: list[dict]) -> RMResult:
    """Writes rm.out (with rm.lora: merged, and the adapter in rm.out/adapter) and, beside the weights, the reward
    mean/std over the training pairs with the run's stats (posttrain_reward.json)."""
    rm, pad_id = run.cfg.rm, run.tokenizer.pad_token_id
    t_c, t_r = evaluate_pairs(run.model, run.train_set, pad_id, 2 * rm.batch_size)
    mean, std = reward_stats(torch.cat([t_c, t_r]))
    out = (save_model_dir(run.model, run.tokenizer, rm.out) if run.adapters is None
           else _save_lora_reward_model(run.adapters, run.tokenizer, rm))
    result = RMResult(str(out), history[-1]["heldout_accuracy"], history[-1]["heldout_margin"], mean, std,
                      len(run.train_set), len(run.held_set), 0.0, history)
    result.wall_seconds = time.perf_counter() - run.started
    (out / STATS_FILE).write_text(json.dumps({
        "mean": mean, "std": std, "heldout_accuracy": result.heldout_accuracy, "heldout_margin": result.heldout_margin,
        "train_pairs": len(run.train_set), "heldout_pairs": len(run.held_set), "history": history, "base": rm.base,
        "data": rm.data, "seed": run.cfg.seed, "rm": rm.model_dump(),
    }, indent=1) + "\n")
    return result


def _save_lora_reward_model(adapters, tok, rm) -> Path:
    """Writes rm.out as the merged model (a plain HF directory the loaders read without peft) and the adapter
    (with the trained head) in peft's format in rm.out/adapter. The adapter is saved first: merging drops it."""
    import os
    import shutil

    from posttrain.models.loading import model_content_hash
    from posttrain.models.lora import ADAPTER_DIR, save_adapter

    out = Path(rm.out)
    staged = out.with_name(f".{out.name}.adapter-{os.getpid()}")
    shutil.rmtree(staged, ignore_errors=True)
    save_adapter(adapters, staged, {"model_path": str(rm.base), "model_hash": model_content_hash(rm.base)})
    save_model_dir(adapters.merge_and_unload(), tok, out)
    os.rename(staged, out / ADAPTER_DIR)
    return out
