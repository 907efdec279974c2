"""One agent episode's calls kept as the exact ids the engine saw and sampled (docs/agents.md).

An agent sends the whole conversation with every call, in OpenAI's format. The proxy does not re-tokenize it: when a
call's messages are the previous call's messages, then the assistant message the proxy returned (compared by content
and tool calls, not by bytes: clients re-serialize), then new messages, the new prompt is the previous prompt + the
sampled ids + the ids of only the new messages (`ChatRenderer.delta_ids`, as rollout/episodes.py does). That chain is
one trainer row whose loss mask is 1 on the sampled tokens only (trajectory.Episode).

A call that does not continue the chain (the agent rewrote or trimmed its history, changed its tools, or two calls
raced) starts a new chain, rendered from scratch. The episode trains on its LAST chain only: that is the one that
produced the final answer the reward is about, and a trainer row is one sample (a group keeps its size). The calls of
the earlier chains are counted (`agent/dropped_calls` in the episode's record), never trained on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from posttrain.errors import PosttrainError
from posttrain.rollout.tool_calls import decoded_arguments, format_tool_call
from posttrain.rollout.trajectory import ChatRenderer, Episode, Turn

# Why an agent episode ended (samples.jsonl `end_reason`, metrics episode/end/<reason>).
AGENT_END_REASONS = (
    "completed",      # the agent exited 0 (with a reward, when rollout.agent.reward=agent)
    "agent_crashed",  # the agent exited non-zero (its output's tail is kept)
    "agent_timeout",  # it ran past rollout.agent.timeout_seconds: its process group was killed
    "no_reward",      # it exited 0 without POSTing a reward, and rollout.agent.reward=agent
)
_TEXT = "<raw text>"  # the tools_key of /v1/completions chains: no chat call continues one


def content_text(content) -> str:
    """An OpenAI message's content as text: a string, None, or a list of {"type": "text", "text": ...} parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def normalized(message: dict) -> tuple:
    """What makes two messages the same turn: role, content text, tool calls' names and arguments (parsed); the
    ids, refusal fields and JSON spelling an OpenAI client adds or changes do not count."""
    calls = tuple((c.get("function", {}).get("name"),
                   json.dumps(decoded_arguments(c.get("function", {}).get("arguments")), sort_keys=True))
                  for c in message.get("tool_calls") or [])
    return message.get("role"), content_text(message.get("content")).strip(), calls


def template_messages(messages: list[dict], parser: str) -> list[dict]:
    """OpenAI messages -> what the chat template renders: an assistant's tool calls as text in the policy's own
    format, a tool message with its function's name (found from its tool_call_id)."""
    names: dict[str, str] = {}
    out = []
    for m in messages:
        role, text = m.get("role"), content_text(m.get("content"))
        if role == "assistant" and m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                fn = c.get("function", {})
                names[c.get("id", "")] = fn.get("name", "")
                calls.append(format_tool_call(fn.get("name", ""), fn.get("arguments"), parser))
            text = (text + "\n" if text else "") + "\n".join(calls)
        if role == "tool":
            out.append({"role": "tool", "name": m.get("name") or names.get(m.get("tool_call_id", ""), ""),
                        "content": text})
        else:
            out.append({"role": role, "content": text})
    return out


@dataclass
class Chain:
    """Calls that extend each other exactly: an Episode (its prompt and turns) plus what the agent was shown."""
    episode: Episode
    shown: list[tuple]   # normalized(...) of every message so far, the assistant ones as the proxy returned them
    tools_key: str       # the request's tools (JSON): other tools render another prompt, so another chain


@dataclass
class AgentTranscript:
    """Every call of one episode, as chains of exact ids. `seed` is the episode's first-call seed."""
    sample_id: str
    seed: int
    chains: list[Chain] = field(default_factory=list)
    calls: int = 0

    def prepare(self, renderer: ChatRenderer, messages: list[dict], tools, parser: str):
        """(chain or None, new turn or None, prompt ids) for a call with these OpenAI `messages`: the chain it
        continues and the turn of its new messages, or None and the ids of a fresh rendering. Nothing is recorded
        until `commit`."""
        tools_key = json.dumps(tools, sort_keys=True)
        shown = [normalized(m) for m in messages]
        rendered = template_messages(messages, parser)
        last = self.chains[-1] if self.chains else None
        if last is not None and last.tools_key == tools_key and len(shown) > len(last.shown) \
                and shown[: len(last.shown)] == last.shown:
            ep = last.episode
            new = rendered[len(last.shown):]
            try:
                ids = renderer.delta_ids(ep.messages, new, ep.turns[-1].token_ids)
            except PosttrainError:
                ids = None  # a template that renders earlier turns anew: no exact continuation exists
            if ids is not None:
                turn = Turn(new[0]["role"], "\n".join(m.get("content", "") for m in new), ids,
                            tool_results=[{"name": m.get("name", ""), "content": m["content"], "error": None,
                                           "seconds": 0.0} for m in new if m["role"] == "tool"])
                return last, (turn, new, shown[len(last.shown):]), ep.context_ids() + ids
        return None, (tools_key, rendered, shown), renderer.prompt_ids(rendered)

    def prepare_text(self, ids: list[int], text: str):
        """(chain or None, pending) for a raw-text call (/v1/completions) of prompt `ids`: it continues the last
        chain when its ids start with that chain's ids exactly, else it starts a chain of its own."""
        last = self.chains[-1] if self.chains else None
        if last is not None and last.tools_key == _TEXT:
            ctx = last.episode.context_ids()
            if len(ids) > len(ctx) and ids[: len(ctx)] == ctx:
                return last, (Turn("user", "", ids[len(ctx):]), [], [])
        return None, (_TEXT, [{"role": "user", "content": text}], [])

    def commit(self, chain: Chain | None, pending, prompt_ids: list[int], sampled: Turn, returned: dict) -> None:
        """Records a served call: its new messages' turn (or a new chain) and the sampled turn, with the assistant
        message the agent was returned."""
        if chain is None:
            tools_key, messages, shown = pending
            ep = Episode(self.sample_id, self.seed, messages, list(prompt_ids))
            chain = Chain(ep, shown, tools_key)
            self.chains.append(chain)
        else:
            turn, new, shown = pending
            chain.episode.turns.append(turn)
            chain.episode.messages.extend(new)
            chain.shown.extend(shown)
        chain.episode.turns.append(sampled)
        chain.episode.messages.append({"role": "assistant", "content": sampled.text})
        chain.shown.append(normalized(returned))
        self.calls += 1


class AgentEpisode(Episode):
    """An Episode from an agent's last chain, with how the agent ended. An episode that did not complete trains on
    nothing (loss mask 0): a crashed, killed or unrewarded agent's transcript says nothing reliable about its
    outcome. `agent_reward`: what it POSTed (None: nothing)."""

    def __init__(self, base: Episode, end_reason: str, agent: dict, agent_reward: float | None):
        super().__init__(base.sample_id, base.seed, base.messages, base.prompt_ids, base.turns, end_reason, base.row)
        self.agent, self.agent_reward = agent, agent_reward

    def loss_mask(self) -> list[int]:
        mask = super().loss_mask()
        return mask if self.end_reason == "completed" else [0] * len(mask)

    def env_reward(self) -> float | None:
        return self.agent_reward

    def record(self) -> dict:
        return {**super().record(), "agent": self.agent}
