"""Model directories: the tiny factory writes a real HF dir; loading errors name the directory and what is
missing; prompts use the tokenizer's chat template when it has one."""

import shutil

import pytest

from posttrain.errors import PosttrainError
from posttrain.models.loading import PromptEncoder, check_model_dir, load_causal_lm, load_tokenizer
from posttrain.models.tokenizer import VOCAB, build_char_tokenizer


def test_char_tokenizer_round_trips_and_has_special_tokens():
    tok = build_char_tokenizer()
    ids = tok("47+385=", add_special_tokens=False)["input_ids"]
    assert len(ids) == 7 and tok.decode(ids) == "47+385="
    assert tok.pad_token_id == 0 and tok.eos_token_id == 1 and len(tok) == len(VOCAB)
    enc = PromptEncoder(tok)
    assert enc.decode_completion(tok("432", add_special_tokens=False)["input_ids"] + [1, 5, 6]) == "432"


def test_tiny_model_dir_loads_and_is_untied(tiny_model_dir):
    model, tok = load_causal_lm(tiny_model_dir)
    assert not model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    assert 0.5e6 < sum(p.numel() for p in model.parameters()) < 1.5e6


def test_missing_dir_and_missing_pieces_are_named(tmp_path, tiny_model_dir):
    with pytest.raises(PosttrainError, match=r"model.path: model directory .*nope does not exist"):
        check_model_dir(tmp_path / "nope")
    d = tmp_path / "copy"
    shutil.copytree(tiny_model_dir, d)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (d / f).unlink(missing_ok=True)
    with pytest.raises(PosttrainError, match="has no tokenizer"):
        check_model_dir(d)
    (d / "model.safetensors").unlink()
    with pytest.raises(PosttrainError, match="no \\*.safetensors"):
        check_model_dir(d)
    (d / "config.json").unlink()
    with pytest.raises(PosttrainError, match="no config.json"):
        check_model_dir(d)


def test_tokenizer_larger_than_model_vocab_is_rejected(tmp_path, tiny_model_dir):
    import json

    d = tmp_path / "mismatch"
    shutil.copytree(tiny_model_dir, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["vocab_size"] = 10
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(PosttrainError, match="tokenizer .* has 46 tokens but the model's vocab_size is 10"):
        load_causal_lm(d)


def test_chat_template_is_used_when_present(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    plain = PromptEncoder(tok).encode("1+2=")
    tok.chat_template = "{% for m in messages %}q:{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}a:{% endif %}"
    chat = PromptEncoder(tok).encode("1+2=")
    assert tok.decode(chat) == "q:1+2=a:" and tok.decode(plain) == "1+2="
    assert PromptEncoder(tok, mode="never").encode("1+2=") == plain


def test_bpe_tokenizer_with_chat_template_makes_a_loadable_model(tmp_path):
    """models/bpe.py: a byte-level BPE trained locally to the asked size, its ChatML template used by PromptEncoder,
    and a tiny model built on it whose vocabulary, pad and eos follow the tokenizer."""
    from posttrain.models.bpe import IM_END, IM_START, train_bpe_tokenizer
    from posttrain.models.tiny import build_tiny_model

    tok = train_bpe_tokenizer(tmp_path / "tok", 800, extra_texts=["What is 12 + 30?"], lexicon_size=400,
                              sentences=3000)
    assert len(tok) == 800
    model_dir = build_tiny_model(tmp_path / "m", "1m", tokenizer=tok)
    model, loaded = load_causal_lm(str(model_dir))[0], load_tokenizer(str(model_dir))
    assert model.config.vocab_size == 800 and model.config.eos_token_id == loaded.eos_token_id
    assert loaded.decode(loaded("What is 12 + 30?", add_special_tokens=False)["input_ids"]) == "What is 12 + 30?"
    ids = PromptEncoder(loaded).encode([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    text = loaded.decode(ids)
    assert text == f"{IM_START}system\nBe brief.{IM_END}\n{IM_START}user\nHi{IM_END}\n{IM_START}assistant\n"
