"""`RewardModel`: one trained reward model, or an ensemble of several, in its own process, the unit Ray places on
the cluster. It scores (prompt, completion) texts with each member's own tokenizer, so the policy and the reward
models need not share one, and normalizes each member's scores by the mean/std stored with it
(posttrain_reward.json). An ensemble's score is the mean of its members' normalized scores; `member_scores` gives
each member's, from which the loop measures their disagreement.

    actor = ray.remote(RewardModel).options(num_cpus=0.25).remote(["runs/rm/model", "runs/rm2/model"], threads=1)
    scores = ray.get(actor.score.remote([("12+34=", "46"), ...]))

Also what every reader of a reward model shares: how a (prompt, completion) becomes the ids the model reads
(`encode_sample`), its scalar scores, and loading a directory `posttrain rm train` wrote (training/rm.py writes it).
torch is imported where it is used, so that a driver that only checks a directory does not load it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from posttrain.errors import PosttrainError
from posttrain.models.loading import PromptEncoder, check_model_dir, load_tokenizer
from posttrain.remote.stacks import ActorProcess

if TYPE_CHECKING:
    import torch

    from posttrain.rewards.preferences import Text

STATS_FILE = "posttrain_reward.json"


# ---------------------------------------------------------------- encoding: pure given a tokenizer


def _messages(value: Text, role: str) -> list[dict]:
    return [{"role": role, "content": value}] if isinstance(value, str) else list(value)


def encode_sample(encoder: PromptEncoder, prompt: Text, completion: Text, max_len: int) -> list[int]:
    """Token ids the reward model reads for (prompt, completion): the prompt as the policy sees it, the completion,
    then EOS — the same ids the loop's samples have. Chat-format lists go through the tokenizer's chat template
    (or are joined by spaces when it has none). Longer sequences keep their last max_len tokens."""
    tok = encoder.tokenizer
    if isinstance(prompt, str) and isinstance(completion, str):
        ids = encoder.encode(prompt) + list(tok(completion, add_special_tokens=False)["input_ids"]) + [tok.eos_token_id]
    else:
        msgs = _messages(prompt, "user") + _messages(completion, "assistant")
        if encoder.use_chat:
            text = tok.apply_chat_template(msgs, tokenize=False)
            ids = list(tok(text, add_special_tokens=False)["input_ids"])
        else:
            text = " ".join(m["content"] for m in msgs)
            ids = list(tok(text, add_special_tokens=False)["input_ids"]) + [tok.eos_token_id]
    return ids[-max_len:]


def pad_batch(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pads to (input_ids [N, T], attention_mask [N, T])."""
    import torch

    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    return ids, mask


# ---------------------------------------------------------------- model I/O


def scores(model, seqs: list[list[int]], pad_id: int) -> torch.Tensor:
    """Scalar reward per sequence [N]. The classifier reads the last non-pad token; sequences end in EOS."""
    from posttrain.algorithms.common import at_least_float32

    ids, mask = pad_batch(seqs, pad_id)
    return at_least_float32(model(input_ids=ids, attention_mask=mask).logits[:, 0])


def load_backbone(path: str | Path, field: str):
    """A sequence-classification model with a 1-output head over the causal LM (or reward model) in `path`."""
    import torch
    from transformers import AutoModelForSequenceClassification

    p = check_model_dir(path, field=field)
    tok = load_tokenizer(p)
    model = AutoModelForSequenceClassification.from_pretrained(
        str(p), num_labels=1, pad_token_id=tok.pad_token_id, dtype=torch.float32
    )
    model.config.pad_token_id = tok.pad_token_id
    return model, tok


def check_reward_model_dir(path: str | Path, field: str = "reward.rm_path") -> Path:
    """A model directory with the reward statistics `posttrain rm train` writes beside it (checked in the driver,
    before an actor loads it)."""
    if not Path(path).is_dir():
        raise PosttrainError(f"{field}: reward-model directory {path} does not exist",
                             hint="train one with `posttrain rm train` (it writes rm.out) and point this key at it")
    p = check_model_dir(path, field=field)
    if not (p / STATS_FILE).is_file():
        raise PosttrainError(f"{field}: {p} has no {STATS_FILE} (reward mean/std), so it is not a reward model",
                             hint="use a directory written by `posttrain rm train`")
    return p


def load_reward_model(path: str | Path, field: str = "reward.rm_path"):
    """(model in eval mode, tokenizer, {"mean", "std", ...}) from a directory `posttrain rm train` wrote."""
    p = Path(path)
    model, tok = load_backbone(p, field)
    stats_file = p / STATS_FILE
    if not stats_file.is_file():
        raise PosttrainError(f"{field}: {p} has no {STATS_FILE} (reward mean/std)",
                             hint="use a directory written by `posttrain rm train`")
    model.eval()
    return model, tok, json.loads(stats_file.read_text())


# ---------------------------------------------------------------- the actor


class _Member:
    def __init__(self, model_dir: str, chat_template: str, field: str):
        self.model, tok, stats = load_reward_model(model_dir, field)
        self.encoder = PromptEncoder(tok, chat_template)
        self.mean, self.std = float(stats["mean"]), float(stats["std"])
        self.max_len = int(getattr(self.model.config, "max_position_embeddings", 512) or 512)


class RewardModel(ActorProcess):
    def __init__(self, model_dir: str | list[str], threads: int = 1, chat_template: str = "auto",
                 batch_size: int = 64):
        import torch

        torch.set_num_threads(threads)
        dirs = [model_dir] if isinstance(model_dir, str) else list(model_dir)
        self.members = [_Member(d, chat_template, "reward.rm_path" if i == 0 else f"reward.rm_ensemble.{i - 1}")
                        for i, d in enumerate(dirs)]
        self.batch_size = batch_size

    def _raw(self, member: _Member, pairs: list[tuple[str, str]]) -> list[float]:
        import torch

        seqs = [encode_sample(member.encoder, p, c, member.max_len) for p, c in pairs]
        out: list[float] = []
        with torch.no_grad():
            for i in range(0, len(seqs), self.batch_size):
                out += scores(member.model, seqs[i:i + self.batch_size],
                              member.encoder.tokenizer.pad_token_id).tolist()
        return out

    def raw_scores(self, pairs: list[tuple[str, str]]) -> list[float]:
        """The first member's scalar head output per (prompt, completion), unnormalized."""
        return self._raw(self.members[0], pairs)

    def member_scores(self, pairs: list[tuple[str, str]]) -> list[list[float]]:
        """Per member (in config order), its normalized score per (prompt, completion)."""
        from posttrain.rewards.compose import normalize

        return [normalize(self._raw(m, pairs), m.mean, m.std) for m in self.members]

    def score(self, pairs: list[tuple[str, str]]) -> list[float]:
        """(raw - mean) / std per (prompt, completion), averaged over the members: 0 is the training data's average
        completion."""
        from posttrain.rewards.compose import ensemble_mean

        return ensemble_mean(self.member_scores(pairs))
