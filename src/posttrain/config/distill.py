"""The distill section (`distill`, docs/algorithms.md "On-policy distillation"): the teacher that `algorithm.name: opd`
distils into the student on the student's own samples, and how its reverse KL mixes with the task reward. Whether
the teacher's directory loads and its tokenizer matches the student's is checked at the run's start (loop.py
preflight, models/tokenizer_match.py), not here: the config loads without the model files."""

from __future__ import annotations

from pydantic import Field

from posttrain.config.base import _Section


class DistillConfig(_Section):
    teacher: str | None = Field(
        None, description="Local HF causal-LM directory of the teacher (served like the reference, frozen); its "
        "tokenizer must give the student's ids. Required by algorithm.name=opd, refused by the other algorithms.",
    )
    coef: float = Field(1.0, gt=0, description="Weight of the per-token reverse KL to the teacher in the advantage.")
    reward_coef: float = Field(
        0.0, ge=0, description="Weight of the task reward's group advantage (GRPO's) added on every token; 0 = pure "
        "distillation (the reward is still logged). Needs algorithm.group_size >= 2 when above 0.",
    )
