"""`RewardModel`: one trained reward model, or an ensemble of several, in its own process, the unit Ray places on
the cluster. It scores (prompt, completion) texts with each member's own tokenizer, so the policy and the reward
models need not share one, and normalizes each member's scores by the mean/std stored with it
(posttrain_reward.json). An ensemble's score is the mean of its members' normalized scores; `member_scores` gives
each member's, from which the loop measures their disagreement.

    actor = ray.remote(RewardModel).options(num_cpus=0.25).remote(["runs/rm/model", "runs/rm2/model"], threads=1)
    scores = ray.get(actor.score.remote([("12+34=", "46"), ...]))
"""

from __future__ import annotations

from posttrain.orchestration.stacks import ActorProcess


class _Member:
    def __init__(self, model_dir: str, chat_template: str, field: str):
        from posttrain.models.loading import PromptEncoder
        from posttrain.rewards.rm_train import load_reward_model

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

        from posttrain.rewards.rm_train import encode_sample, scores

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
