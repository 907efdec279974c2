"""DPO's data side without a model run: pair files (errors that name the line), verifier-labelled pairs, and the
CLI's user error when no pairs are configured."""

import random

import pytest
from typer.testing import CliRunner

from posttrain.errors import PosttrainError
from posttrain.tasks.base import Problem
from posttrain.training.dpo import PreferencePair, near_miss, pairs_from_task, read_pairs, write_pairs


def test_pairs_round_trip_and_errors_name_the_line(tmp_path):
    p = write_pairs([PreferencePair("1+2=", "3", "4")], tmp_path / "pairs.jsonl")
    assert read_pairs(p) == [PreferencePair("1+2=", "3", "4")]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "chosen": "b", "rejected": "c"}\n{"prompt": "a", "chosen": "b"}\n')
    with pytest.raises(PosttrainError, match=r"bad.jsonl line 2: missing field\(s\) rejected"):
        read_pairs(bad)
    bad.write_text('{"prompt": "a", "chosen": 3, "rejected": "c"}\n')
    with pytest.raises(PosttrainError, match=r"bad.jsonl line 1: field 'chosen' must be a string or"):
        read_pairs(bad)
    bad.write_text("{not json\n")
    with pytest.raises(PosttrainError, match="line 1: not valid JSON"):
        read_pairs(bad)
    with pytest.raises(PosttrainError, match="dpo.pairs: preference file .* does not exist"):
        read_pairs(tmp_path / "missing.jsonl")


def test_chat_format_pairs_encode_the_prompt_turns_and_the_assistant_text(tmp_path, tiny_model_dir):
    from posttrain.models.loading import PromptEncoder, load_tokenizer
    from posttrain.training.dpo import encode_completion

    p = tmp_path / "chat.jsonl"
    p.write_text('{"prompt": [{"role": "user", "content": "1+2="}], "chosen": [{"role": "assistant", "content": "3"}],'
                 ' "rejected": "4"}\n')
    (pair,) = read_pairs(p)
    enc = PromptEncoder(load_tokenizer(tiny_model_dir), "never")
    # Without a chat template a one-turn prompt encodes exactly like the plain string, and the assistant turn's
    # text like a plain completion: the same ids a string row would give.
    assert enc.encode(pair.prompt) == enc.encode("1+2=")
    assert encode_completion(enc, pair.chosen) == encode_completion(enc, "3")


def test_near_miss_is_one_digit_off_and_never_the_answer():
    rng = random.Random(0)
    for answer in ["7", "10", "432", "1998"] * 50:
        wrong = near_miss(answer, rng)
        assert wrong != answer and len(wrong) == len(answer)
        assert sum(a != b for a, b in zip(answer, wrong)) == 1 and not (len(wrong) > 1 and wrong[0] == "0")
    pairs = pairs_from_task([Problem("p", "2+2=", "4")], 1, seed=0)
    assert pairs[0].chosen == "4" and pairs[0].rejected != "4"


def test_dpo_command_without_pairs_is_a_user_error():
    from posttrain.cli import app

    for args in (["dpo", "train.steps=1"], ["train", "examples/addition-dpo.yaml"]):  # train dispatches dpo too
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2, result.output
        assert "dpo.pairs is not set" in result.output
