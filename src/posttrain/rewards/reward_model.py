"""`RewardModel`: a trained reward model in its own process, the unit Ray places on the cluster. It scores
(prompt, completion) texts with its own tokenizer, so the policy and the reward model need not share one, and
returns scores normalized by the mean/std stored with the model (posttrain_reward.json).

    actor = ray.remote(RewardModel).options(num_cpus=0.25).remote("runs/rm/model", threads=1)
    scores = ray.get(actor.score.remote([("12+34=", "46"), ...]))
"""

from __future__ import annotations


class RewardModel:
    def __init__(self, model_dir: str, threads: int = 1, chat_template: str = "auto", batch_size: int = 64):
        import torch

        from posttrain.models.loading import PromptEncoder
        from posttrain.rewards.rm_train import load_reward_model

        torch.set_num_threads(threads)
        self.model, tok, stats = load_reward_model(model_dir)
        self.encoder = PromptEncoder(tok, chat_template)
        self.mean, self.std = float(stats["mean"]), float(stats["std"])
        self.max_len = int(getattr(self.model.config, "max_position_embeddings", 512) or 512)
        self.batch_size = batch_size

    def raw_scores(self, pairs: list[tuple[str, str]]) -> list[float]:
        """The head's scalar output per (prompt, completion), unnormalized."""
        import torch

        from posttrain.rewards.rm_train import encode_sample, scores

        seqs = [encode_sample(self.encoder, p, c, self.max_len) for p, c in pairs]
        out: list[float] = []
        with torch.no_grad():
            for i in range(0, len(seqs), self.batch_size):
                out += scores(self.model, seqs[i:i + self.batch_size], self.encoder.tokenizer.pad_token_id).tolist()
        return out

    def score(self, pairs: list[tuple[str, str]]) -> list[float]:
        """(raw - mean) / std per (prompt, completion): 0 is the training data's average completion."""
        from posttrain.rewards.compose import normalize

        return normalize(self.raw_scores(pairs), self.mean, self.std)
