"""Offline DPO from preference pairs, in-process (no Ray, no rollout): the reference's sequence logprobs are
computed once before training, then each step takes a batch of pairs through the policy and the DPO loss
(algorithms/dpo.py). Logs rewards/chosen, rewards/rejected, margins and accuracy of the implicit reward per step to
runs/<name>/metrics.jsonl, greedy held-out score of the task before and after, and writes the policy as an HF
directory. With model.lora the policy trains peft adapters only and the reference is the same model with its adapters
off (no second copy); the output is then the merged model (a plain HF directory, as without LoRA) and the adapter in
peft's format in runs/<name>/adapter (models/lora.py, as in the trainer's checkpoints). `DPOImplicitReward` scores
(prompt, completion) texts with beta * (log pi - log pi_ref), so a DPO policy can serve as a reward model.

    posttrain dpo cfg.yaml dpo.pairs=pairs.jsonl        # or: posttrain train cfg.yaml algorithm.name=dpo ...
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from posttrain.algorithms.dpo import dpo_loss, implicit_reward
from posttrain.config import RunConfig
from posttrain.errors import PosttrainError
from posttrain.models.loading import PromptEncoder, load_causal_lm
from posttrain.rewards.preferences import PreferencePair, read_preferences
from posttrain.training.batch import completion_logprobs, pack
from posttrain.training.recipe import batch_indices, optimizer_step, run_recipe, save_model_dir

REF_CHUNK = 256  # pairs per no-grad reference forward


def read_pairs(path: str | Path) -> list[PreferencePair]:
    """The reward model's reader (jsonl or parquet; strings or chat-format turns), with errors naming dpo.pairs."""
    return read_preferences(path, field="dpo.pairs", min_pairs=1)


