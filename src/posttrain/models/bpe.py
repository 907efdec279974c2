"""A byte-level BPE tokenizer trained locally with `tokenizers` (no hub), saved as a standard HF fast tokenizer,
optionally with a ChatML chat template: the kind of tokenizer real models ship, for tests and benchmarks that need
a realistic vocabulary (tens of thousands of tokens) or a chat template.

The corpus is synthetic: pseudo-words built from syllables, so a large vocabulary can be learned from a few
megabytes of text in seconds, plus whatever texts the caller adds (prompts, answers) so they tokenize compactly.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Iterable

PAD, EOS, BOS = "<|pad|>", "<|endoftext|>", "<|startoftext|>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [PAD, EOS, BOS, IM_START, IM_END]

# ChatML, as Qwen's and many other models' templates render it; generation prompts end with the assistant header.
CHATML_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# ChatML with tools, much as Qwen2.5's template renders them (its instructions shortened): given `tools`, a system
# block lists each tool's JSON schema and asks for calls as <tool_call>{"name": ..., "arguments": {...}}</tool_call>;
# a tool message is a user turn holding <tool_response>...</tool_response>. Unlike Qwen2.5, consecutive tool messages
# get a turn each, so the rendering of a conversation is always a prefix of the rendering of its continuation
# (rollout/trajectory.py relies on it), and assistant turns are their raw content (the calls are in the text).
# Without tools it renders as CHATML_TEMPLATE.
CHATML_TOOLS_TEMPLATE = (
    "{%- set system_first = messages and messages[0]['role'] == 'system' %}"
    "{%- if tools %}"
    "{{- '<|im_start|>system\n' }}"
    "{%- if system_first %}{{- messages[0]['content'] + '\n\n' }}{%- endif %}"
    "{{- '# Tools\n\nYou may call these functions:\n<tools>' }}"
    "{%- for tool in tools %}{{- '\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\n</tools>\n\nCall a function as <tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call><|im_end|>\n' }}"
    "{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m['role'] == 'system' and loop.first and tools %}"
    "{%- elif m['role'] == 'tool' %}"
    "{{- '<|im_start|>user\n<tool_response>\n' + (m['content'] or '') + '\n</tool_response><|im_end|>\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + m['role'] + '\n' + (m['content'] or '') + '<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)

_ONSETS = ["", "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z", "br", "ch",
           "cl", "dr", "fl", "gr", "pl", "pr", "sh", "st", "th", "tr"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "ou", "io"]
_CODAS = ["", "", "n", "r", "s", "t", "l", "m", "nd", "st", "ng"]


def pseudo_words(count: int, seed: int = 0) -> list[str]:
    """`count` distinct pronounceable pseudo-words of 1-4 syllables, seeded."""
    rng = random.Random(f"bpe-words/{seed}")
    words: set[str] = set()
    while len(words) < count:
        words.add("".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
                          for _ in range(rng.randint(1, 4))))
    return sorted(words)


def synthetic_corpus(lexicon: list[str], sentences: int, seed: int = 0) -> Iterable[str]:
    """Sentences of 6-20 lexicon words (Zipf-like frequencies, some numbers), one per item."""
    rng = random.Random(f"bpe-corpus/{seed}")
    weights = [1.0 / (rank + 1) ** 0.8 for rank in range(len(lexicon))]
    for _ in range(sentences):
        words = rng.choices(lexicon, weights, k=rng.randint(6, 20))
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 999)))
        yield " ".join(words).capitalize() + rng.choice([".", "?", "!", ","])


def train_bpe_tokenizer(
    out_dir: str | Path,
    vocab_size: int = 32_000,
    *,
    extra_texts: Iterable[str] = (),
    chat_template: str | None = CHATML_TEMPLATE,
    seed: int = 0,
    lexicon_size: int | None = None,
    sentences: int | None = None,
    individual_digits: bool = True,
    eos_token: str = EOS,
    added_tokens: Iterable[str] = (),
    across_words: bool = False,
):
    """Trains a byte-level BPE tokenizer to `vocab_size` tokens and saves it to `out_dir` (tokenizer.json and
    tokenizer_config.json, chat template included when given). Returns the `PreTrainedTokenizerFast`.
    `individual_digits` splits numbers into one token per digit before BPE, as Qwen2's tokenizer does
    (so a small model can learn arithmetic digit by digit).
    `eos_token` is the token generation stops at: EOS, or IM_END for a chat model whose every turn ends with it
    (multi-turn rollouts stop at the end of a turn). `added_tokens` are kept whole, one token each, and decode as
    text (not special), as Qwen2.5 keeps <tool_call>. `across_words`: merges may span spaces and punctuation (not
    digits), so text that recurs verbatim (a chat template's tool instructions, JSON keys) becomes a few tokens: for
    tiny models, whose cost is per token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    lexicon = pseudo_words(lexicon_size or max(500, vocab_size), seed)
    texts = list(synthetic_corpus(lexicon, sentences or max(2_000, vocab_size * 2), seed))
    texts += [t for t in extra_texts]
    core = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=not across_words)
    core.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
                          if individual_digits else byte_level)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator(texts, trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token=PAD, eos_token=eos_token, bos_token=BOS,
                                  clean_up_tokenization_spaces=False, model_max_length=2048)
    if added_tokens:
        tok.add_tokens(list(added_tokens))
    if chat_template:
        tok.chat_template = chat_template
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(out))
    return tok


def texts_of_jsonl(path: str | Path) -> list[str]:
    """Every string value of every row of a .jsonl file (nested ones too: chat message contents), for the
    tokenizer's training text; a line that is not JSON is an error naming it."""
    import json

    from posttrain.errors import PosttrainError

    p = Path(path)
    if not p.is_file():
        raise PosttrainError(f"--texts: {p} does not exist", hint="point it at a .jsonl file")
    out: list[str] = []

    def walk(value) -> None:
        if isinstance(value, str):
            out.append(value)
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    for lineno, line in enumerate(p.read_text().splitlines(), start=1):
        if line.strip():
            try:
                walk(json.loads(line))
            except json.JSONDecodeError as e:
                raise PosttrainError(f"{p}, line {lineno}: not valid JSON ({e.msg})") from None
    return out
