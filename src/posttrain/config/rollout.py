"""The rollout section (`rollout.*`, with `rollout.vllm.*`): engines, sampling, asynchrony and partial rollouts,
multi-turn episodes and tools. Part of the run config (sections.py)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from posttrain.config.agent import AgentConfig
from posttrain.config.base import _Section


class VllmConfig(_Section):
    kv_cache_gb: float = Field(1.0, gt=0, description="VLLM_CPU_KVCACHE_SPACE on CPU; ignored on GPU.")
    gpu_memory_utilization: float = Field(0.3, gt=0, le=1, description="vLLM GPU memory share (GPU only).")
    enforce_eager: bool = Field(True, description="No CUDA graphs / compilation: faster start for short runs.")
    max_model_len: int = Field(128, gt=0, description="Longest prompt+completion the engine accepts (tokens).")


class RolloutConfig(_Section):
    engine: Literal["vllm", "hf"] = Field("vllm", description="vllm, or hf (transformers generate) as a fallback.")
    num_workers: int = Field(1, ge=1, description="Rollout workers (Ray actors), each owning one engine; or a range "
                             "MIN..MAX (e.g. 1..4): MIN are reserved with the run's roles, up to MAX-MIN more join "
                             "when the cluster has room (a node added) and leave when it does not (a node lost), "
                             "without failing a step. Sets num_workers (= MIN) and num_workers_max.")
    num_workers_max: int | None = Field(None, ge=1, description="Elastic fleet's upper bound (see num_workers); None = "
                                        "a fixed fleet of num_workers.")
    max_new_tokens: int = Field(8, gt=0, description="Longest completion sampled (tokens).")
    temperature: float = Field(1.0, ge=0, description="Sampling temperature for rollouts (0 = greedy).")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling for rollouts.")
    max_staleness: int = Field(
        0, ge=0, description="Asynchronous rollout: generation runs up to this many policy updates ahead of "
        "training (0 = synchronous; 1 = one-step-off). Every trained sample is at most this many updates old.",
    )
    async_one_step_off: bool = Field(
        False, description="Same as rollout.max_staleness=1: generate step t+1's rollout while step t trains.",
    )
    partial_rollouts: bool = Field(
        False, description="Asynchronous rollout only (vllm engine, single-turn): when the trainer publishes new "
        "weights mid-generation, the unfinished completions are cut, the weights loaded, and generation resumes from "
        "the tokens already sampled under the new policy, so a long completion does not hold a step back. Each token "
        "records its policy version; the oldest one in a batch bounds its staleness.",
    )
    engine_threads: int | None = Field(
        None, ge=1, description="CPU threads of each rollout engine (OMP_NUM_THREADS of its actor). None = "
        "topology.torch_threads when generation runs alone (synchronous rollout, one fixed worker: the trainer "
        "waits meanwhile), else 1 (engines beside each other or beside training would oversubscribe the cores). "
        "GPU engines use few.",
    )
    vllm: VllmConfig = Field(default_factory=VllmConfig)
    # Multi-turn episodes (docs/multi-turn.md): on when an environment or tools are set.
    environment: str | None = Field(
        None, description="Multi-turn: an Environment class from user code, path/to/file.py:Class or "
        "package.module:Class (protocol in rollout/environment.py); None = the built-in chat environment (the row's "
        "prompt, then tool calls until the policy answers without one).",
    )
    environment_interface: Literal["auto", "posttrain", "gymnasium"] = Field(
        "auto", description="Multi-turn: the protocol of rollout.environment's class. posttrain: reset(row) -> "
        "messages, step(state, assistant_message) -> (messages, reward, done). gymnasium: a Gymnasium-style text "
        "environment, reset(seed=, options={'row': row}) -> (observation, info), step(text) -> (observation, reward, "
        "terminated, truncated, info), adapted by rollout/gym_adapter.py (the seed is a hash of the row's id). auto: "
        "gymnasium for a subclass of gymnasium.Env, else posttrain.",
    )
    tools: list[str] = Field(
        default_factory=list, description="Tools the policy may call, each path/to/file.py:function (type hints and "
        "a docstring make its JSON schema, given to the chat template as `tools`); calls run in the sandbox.",
    )
    tool_parser: Literal["hermes", "json"] = Field(
        "hermes", description="How tool calls are read from the policy's text: hermes (Qwen/Hermes "
        "<tool_call>{json}</tool_call>) or json (a bare {\"name\": ..., \"arguments\": ...} object).",
    )
    max_turns: int = Field(4, description="Multi-turn: most assistant turns per episode (>= 1).")
    max_total_tokens: int | None = Field(
        None, gt=0, description="Multi-turn: most tokens per episode, prompt and every turn included; None = "
        "rollout.vllm.max_model_len. max_new_tokens bounds each assistant turn.",
    )
    tool_timeout_seconds: float = Field(5.0, gt=0, description="Wall-clock limit of one tool call (sandbox).")
    tool_memory_mb: int = Field(512, gt=0, description="Address-space limit of the sandboxed tool process (MB).")
    environment_timeout_seconds: float = Field(
        30.0, gt=0, description="Limit of one environment call (reset or step) for a turn's episodes together.",
    )
    agent: AgentConfig | None = Field(
        None, description="Agent rollouts (docs/agents.md): {command, concurrency, timeout_seconds, reward, port}: "
        "an agent program drives each episode through an OpenAI-compatible endpoint on 127.0.0.1; None = off.",
    )

    @model_validator(mode="before")
    @classmethod
    def _worker_range(cls, data: Any) -> Any:
        """num_workers: "MIN..MAX" -> num_workers=MIN, num_workers_max=MAX."""
        if isinstance(data, dict) and isinstance(data.get("num_workers"), str) and ".." in data["num_workers"]:
            low, _, high = data["num_workers"].partition("..")
            try:
                lo, hi = int(low), int(high)
            except ValueError:
                raise ValueError(f"rollout.num_workers={data['num_workers']!r}: a range is MIN..MAX with whole "
                                 "numbers, e.g. 1..4") from None
            if lo < 1:
                raise ValueError(f"rollout.num_workers={data['num_workers']!r}: MIN must be at least 1 (the run needs "
                                 "one engine to make progress)")
            if lo > hi:
                raise ValueError(f"rollout.num_workers={data['num_workers']!r}: MIN {lo} is greater than MAX {hi}")
            data = {**data, "num_workers": lo, "num_workers_max": hi}
        return data

    @model_validator(mode="before")
    @classmethod
    def _one_step_off_is_staleness_one(cls, data: Any) -> Any:
        """async_one_step_off: true -> max_staleness: 1 (the older name of the same setting)."""
        if not isinstance(data, dict) or data.get("async_one_step_off") in (None, False, "false", "False"):
            return data
        if data.get("max_staleness") not in (None, 0, 1, "0", "1"):  # 0: the default a dumped config carries
            raise ValueError(f"rollout.async_one_step_off=true means rollout.max_staleness=1, but max_staleness="
                             f"{data['max_staleness']} is set too; keep only rollout.max_staleness")
        return {**data, "max_staleness": 1}

    @model_validator(mode="after")
    def _check_max(self) -> "RolloutConfig":
        if self.max_total_tokens is not None and self.max_total_tokens > self.vllm.max_model_len:
            raise ValueError(f"rollout.max_total_tokens={self.max_total_tokens} is above rollout.vllm.max_model_len="
                             f"{self.vllm.max_model_len}: the engines could not hold a whole episode; raise "
                             "max_model_len or lower max_total_tokens")
        if self.max_turns < 1:
            raise ValueError(f"rollout.max_turns={self.max_turns}: an episode needs at least one assistant turn; set "
                             "1 or more (1 = one completion per sample, as without multi-turn)")
        if self.num_workers_max is not None and self.num_workers_max < self.num_workers:
            raise ValueError(f"rollout.num_workers_max={self.num_workers_max} is below rollout.num_workers="
                             f"{self.num_workers} (the fleet's minimum)")
        if self.elastic and self.asynchronous:
            raise ValueError(f"rollout.num_workers={self.num_workers}..{self.num_workers_max} (an elastic fleet) does "
                             "not combine with rollout.async_one_step_off=true (rollout.max_staleness="
                             f"{self.max_staleness}): its background rollout thread uses the fleet while the driver "
                             "grows and shrinks it; set a fixed rollout.num_workers or rollout.max_staleness=0")
        self._check_partial_rollouts()
        return self

    def _check_partial_rollouts(self) -> None:
        """partial_rollouts needs weights that arrive mid-generation, an engine that can stop, one turn per sample."""
        if not self.partial_rollouts:
            return
        why = None
        if not self.asynchronous:
            why = ("needs asynchronous rollout, but rollout.max_staleness=0: a synchronous rollout never gets new "
                   "weights mid-generation, so there is nothing to interrupt; set rollout.max_staleness=1 or more, or "
                   "rollout.partial_rollouts=false")
        elif self.engine == "hf":
            why = ("does not combine with rollout.engine=hf: the transformers engine cannot abort a generate call "
                   "midway; use rollout.engine=vllm or set rollout.partial_rollouts=false")
        elif self.multi_turn or self.agent is not None:
            why = ("does not combine with multi-turn or agent episodes (rollout.environment, rollout.tools or "
                   "rollout.agent set): an episode cannot resume mid-turn yet; set rollout.partial_rollouts=false")
        if why:
            raise ValueError(f"rollout.partial_rollouts=true {why}")

    @property
    def asynchronous(self) -> bool:
        """Rollout runs ahead of training (rollout.max_staleness >= 1; one_step_off.py)."""
        return self.max_staleness > 0

    @property
    def multi_turn(self) -> bool:
        """Episodes of several turns (an environment or tools configured) instead of one completion per sample."""
        return self.environment is not None or bool(self.tools)

    @property
    def episode_token_limit(self) -> int:
        return self.max_total_tokens or self.vllm.max_model_len

    @property
    def elastic(self) -> bool:
        return self.num_workers_max is not None and self.num_workers_max > self.num_workers
