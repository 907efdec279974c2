"""A character-level tokenizer built locally (no hub), saved as a standard HF fast tokenizer.

Every character is one token, so digit strings tokenize the same way everywhere; transformers and vLLM both load
the saved directory with `AutoTokenizer`.
"""

from __future__ import annotations

from pathlib import Path

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
# Digits and the symbols the built-in tasks use, then lowercase letters for task words and user prompts.
CHARACTERS = list("0123456789+-=:,. ") + list("abcdefghijklmnopqrstuvwxyz")
VOCAB = [PAD, EOS, UNK] + CHARACTERS


def build_char_tokenizer():
    """Returns a `PreTrainedTokenizerFast` with one token per character and <pad>=0, <eos>=1, <unk>=2."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(VOCAB)}, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        eos_token=EOS,
        unk_token=UNK,
        clean_up_tokenization_spaces=False,
        model_max_length=512,
    )


def save_char_tokenizer(out_dir: str | Path) -> None:
    build_char_tokenizer().save_pretrained(str(out_dir))
