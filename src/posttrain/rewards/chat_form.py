"""How a completion is handed to a reward function: as TRL's GRPOTrainer hands it. A prompt that is a list of chat
messages makes the completion a list of messages too, `[{"role": "assistant", "content": text}]`, so a function
written for TRL's conversational data (`completion[0]["content"]`) runs unchanged; a string prompt keeps a string
completion. Built-in functions take either through `completion_text`."""

from __future__ import annotations


def is_chat(prompt) -> bool:
    return isinstance(prompt, list)


def as_trl_completion(prompt, completion: str):
    """The completion in the form TRL passes for this prompt (see the module docstring)."""
    return [{"role": "assistant", "content": completion}] if is_chat(prompt) else completion


def completion_text(completion) -> str:
    """The text of a completion in either form: a string, or a list of messages (their contents joined)."""
    if isinstance(completion, str):
        return completion
    return "".join(str(m.get("content", "")) for m in completion if isinstance(m, dict))
