"""A multi-turn episode kept as the exact token ids the engine saw: token in, token out.

An episode is the prompt's ids (the environment's first messages rendered by the chat template, with the tools and
the generation prompt) followed by turns:
- an assistant turn is the engine's sampled ids, as sampled (EOS included when it stopped), never re-tokenized;
- an environment or tool turn is the ids of only the new messages, as the chat template renders them after the
  history (`ChatRenderer.delta_ids`), tokenized on their own.
The engine's next request is `context_ids()`, and the trainer trains on `prompt_ids` + `completion_ids()` with
`loss_mask()`: 1 on sampled tokens, 0 on environment and tool tokens. Re-tokenizing the whole conversation instead
gives other ids (BPE merges across a turn's edge, the template's whitespace after an end-of-turn token), which is
the drift verl #3720 and TRL #5224 report.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from posttrain.errors import PosttrainError

# Why an episode ended (samples.jsonl `end_reason`, metrics episode/end/<reason>).
END_REASONS = (
    "answered",          # the policy answered without a tool call (no environment) / the environment said done
    "max_turns",         # rollout.max_turns assistant turns
    "max_total_tokens",  # no room left for another turn within rollout.max_total_tokens
    "truncated",         # an assistant turn hit max_new_tokens without stopping
    "environment_error", # the environment raised, timed out or returned something that is not a message list
)


@dataclass
class Turn:
    role: str                      # "assistant" (sampled), or the role of the new messages ("tool", "user", ...)
    text: str                      # the turn's text: the decoded sample, or the new messages' contents
    token_ids: list[int]
    logprobs: list[float] | None = None   # the engine's, one per token, for assistant turns
    tool_calls: list[dict] = field(default_factory=list)    # assistant: {"name", "arguments"} or {"error", "text"}
    tool_results: list[dict] = field(default_factory=list)  # tool: {"name", "content", "error": kind|None, "seconds"}
    reward: float | None = None    # what the environment returned for this turn

    @property
    def sampled(self) -> bool:
        return self.role == "assistant"

    def record(self) -> dict:
        """The turn as samples.jsonl keeps it."""
        out = {"role": self.role, "text": self.text, "tokens": len(self.token_ids)}
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        if self.tool_results:
            out["tool_results"] = self.tool_results
        if self.reward is not None:
            out["reward"] = self.reward
        return out


@dataclass
class Episode:
    sample_id: str
    seed: int                       # the seed of its first turn; later turns derive theirs (sampler.turn_seed)
    messages: list[dict]            # the conversation so far as chat messages (what the template renders)
    prompt_ids: list[int]
    turns: list[Turn] = field(default_factory=list)
    end_reason: str | None = None   # one of END_REASONS once it ended
    row: dict = field(default_factory=dict)   # what the environment's reset was given (episodes.problem_row)
    pending_calls: list = field(default_factory=list)  # the last assistant turn's parsed tool calls, until run

    @property
    def done(self) -> bool:
        return self.end_reason is not None

    def completion_ids(self) -> list[int]:
        return [t for turn in self.turns for t in turn.token_ids]

    def context_ids(self) -> list[int]:
        """What the engine is given for the next assistant turn."""
        return self.prompt_ids + self.completion_ids()

    def loss_mask(self) -> list[int]:
        return [int(turn.sampled) for turn in self.turns for _ in turn.token_ids]

    def engine_logprobs(self) -> list[float]:
        """The engine's logprob of each sampled token, 0.0 on environment and tool tokens (masked out)."""
        return [lp for turn in self.turns
                for lp in (turn.logprobs if turn.sampled else [0.0] * len(turn.token_ids))]

    def sampled_tokens(self) -> int:
        return sum(len(t.token_ids) for t in self.turns if t.sampled)

    def assistant_turns(self) -> int:
        return sum(t.sampled for t in self.turns)

    def final_text(self) -> str:
        """The last assistant turn's text: what the verifier and reward functions score."""
        return next((t.text for t in reversed(self.turns) if t.sampled), "")

    def env_reward(self) -> float | None:
        """The sum of the environment's per-turn rewards; None when it gave none."""
        given = [t.reward for t in self.turns if t.reward is not None]
        return sum(given) if given else None

    def record(self) -> dict:
        return {"turns": [t.record() for t in self.turns], "end_reason": self.end_reason,
                "tokens": len(self.prompt_ids) + sum(len(t.token_ids) for t in self.turns),
                "tool_calls": sum(len(t.tool_calls) for t in self.turns if t.sampled)}


class ChatRenderer:
    """Renders messages to ids with the tokenizer's chat template, tools included. `model_dir` is named in errors."""

    def __init__(self, tokenizer, tools: list[dict] | None = None, model_dir: str = "model.path"):
        self.tokenizer, self.tools, self.model_dir = tokenizer, tools or None, model_dir
        if not getattr(tokenizer, "chat_template", None):
            raise PosttrainError(
                f"rollout: multi-turn episodes need a chat template, and the tokenizer in {model_dir} has none",
                hint="save a tokenizer with a chat_template into the model directory (tokenizer_config.json)",
            )

    def render(self, messages: list[dict], generation_prompt: bool) -> str:
        kwargs = {"tools": self.tools} if self.tools else {}
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=False,
                                                  **kwargs)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        """The first messages with the generation prompt: the episode's prompt."""
        return self.encode(self.render(messages, True))

    def delta_ids(self, history: list[dict], new: list[dict], sampled: list[int]) -> list[int]:
        """Ids of only the `new` messages (and the next generation prompt) as the template renders them after
        `history`, whose last message is the assistant turn the engine sampled as `sampled`. The template's text
        after that turn's content that the sample does not hold (ChatML's "<|im_end|>\\n" less the <|im_end|> the
        engine emitted) comes first."""
        before = self.render(history, False)
        after = self.render(history + new, True)
        if not after.startswith(before):
            raise PosttrainError(
                f"rollout: the chat template of {self.model_dir} renders earlier turns differently once a message is "
                "added (e.g. it drops past reasoning), so a turn's tokens cannot be appended to the history",
                hint="use a template whose rendering of a conversation is a prefix of the rendering of its "
                "continuation (ChatML / Qwen2.5 templates are)",
            )
        content = history[-1].get("content") or ""
        at = before.rfind(content) if content else -1
        closing = before[at + len(content):] if at >= 0 else ""
        if sampled:
            last = self.tokenizer.decode([sampled[-1]], skip_special_tokens=False)
            if last and closing.startswith(last):
                closing = closing[len(last):]  # the engine emitted the end-of-turn token itself
        return self.encode(closing + after[len(before):])


def check_tool_template(tokenizer, model_dir: str) -> None:
    """Tools configured: the chat template must place them (`tools` in its source); else a clear error."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):
        template = " ".join(template.values())
    if not template:
        raise PosttrainError(
            f"rollout.tools: multi-turn episodes need a chat template, and the tokenizer in {model_dir} has none",
            hint="save a tokenizer whose chat_template renders tools into the model directory "
            "(tokenizer_config.json); posttrain.models.bpe.CHATML_TOOLS_TEMPLATE is one",
        )
    if "tools" not in template:
        raise PosttrainError(
            f"rollout.tools: the chat template of {model_dir} has no tool support (it never reads `tools`), so the "
            "policy would not see the tools' descriptions",
            hint="use a model whose chat template renders tools (e.g. Qwen2.5's), or set its tokenizer_config.json "
            "chat_template to one that does; posttrain.models.bpe.CHATML_TOOLS_TEMPLATE is one",
        )
