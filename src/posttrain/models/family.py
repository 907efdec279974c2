"""Whether two HF model directories are one model family: the same config.json (but its STORAGE_KEYS) and
tokenizers that do the same thing. One engine can then serve both by loading the second one's weights.

Compared by behaviour, not bytes: transformers re-serializes a tokenizer it saves, so every SFT output's
tokenizer.json differs in bytes from its base's although the vocabulary and every token id are the same.
"""

from __future__ import annotations

import json
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
TOKENIZER_ATTRIBUTES = ("eos_token_id", "pad_token_id", "bos_token_id", "chat_template")
# config.json keys that say where a directory came from and in which dtype its weights were saved, not what the
# model computes: a model.dtype=bfloat16 run's checkpoints say "bfloat16" beside a float32 base, and an engine
# loading their weights casts them to its own dtype.
STORAGE_KEYS = frozenset({"_name_or_path", "dtype", "torch_dtype", "transformers_version"})


def config_keys_that_differ(a: str | Path, b: str | Path) -> list[str]:
    """The config.json keys whose values differ (but STORAGE_KEYS); ["(unreadable)"] when either is."""
    try:
        ca = json.loads((Path(a) / "config.json").read_text())
        cb = json.loads((Path(b) / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return ["(unreadable)"]
    return sorted(k for k in set(ca) | set(cb) if k not in STORAGE_KEYS and ca.get(k) != cb.get(k))


def tokenizer_difference(a: str | Path, b: str | Path, prompts: list | None = None) -> str | None:
    """Why the two tokenizers would turn text into different inputs (vocabulary, special tokens, chat template,
    or one of `prompts` encoded to other ids), or None when they agree."""
    from posttrain.models.loading import PromptEncoder, load_tokenizer

    pa, pb = Path(a), Path(b)
    if all((pa / f).is_file() and (pb / f).is_file() and (pa / f).read_bytes() == (pb / f).read_bytes()
           for f in TOKENIZER_FILES):
        return None
    ta, tb = load_tokenizer(pa), load_tokenizer(pb)
    if ta.get_vocab() != tb.get_vocab():
        return f"the tokenizers' vocabularies differ ({len(ta)} and {len(tb)} tokens)"
    for attr in TOKENIZER_ATTRIBUTES:
        if getattr(ta, attr, None) != getattr(tb, attr, None):
            return f"the tokenizers' {attr} differ"
    ea, eb = PromptEncoder(ta), PromptEncoder(tb)
    for prompt in prompts or []:
        if ea.encode(prompt) != eb.encode(prompt):
            return f"the tokenizers encode the prompt {str(prompt)[:60]!r} differently"
    return None


def family_differences(a: str | Path, b: str | Path, prompts: list | None = None) -> list[str]:
    """What keeps `a` and `b` from being served by one engine; empty when they are one family."""
    why = []
    keys = config_keys_that_differ(a, b)
    if keys:
        why.append(f"config.json differs in {', '.join(keys)}")
    tokenizer = tokenizer_difference(a, b, prompts)
    if tokenizer:
        why.append(tokenizer)
    return why
