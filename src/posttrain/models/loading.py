"""Loading any local HF causal-LM directory (weights + tokenizer), with errors that name the directory and what
is missing, and prompt encoding (the tokenizer's chat template when it has one, plain text otherwise)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from posttrain.errors import PosttrainError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def check_model_dir(path: str | Path, *, field: str = "model.path") -> Path:
    """Validates a model directory before anything heavy loads it; returns it as a Path."""
    p = Path(path)
    if not p.is_dir():
        raise PosttrainError(
            f"{field}: model directory {p} does not exist",
            hint="point it at a local HF model directory (run `posttrain sft` or `posttrain demo` to make one)",
        )
    if not (p / "config.json").is_file():
        raise PosttrainError(f"{field}: {p} has no config.json, so it is not an HF model directory")
    if not list(p.glob("*.safetensors")):
        extra = " (found PyTorch .bin weights: convert them to safetensors; posttrain never unpickles weights)" if list(
            p.glob("*.bin")
        ) else ""
        raise PosttrainError(f"{field}: {p} has no *.safetensors weights{extra}")
    if not any((p / f).is_file() for f in TOKENIZER_FILES):
        raise PosttrainError(
            f"{field}: {p} has no tokenizer (none of {', '.join(TOKENIZER_FILES)})",
            hint="save the tokenizer into the model directory with tokenizer.save_pretrained(dir)",
        )
    return p


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")
HASHED_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json")


def model_content_hash(model_dir: str | Path) -> str:
    """sha256 over the weight files (and the config/tokenizer files that change outputs) of an HF model dir,
    each file's name and bytes in name order, read in 1 MiB chunks."""
    d = Path(model_dir)
    files = sorted(p for p in d.iterdir() if p.is_file() and (p.suffix in WEIGHT_SUFFIXES or p.name in HASHED_FILES))
    if not any(p.suffix in WEIGHT_SUFFIXES for p in files):
        raise PosttrainError(f"--model {d}: no weight files (*.safetensors, *.bin) in this directory")
    h = hashlib.sha256()
    for p in files:
        h.update(p.name.encode() + b"\0")
        with p.open("rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    return h.hexdigest()


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def model_vocab_size(path: str | Path) -> int:
    cfg = json.loads((Path(path) / "config.json").read_text())
    size = cfg.get("vocab_size") or cfg.get("text_config", {}).get("vocab_size")
    return int(size)


def check_vocab(path: str | Path, tokenizer, *, field: str = "model.path") -> None:
    """The tokenizer's ids must all be rows of the model's embedding."""
    vocab = model_vocab_size(path)
    if len(tokenizer) > vocab:
        raise PosttrainError(
            f"{field}: tokenizer in {path} has {len(tokenizer)} tokens but the model's vocab_size is {vocab}",
            hint="the tokenizer does not belong to these weights; save the matching tokenizer into the directory",
        )


def load_causal_lm(path: str | Path, dtype: str = "float32", *, field: str = "model.path") -> tuple[Any, Any]:
    """Returns (model, tokenizer) from a checked directory; the model is in eval mode on CPU, in `dtype` (a
    model.dtype setting: auto is float32 here; bfloat16 needs a CPU with native bfloat16, models/dtype.py)."""
    import torch
    from transformers import AutoModelForCausalLM

    from posttrain.models.dtype import weights_dtype

    dtype = weights_dtype(dtype)  # before the load: a refused dtype costs no seconds of reading weights
    p = check_model_dir(path, field=field)
    tok = load_tokenizer(p)
    check_vocab(p, tok, field=field)
    # safetensors only: a pickled .bin beside them is never read (loading a pickle can run code)
    model = AutoModelForCausalLM.from_pretrained(str(p), dtype=getattr(torch, dtype), use_safetensors=True)
    model.eval()
    return model, tok


class PromptEncoder:
    """Turns a task prompt into token ids the same way for the engine, the trainer and the reference."""

    def __init__(self, tokenizer, mode: str = "auto"):
        self.tokenizer = tokenizer
        self.use_chat = mode == "auto" and bool(getattr(tokenizer, "chat_template", None))

    def encode(self, prompt: str | list[dict]) -> list[int]:
        """A prompt string, or a chat-format list of {role, content} turns (joined by spaces without a template)."""
        turns = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        if self.use_chat:
            # Render, then tokenize without adding special tokens: the template already places them.
            text = self.tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=False)
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        text = prompt if isinstance(prompt, str) else " ".join(t["content"] for t in turns)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode_completion(self, token_ids: list[int]) -> str:
        """Text of a completion up to (not including) the first EOS/pad token."""
        stop = {self.tokenizer.eos_token_id, self.tokenizer.pad_token_id}
        cut = next((i for i, t in enumerate(token_ids) if t in stop), len(token_ids))
        return self.tokenizer.decode(token_ids[:cut], skip_special_tokens=True)