def write_pairs(pairs: list[PreferencePair], path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("".join(json.dumps({"prompt": x.prompt, "chosen": x.chosen, "rejected": x.rejected}) + "\n"
                         for x in pairs))
    return p


def near_miss(answer: str, rng: random.Random) -> str:
    """A wrong answer one digit away from `answer` (a plausible mistake, never the answer itself)."""
    i = rng.randrange(len(answer))
    digit = rng.choice([d for d in "0123456789" if d != answer[i] and not (i == 0 and d == "0" and len(answer) > 1)])
    return answer[:i] + digit + answer[i + 1:]


def pairs_from_task(problems, n: int, seed: int) -> list[PreferencePair]:
    """Verifier-labelled pairs from a task with numeric answers: chosen = the answer, rejected = a near miss."""
    rng = random.Random(f"{seed}/dpo-pairs")
    return [PreferencePair(p.prompt, p.answer, near_miss(p.answer, rng)) for p in problems[:n]]


def encode_completion(encoder: PromptEncoder, text: str | list[dict]) -> list[int]:
    """Completion text (or its chat-format assistant turns, joined by newlines) -> token ids with EOS appended (a
    finished answer, as the engines return it)."""
    if not isinstance(text, str):
        text = "\n".join(t["content"] for t in text)
    return list(encoder.tokenizer(text, add_special_tokens=False)["input_ids"]) + [encoder.tokenizer.eos_token_id]


def sequence_logprobs(model, prompts: list[list[int]], completions: list[list[int]], pad_id: int) -> torch.Tensor:
    """log pi(completion | prompt) summed over completion tokens, one per row: [B]."""
    return completion_logprobs(model, pack(prompts, completions, pad_id)).sum(-1)


@torch.no_grad()
def reference_logprobs(reference, prompts: list[list[int]], completions: list[list[int]], pad_id: int) -> torch.Tensor:
    """`sequence_logprobs` without gradients, REF_CHUNK rows per forward: [N]."""
    return torch.cat([sequence_logprobs(reference, prompts[i:i + REF_CHUNK], completions[i:i + REF_CHUNK], pad_id)
                      for i in range(0, len(prompts), REF_CHUNK)])


def load_policy(cfg: RunConfig):
    """(policy, tokenizer, adapters): the HF causal LM at model.path and, with model.lora, the PeftModel around it
    (the policy's target layers now carry the adapters, which alone require grad); adapters is None without LoRA."""
    from posttrain.models.lora import apply_lora

    policy, tok = load_causal_lm(cfg.model.path)
    adapters = apply_lora(policy, cfg.model.lora, cfg.model.path) if cfg.model.lora is not None else None
    return policy, tok, adapters


def dpo_reference_logprobs(cfg: RunConfig, adapters, prompts, chosen, rejected, pad_id: int):
    """(chosen [N], rejected [N]) sequence logprobs under the reference: with LoRA the policy's own base model (its
    adapters off, bit-exact base weights); without, a second copy of model.path, dropped after this."""
    if adapters is not None:
        with adapters.disable_adapter():
            return (reference_logprobs(adapters, prompts, chosen, pad_id),
                    reference_logprobs(adapters, prompts, rejected, pad_id))
    reference, _ = load_causal_lm(cfg.model.path, field="dpo reference (model.path)")
    return (reference_logprobs(reference, prompts, chosen, pad_id),
            reference_logprobs(reference, prompts, rejected, pad_id))


def dpo_step(policy, optimizer, params: list, prompts, chosen, rejected, ref_c, ref_r, *, pad_id: int, beta: float,
             max_grad_norm: float):
    """One optimizer step on a batch of B pairs (token ids; ref_c, ref_r: [B]) over `params` (the trained ones);
    returns (the DPO loss' output, the grad norm before clipping). Chosen and rejected go through the policy in one
    forward: rows [0, B) chosen, [B, 2B) rejected."""
    lp = sequence_logprobs(policy, prompts * 2, chosen + rejected, pad_id)
    out = dpo_loss(lp[: len(prompts)], lp[len(prompts):], ref_c, ref_r, beta)
    return out, optimizer_step(optimizer, out.loss, params, max_grad_norm)


class DPOImplicitReward:
    """beta * (log pi(y|x) - log pi_ref(y|x)) as a reward-model score for (prompt, completion) texts."""

    def __init__(self, policy_dir: str, reference_dir: str, beta: float, chat_template: str = "auto"):
        self.policy, tok = load_causal_lm(policy_dir, field="dpo policy")
        self.reference, _ = load_causal_lm(reference_dir, field="dpo reference")
        self.encoder = PromptEncoder(tok, chat_template)
        self.beta = beta

    @torch.no_grad()
    def score(self, prompts: list[str], completions: list[str]) -> list[float]:
        if not prompts:
            return []
        p = [self.encoder.encode(x) for x in prompts]
        c = [encode_completion(self.encoder, y) for y in completions]
        pad = self.encoder.tokenizer.pad_token_id
        return implicit_reward(sequence_logprobs(self.policy, p, c, pad), sequence_logprobs(self.reference, p, c, pad),
                               self.beta).tolist()


# ---------------------------------------------------------------- the run: setup -> train -> save (recipe.py)


@dataclass
class DPOSetup:
    cfg: RunConfig
    started: float                     # perf_counter once the pairs are read
    pairs: list[PreferencePair]
    policy: Any                        # the HF causal LM at model.path (with LoRA: its adapted layers inside)
    tokenizer: Any
    adapters: Any                      # the PeftModel around `policy` with model.lora, else None
    encoder: PromptEncoder
    prompts: list[list[int]]           # token ids of each pair's prompt, chosen and rejected completion
    chosen: list[list[int]]
    rejected: list[list[int]]
    ref_chosen: torch.Tensor           # [N] sequence logprobs under the frozen reference, computed once
    ref_rejected: torch.Tensor
    task: Any                          # the task whose held-out split is scored greedily before and after


@dataclass
class DPOTrained:
    heldout_accuracy_before: float
    heldout_accuracy_after: float
    step_seconds: list[float]


def run_dpo(cfg: RunConfig, out_dir: str | Path | None = None, log=print) -> dict:
    """Trains cfg.model.path with DPO on cfg.dpo.pairs for train.steps steps; returns (and writes) the summary."""
    return run_recipe(cfg, lambda: setup_dpo(cfg), lambda run: train_dpo(run, log),
                      lambda run, trained: save_dpo(run, trained, out_dir, log))


def setup_dpo(cfg: RunConfig) -> DPOSetup:
    """Reads and encodes the pairs, loads the policy (with its adapters under model.lora) and the task, and computes
    the reference's sequence logprobs once (it is frozen)."""
    from posttrain.tasks import load_task

    if not cfg.dpo.pairs:
        raise PosttrainError("dpo.pairs is not set", hint="set dpo.pairs to a .jsonl of {prompt, chosen, rejected}")
    pairs = read_pairs(cfg.dpo.pairs)
    started = time.perf_counter()
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    policy, tok, adapters = load_policy(cfg)
    encoder = PromptEncoder(tok, cfg.model.chat_template)
    prompts = [encoder.encode(x.prompt) for x in pairs]
    chosen = [encode_completion(encoder, x.chosen) for x in pairs]
    rejected = [encode_completion(encoder, x.rejected) for x in pairs]
    ref_c, ref_r = dpo_reference_logprobs(cfg, adapters, prompts, chosen, rejected, tok.pad_token_id)
    task = load_task(cfg.task, cfg.seed)
    return DPOSetup(cfg, started, pairs, policy, tok, adapters, encoder, prompts, chosen, rejected, ref_c, ref_r, task)


def train_dpo(run: DPOSetup, log=print) -> DPOTrained:
    """Greedy held-out score, train.steps DPO steps (metrics per step to runs/<name>/metrics.jsonl), score again."""
    from posttrain.tracking import MetricsWriter
    from posttrain.training.heldout import greedy_accuracy

    cfg = run.cfg
    before, _ = greedy_accuracy(run.policy, run.encoder, run.task, run.task.heldout, cfg.eval.max_new_tokens)
    log(f"dpo: {len(run.pairs)} pairs, held-out score before {before:.3f}")
    writer = MetricsWriter(cfg.run_dir)
    step_seconds = dpo_steps(run, writer)
    after, _ = greedy_accuracy(run.policy, run.encoder, run.task, run.task.heldout, cfg.eval.max_new_tokens)
    writer.write({"step": cfg.train.steps, "eval/heldout_accuracy": after})
    writer.close()
    return DPOTrained(before, after, step_seconds)


def dpo_steps(run: DPOSetup, writer) -> list[float]:
    """The DPO loop: train.steps steps of `dpo_step` on batches of dpo.batch_size pairs in a seeded order, AdamW on the
    trained weights (with LoRA the adapters only) at algorithm.lr's schedule; returns each step's seconds."""
    from posttrain.training.trainer import learning_rate

    cfg, a, policy = run.cfg, run.cfg.algorithm, run.policy
    params = [p for p in policy.parameters() if p.requires_grad]  # with LoRA the adapters only
    optimizer = torch.optim.AdamW(params, lr=a.lr, betas=tuple(a.betas), weight_decay=a.weight_decay)
    batches = batch_indices(len(run.pairs), cfg.dpo.batch_size, torch.Generator().manual_seed(cfg.seed))
    policy.train()
    step_seconds = []
    for step in range(cfg.train.steps):
        ts = time.perf_counter()
        idx = next(batches).tolist()
        for g in optimizer.param_groups:
            g["lr"] = learning_rate(step, cfg.train.steps, a.lr, a.lr_schedule, a.lr_final_fraction)
        out, gn = dpo_step(policy, optimizer, params, [run.prompts[i] for i in idx], [run.chosen[i] for i in idx],
                           [run.rejected[i] for i in idx], run.ref_chosen[idx], run.ref_rejected[idx],
                           pad_id=run.tokenizer.pad_token_id, beta=a.dpo_beta, max_grad_norm=a.max_grad_norm)
        step_seconds.append(time.perf_counter() - ts)
        writer.write({"step": step + 1, "loss": float(out.loss.detach()), "rewards/chosen": float(out.rewards_chosen),
                      "rewards/rejected": float(out.rewards_rejected), "rewards/margins": float(out.margin),
                      "rewards/accuracy": float(out.accuracy), "grad_norm": float(gn), "time/step": step_seconds[-1]})
    return step_seconds


def save_dpo(run: DPOSetup, trained: DPOTrained, out_dir: str | Path | None = None, log=print) -> dict:
    """Writes the policy to `out_dir` (default runs/<name>/model; with LoRA merged, and its adapter to
    runs/<name>/adapter) and runs/<name>/summary.json; returns the summary."""
    cfg, run_dir = run.cfg, run.cfg.run_dir
    model_dir, adapter_dir = Path(out_dir or run_dir / "model"), None
    if run.adapters is None:
        save_model_dir(run.policy, run.tokenizer, model_dir)
    else:
        adapter_dir = save_lora_policy(run.adapters, run.tokenizer, model_dir, run_dir, cfg.model.path)
    times = trained.step_seconds
    summary = {
        "name": cfg.name, "algorithm": "dpo", "steps": cfg.train.steps, "pairs": len(run.pairs),
        "heldout_accuracy_before": trained.heldout_accuracy_before,
        "heldout_accuracy_after": trained.heldout_accuracy_after,
        "mean_step_seconds": sum(times) / max(len(times), 1), "wall_seconds": time.perf_counter() - run.started,
        "model_dir": str(model_dir), "adapter_dir": str(adapter_dir) if adapter_dir else None,
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    log(f"dpo: held-out score {trained.heldout_accuracy_before:.3f} -> {trained.heldout_accuracy_after:.3f}; "
        f"model written to {model_dir}")
    return summary


class _MergedView:
    """What `save_model_dir` saves for a LoRA policy: the merged model (models/lora.py save_merged_model), so the
    directory is written the same atomic way as a full-weight one."""

    def __init__(self, adapters, tokenizer):
        self.adapters, self.tokenizer = adapters, tokenizer

    def save_pretrained(self, out_dir: str, safe_serialization: bool = True) -> None:
        from posttrain.models.lora import save_merged_model

        save_merged_model(self.adapters, self.tokenizer, out_dir)


def save_lora_policy(adapters, tokenizer, model_dir: Path, run_dir: Path, base_path: str) -> Path:
    """Writes the merged policy to `model_dir` (a plain HF directory, loadable without peft) and the adapter in
    peft's format, with the base model's path and content hash, to run_dir/adapter; returns the adapter dir."""
    import shutil

    from posttrain.models.loading import model_content_hash
    from posttrain.models.lora import ADAPTER_DIR, save_adapter

    save_model_dir(_MergedView(adapters, tokenizer), tokenizer, model_dir)
    adapter_dir = run_dir / ADAPTER_DIR
    shutil.rmtree(adapter_dir, ignore_errors=True)  # a rerun's adapter replaces the last one whole
    record = {"model_path": str(base_path), "model_hash": model_content_hash(base_path)}
    return save_adapter(adapters, adapter_dir, record)
