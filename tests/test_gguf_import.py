"""`posttrain model import`: the real SmolLM2-135M-Instruct GGUF file becomes a plain HF directory that posttrain's
own loaders take as model.path, checked by a greedy completion equal to the GGUF-loaded model's; bad files are one
message and exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
BIN = Path(sys.executable).parent


def test_the_import_writes_a_plain_checked_directory(smollm2_dir):
    from posttrain.models.loading import PromptEncoder, check_model_dir, load_causal_lm

    path, report = smollm2_dir
    assert report.architecture == "llama" and report.vocab_size == 49152
    assert 134_000_000 < report.parameters < 136_000_000  # 134.5M with the tied head counted once
    assert report.check_tokens_equal == 16  # the self-check compared all 16 greedy tokens
    saved = json.loads((Path(path) / "posttrain_import.json").read_text())
    assert saved["source_sha256"] == report.source_sha256 and len(saved["source_sha256"]) == 64
    config = json.loads((Path(path) / "config.json").read_text())
    assert "quantization_config" not in config and config["tie_word_embeddings"] is True
    check_model_dir(path)
    model, tok = load_causal_lm(path)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied as in the file
    encoder = PromptEncoder(tok)
    assert encoder.use_chat  # the GGUF's chat template came along
    ids = encoder.encode("What is 2+3?")
    assert tok.decode(ids).startswith("<|im_start|>") and tok.decode(ids).endswith("<|im_start|>assistant\n")


def test_the_self_check_catches_weights_that_do_not_match(smollm2_dir):
    """The check the import runs, applied to a directory whose weights lost their last layer's MLP: it disagrees."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from posttrain.models.gguf_import import CHECK_PROMPT, greedy_completion

    path, report = smollm2_dir
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    good = greedy_completion(model, tok, CHECK_PROMPT, 16)
    assert tok.decode(good, skip_special_tokens=True) == report.check_completion
    with torch.no_grad():
        model.model.layers[-1].mlp.down_proj.weight.zero_()
    assert greedy_completion(model, tok, CHECK_PROMPT, 16) != good


def _gguf_with_architecture(path: Path, architecture: str) -> Path:
    import numpy as np
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), architecture)
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("case", ["not-gguf", "unknown-architecture", "out-exists", "missing"])
def test_bad_files_are_one_message_and_exit_2(case, tmp_path):
    out = tmp_path / "out"
    if case == "not-gguf":
        source, expect = tmp_path / "model.gguf", "is not a GGUF file (it starts with b'PK"
        source.write_bytes(b"PK\x03\x04 a zip file, not a model")
    elif case == "unknown-architecture":
        source = _gguf_with_architecture(tmp_path / "rwkv.gguf", "rwkv7")
        expect = "holds a 'rwkv7' model, which transformers cannot read from GGUF"
    elif case == "out-exists":
        source, expect = tmp_path / "model.gguf", f"{out} already exists"
        source.write_bytes(b"GGUF")
        out.mkdir()
        (out / "config.json").write_text("{}")
    else:
        source, expect = tmp_path / "nothing.gguf", "nothing.gguf does not exist"
    r = subprocess.run([str(BIN / "posttrain"), "model", "import", str(source), str(out)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and expect in " ".join(r.stderr.split()), r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    if case != "out-exists":
        assert not out.exists()  # nothing half-written
