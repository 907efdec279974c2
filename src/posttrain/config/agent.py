"""The agent section (`rollout.agent`, docs/agents.md): an agent program written in any language drives each episode
through posttrain's OpenAI-compatible endpoint (rollout/agent_proxy.py, rollout/agent_episodes.py). Part of the run
config (config/rollout.py). Whether `command`'s program exists is checked at the run's start (the machine that runs
the agent is the one that matters, not the one that loads the config)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from posttrain.config.base import _Section


class AgentConfig(_Section):
    command: str = Field(
        description="Shell command started once per episode (bash -c, in the run's working directory) with "
        "OPENAI_BASE_URL, OPENAI_API_KEY (the episode's key), POSTTRAIN_EPISODE_ID, POSTTRAIN_REWARD_URL and "
        "POSTTRAIN_PROMPT set and the row as JSON on stdin.",
    )
    concurrency: int = Field(4, ge=1, description="Agent processes running at once (episodes in flight).")
    timeout_seconds: float = Field(
        120.0, gt=0, description="Wall-clock limit of one episode: past it the agent's process group is killed and the "
        "episode ends with agent_timeout.",
    )
    reward: Literal["agent", "functions"] = Field(
        "agent", description="Where the episode's reward comes from: agent (it POSTs {\"reward\": x} to "
        "POSTTRAIN_REWARD_URL, logged as reward/environment; an agent that exits without one ends no_reward), or "
        "functions (reward.weights / reward.functions score the final assistant text, as in multi-turn runs).",
    )
    port: int = Field(0, ge=0, le=65535, description="Port of the endpoint on 127.0.0.1; 0 = any free one.")

    @field_validator("command")
    @classmethod
    def _not_empty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("rollout.agent.command is empty; give the shell command that runs one episode")
        return v
