"""One step's samples as parallel lists (group by group, `group_size` samples per prompt), with the two operations
the loop needs: keep whole groups, and append the groups of a further rollout round (DAPO's dynamic sampling)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields


@dataclass
class StepSamples:
    sample_ids: list[str] = field(default_factory=list)          # step/prompt_id/sample_index
    prompts: list[list[int]] = field(default_factory=list)       # prompt token ids, repeated per sample
    completions: list[list[int]] = field(default_factory=list)   # completion token ids (EOS included when emitted)
    engine_logprobs: list[list[float]] = field(default_factory=list)
    items: list[tuple] = field(default_factory=list)             # (problem_id, prompt, answer, completion text)
    rewards: list[float] = field(default_factory=list)
    errors: list[str | None] = field(default_factory=list)       # why scoring failed, per sample (None = scored)
    verifier: list[float] = field(default_factory=list)          # the verifier's score (accuracy is counted on it)
    components: list[dict] = field(default_factory=list)         # reward source -> score (logged as reward/<source>)
    function_errors: list[dict] = field(default_factory=list)    # reward function -> why it failed (reward.functions)
    # Multi-turn episodes (rollout/episodes.py) only; both stay empty for single-turn rollouts.
    loss_masks: list[list[int]] = field(default_factory=list)    # per completion token: 1 sampled, 0 environment/tool
    episodes: list[dict] = field(default_factory=list)           # Episode.record(): turns, end reason, tool calls
    # Partial rollouts (rollout/partial.py) only: per completion token, the policy version that sampled it.
    token_versions: list[list[int]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.sample_ids)

    def extend(self, other: "StepSamples") -> None:
        for f in fields(self):
            getattr(self, f.name).extend(getattr(other, f.name))

    def select_groups(self, keep: list[bool], group_size: int) -> "StepSamples":
        """The samples of the groups whose flag is True, in order."""
        idx = [i for g, k in enumerate(keep) if k for i in range(g * group_size, (g + 1) * group_size)]
        # A field nobody filled (e.g. reward components before scoring) stays empty.
        return StepSamples(**{f.name: [getattr(self, f.name)[i] for i in idx] if getattr(self, f.name) else []
                              for f in fields(self)})
