"""One model family, judged by what config and tokenizer do, not by their bytes: a tokenizer re-saved by
transformers (as every SFT output's is) differs in bytes from its base's but is the same tokenizer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from posttrain.models.family import family_differences
from posttrain.models.loading import load_tokenizer


def test_a_resaved_tokenizer_is_the_same_family_and_a_changed_one_is_not(tiny_model_dir, tmp_path):
    base = Path(tiny_model_dir)
    copy = tmp_path / "resaved"
    shutil.copytree(tiny_model_dir, copy)
    load_tokenizer(copy).save_pretrained(copy)
    config = json.loads((copy / "config.json").read_text())
    config["_name_or_path"] = "somewhere/else"  # where it was loaded from is not what it is
    (copy / "config.json").write_text(json.dumps(config, indent=3))
    assert (copy / "tokenizer.json").read_bytes() != (base / "tokenizer.json").read_bytes() or \
        (copy / "tokenizer_config.json").read_bytes() != (base / "tokenizer_config.json").read_bytes()
    assert family_differences(tiny_model_dir, copy, ["12+34="]) == []

    config["rms_norm_eps"] = 1e-3
    (copy / "config.json").write_text(json.dumps(config))
    tok = json.loads((copy / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    first = next(iter(vocab))
    vocab[first + "x"] = vocab.pop(first)  # one token renamed: same size, another vocabulary
    (copy / "tokenizer.json").write_text(json.dumps(tok))
    why = family_differences(tiny_model_dir, copy)
    assert why[0] == "config.json differs in rms_norm_eps"
    assert "vocabularies differ" in why[1]


def test_the_dtype_weights_were_saved_in_is_not_another_family(tiny_model_dir, tmp_path):
    """A model.dtype=bfloat16 run's checkpoints say "bfloat16" in config.json beside a float32 base: the in-loop
    eval suites load them into the engine that scored the base (it casts the weights to its own dtype)."""
    copy = tmp_path / "bf16-checkpoint"
    shutil.copytree(tiny_model_dir, copy)
    config = json.loads((copy / "config.json").read_text())
    config.update(dtype="bfloat16", torch_dtype="bfloat16", transformers_version="0.0.1")
    (copy / "config.json").write_text(json.dumps(config))
    assert family_differences(tiny_model_dir, copy) == []
    config["num_hidden_layers"] += 1  # what the model computes still counts
    (copy / "config.json").write_text(json.dumps(config))
    assert family_differences(tiny_model_dir, copy) == ["config.json differs in num_hidden_layers"]
