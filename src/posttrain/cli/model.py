"""`posttrain model tiny` and `posttrain model import`: a new tiny model directory, or one converted from GGUF."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from posttrain.cli.common import console, err_console
from posttrain.errors import PosttrainError


def model_tiny(
    out: str = typer.Argument(..., help="Directory to write."),
    size: str = typer.Option("1m", help="1m | 4m | 80m"),
    arch: str = typer.Option("qwen2", help="qwen2 | llama"),
    tied: bool = typer.Option(False, "--tied", help="Tie input and output embeddings."),
    seed: int = typer.Option(0),
    bpe: int = typer.Option(0, "--bpe", help="Train a byte-level BPE tokenizer of this many tokens with a ChatML "
                            "chat template (0 = the character tokenizer)."),
    texts: Optional[str] = typer.Option(None, "--texts", help="With --bpe: a .jsonl whose string values (chat "
                                        "contents included) join the tokenizer's training text."),
    max_len: int = typer.Option(128, "--max-len", help="Longest sequence (max_position_embeddings)."),
):
    """Write a randomly initialised tiny causal LM with a local tokenizer (characters, or BPE with --bpe)."""
    from posttrain.models.tiny import TINY_SIZES, build_tiny_model

    if size not in TINY_SIZES:
        raise PosttrainError(f"--size: unknown size {size!r}", hint=f"use one of {', '.join(TINY_SIZES)}")
    tokenizer = None
    if bpe:
        from posttrain.models.bpe import texts_of_jsonl, train_bpe_tokenizer

        if bpe < 300:
            raise PosttrainError(f"--bpe {bpe}: too small", hint="use at least 300 tokens (256 bytes + specials)")
        extra = texts_of_jsonl(texts) if texts else []
        tokenizer = train_bpe_tokenizer(Path(out) / "tokenizer", bpe, extra_texts=extra * 5, seed=seed,
                                        lexicon_size=min(bpe, 2000), sentences=2000)
    elif texts:
        raise PosttrainError("--texts needs --bpe", hint="add --bpe N (e.g. --bpe 2000)")
    model = build_tiny_model(out, size, arch=arch, tie_word_embeddings=tied, seed=seed, tokenizer=tokenizer,
                             max_position_embeddings=max_len)
    console.print(f"wrote {model}")


def model_import(
    source: str = typer.Argument(..., help="A .gguf file (llama.cpp's format), or `smollm2` for the "
                                 "SmolLM2-135M-Instruct file that `make install` installs."),
    out: str = typer.Argument(..., help="The HF model directory to write (must not exist)."),
    dtype: str = typer.Option("float32", "--dtype", help="float32 | bfloat16: the dtype the weights are saved in."),
):
    """Convert a GGUF model into a plain HF directory (weights, tokenizer, chat template) and check it."""
    from posttrain.models.gguf_import import import_gguf, smollm2_gguf

    report = import_gguf(smollm2_gguf() if source == "smollm2" else source, out, dtype,
                         log=lambda m: err_console.print(m, highlight=False, soft_wrap=True))
    console.print(f"wrote {out}: {report.architecture}, {report.parameters:,} parameters, vocabulary "
                  f"{report.vocab_size:,}, {report.dtype}, {report.seconds:.0f} s\n"
                  f"check: the saved model's greedy completion equals the GGUF model's ({report.check_tokens_equal} "
                  f"tokens): {report.check_completion!r}", highlight=False, soft_wrap=True)
