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
