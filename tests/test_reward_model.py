"""Reward-model training: the Bradley-Terry loss by hand, preference files (errors name file and row), the
built-in gold pairs, and a short real training run whose output AutoModelForSequenceClassification loads."""

from __future__ import annotations

import json
import math

import pytest
import torch
from numerics_bounds import assert_same, f64

from posttrain.config import load_config
from posttrain.errors import PosttrainError
from posttrain.rewards.bradley_terry import bradley_terry_loss, mean_margin, pairwise_accuracy, reward_stats
from posttrain.rewards.gold import addition_gold
from posttrain.rewards.preferences import gold_pairs, read_preferences, write_jsonl
from posttrain.tasks import load_task


def test_bradley_terry_loss_by_hand():
    r_c, r_r = f64([2.0, 0.0]), f64([0.0, 0.0])
    assert bradley_terry_loss(r_c, r_r).dtype == torch.float64
    # -log sigmoid(2) = log(1 + e^-2) = 0.126928 ; -log sigmoid(0) = log 2 = 0.693147 ; mean 0.410038
    assert float(bradley_terry_loss(r_c, r_r)) == pytest.approx(0.410038, abs=1e-5)
    # margin 1: -log sigmoid(1) = 0.313262 ; -log sigmoid(-1) = 1.313262 ; mean 0.813262
    assert float(bradley_terry_loss(r_c, r_r, margin=1.0)) == pytest.approx(0.813262, abs=1e-5)
    # per-pair margins [0, 1]: (0.126928 + 1.313262) / 2 = 0.720095
    assert float(bradley_terry_loss(r_c, r_r, margin=f64([0.0, 1.0]))) == pytest.approx(0.720095, abs=1e-5)
    # centering 0.5 * mean((2+0)^2, (0+0)^2) = 0.5 * 2 = 1.0 on top
    assert float(bradley_terry_loss(r_c, r_r, center_coef=0.5)) == pytest.approx(1.410038, abs=1e-5)
    # the gradient pushes chosen up and rejected down: d/dr_c = -(1 - sigmoid(d)) / N
    r_c.requires_grad_(True)
    bradley_terry_loss(r_c, r_r).backward()
    assert r_c.grad.tolist() == pytest.approx([-(1 - 1 / (1 + math.exp(-2))) / 2, -0.5 / 2], abs=1e-6)


def test_pairwise_stats_by_hand():
    r_c, r_r = torch.tensor([1.0, 0.0, 3.0, 2.0]), torch.tensor([0.0, 0.0, 1.0, 4.0])
    assert pairwise_accuracy(r_c, r_r) == 0.5          # 1>0 yes, tie no, 3>1 yes, 2>4 no
    assert mean_margin(r_c, r_r) == pytest.approx(0.25)  # (1 + 0 + 2 - 2) / 4
    mean, std = reward_stats(torch.tensor([1.0, 3.0]))
    assert (mean, std) == (2.0, 1.0)                     # population std of {1, 3}


def test_preference_file_errors_name_file_and_row(tmp_path):
    p = tmp_path / "prefs.jsonl"
    p.write_text('{"prompt": "a", "chosen": "b", "rejected": "c"}\n{"prompt": "a", "chosen": "b"}\n')
    with pytest.raises(PosttrainError, match=r"prefs.jsonl line 2: missing field\(s\) rejected"):
        read_preferences(p)
    p.write_text('{"prompt": "a", "chosen": "b", "rejected": "c"}\n{"prompt": "a", "chosen": 3, "rejected": "c"}\n')
    with pytest.raises(PosttrainError, match="line 2: field 'chosen' must be a string"):
        read_preferences(p)
    p.write_text('{"prompt": "a", "chosen": "b", "rejected": "c"}\nnot json\n')
    with pytest.raises(PosttrainError, match="line 2: not valid JSON"):
        read_preferences(p)
    with pytest.raises(PosttrainError, match="does not exist"):
        read_preferences(tmp_path / "missing.jsonl")
    chat = [{"role": "user", "content": "12+3="}]
    p.write_text(json.dumps({"prompt": chat, "chosen": [{"role": "assistant", "content": "15"}], "rejected": "16",
                             "margin": 0.5}) + "\n" + json.dumps({"prompt": "1+1=", "chosen": "2", "rejected": "3"}) + "\n")
    pairs = read_preferences(p)
    assert pairs[0].prompt == chat and pairs[0].margin == 0.5 and pairs[1].chosen == "2"


def test_parquet_preferences_with_chat_messages_and_row_errors(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    chat = [{"role": "user", "content": "12+3="}]
    good = tmp_path / "prefs.parquet"
    pq.write_table(pa.Table.from_pylist([
        {"prompt": "12+3=", "chosen": "15", "rejected": "16"},
        {"prompt": "1+1=", "chosen": "2", "rejected": "3"},
    ]), good)
    pairs = read_preferences(good)
    assert [p.chosen for p in pairs] == ["15", "2"] and pairs[1].prompt == "1+1="
    msgs = tmp_path / "msgs.parquet"  # chat-format columns as lists of {role, content} structs
    row = {"prompt": chat, "chosen": [{"role": "assistant", "content": "15"}],
           "rejected": [{"role": "assistant", "content": "16"}]}
    pq.write_table(pa.Table.from_pylist([row, row]), msgs)
    assert read_preferences(msgs)[0].prompt == chat
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "a", "chosen": "b", "rejected": "c"},
                                         {"prompt": "a", "chosen": "b", "rejected": None}]), bad)
    with pytest.raises(PosttrainError, match=r"bad.parquet row 2"):
        read_preferences(bad)


def test_gold_pairs_follow_the_gold_function_with_the_asked_noise():
    task = load_task(load_config(None, ["task.train_size=500", "task.heldout_size=50"]).task, 0)
    rows = gold_pairs(task.train, "addition", 2000, label_noise=0.1, seed=0)
    answers = {p.prompt: p.answer for p in task.train}
    for r in rows:
        g_c, g_r = addition_gold(answers[r["prompt"]], r["chosen"]), addition_gold(answers[r["prompt"]], r["rejected"])
        assert (g_c < g_r) if r["flipped"] else (g_c > g_r)
    flipped = sum(r["flipped"] for r in rows) / len(rows)
    assert 0.08 < flipped < 0.12  # binomial(2000, 0.1): std 0.0067
    assert gold_pairs(task.train, "addition", 50, 0.1, seed=0) == rows[:50]  # seeded
    with pytest.raises(PosttrainError, match="no built-in gold"):
        gold_pairs(task.train, "sorting", 10, 0.1, 0)


def test_rm_train_saves_a_model_transformers_loads(tmp_path, tiny_model_dir):
    """A short real run on clean gold pairs from the random tiny model: the held-out accuracy is computed and
    stored, the directory loads with AutoModelForSequenceClassification and scores like the trainer did."""
    from transformers import AutoModelForSequenceClassification

    from posttrain.models.loading import PromptEncoder, load_tokenizer
    from posttrain.rewards.reward_model import STATS_FILE, encode_sample, scores
    from posttrain.training.rm import train_reward_model

    cfg = load_config(None, ["task.train_size=500", "task.heldout_size=50"])
    rows = gold_pairs(load_task(cfg.task, 0).train, "addition", 400, 0.0, 0)
    data = write_jsonl(rows, tmp_path / "pairs.jsonl")
    cfg = load_config(None, [f"rm.data={data}", f"rm.base={tiny_model_dir}", f"rm.out={tmp_path / 'rm'}",
                             "rm.epochs=2", "rm.lr=1e-3", "rm.center_coef=0.01", "rm.heldout_fraction=0.25"])
    result = train_reward_model(cfg)
    assert len(result.history) == 2 and result.heldout_pairs == 100 and result.train_pairs == 300
    assert result.heldout_accuracy > 0.55, result.history   # above chance after 2 short epochs
    stats = json.loads((tmp_path / "rm" / STATS_FILE).read_text())
    assert stats["std"] > 0 and stats["heldout_accuracy"] == result.heldout_accuracy
    # Loaded in float64 for the checks below, which compare scores of other batch shapes: in float32 they differ by
    # rounding whose size depends on the CPU's kernels (docs/numerics.md). sdpa runs in the model's dtype (eager
    # attention would take its softmax in float32).
    model = AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "rm"), dtype=torch.float64)
    assert model.config.num_labels == 1 and model.config.pad_token_id is not None
    assert model.config._attn_implementation == "sdpa"
    enc = PromptEncoder(load_tokenizer(tmp_path / "rm"))
    seqs = [encode_sample(enc, "12+34=", "46", 128), encode_sample(enc, "12+34=", "xyz", 128)]
    with torch.no_grad():
        out = scores(model, seqs, enc.tokenizer.pad_token_id)
    assert out.shape == (2,) and torch.isfinite(out).all()
    # the score of a sequence does not depend on the padding it shares a batch with
    with torch.no_grad():
        alone = scores(model, seqs[1:], enc.tokenizer.pad_token_id)
    assert_same(alone[0], out[1], "a score alone vs in a padded batch")
    # the loop's RewardModel (a plain class; Ray makes it an actor) scores texts the same way, normalized
    from posttrain.rewards.reward_model import RewardModel

    rm = RewardModel(str(tmp_path / "rm"))
    rm.members[0].model.double()
    raw = rm.raw_scores([("12+34=", "46"), ("12+34=", "xyz")])
    assert_same(raw, out, "RewardModel.raw_scores vs scores")
    # float64 scores 1e-10 apart at most, divided by the std: abs 1e-5 holds for any std above 1e-5
    assert rm.score([("12+34=", "46")]) == pytest.approx([(raw[0] - stats["mean"]) / stats["std"]], abs=1e-5)


def test_rm_train_cli_bad_row_is_one_message_exit_2(tmp_path, tiny_model_dir):
    from typer.testing import CliRunner

    from posttrain.cli import app

    p = tmp_path / "prefs.jsonl"
    p.write_text('{"prompt": "a", "chosen": "b", "rejected": "c"}\n{"prompt": "a", "rejected": "c"}\n')
    result = CliRunner().invoke(app, ["rm", "train", f"rm.data={p}", f"rm.base={tiny_model_dir}"])
    assert result.exit_code == 2
    text = " ".join(result.output.split())  # rich wraps long paths
    assert "prefs.jsonl line 2: missing field(s) chosen" in text and "Traceback" not in text


def test_rm_train_cli_shows_progress_off_a_terminal(tmp_path, tiny_model_dir):
    """Off a terminal (CliRunner is not a TTY) the progress bar falls back to plain lines; --quiet silences them."""
    from typer.testing import CliRunner

    from posttrain.cli import app

    p = tmp_path / "prefs.jsonl"
    p.write_text("".join('{"prompt": "1+1=", "chosen": "2", "rejected": "3"}\n' for _ in range(20)))
    args = ["rm", "train", f"rm.data={p}", f"rm.base={tiny_model_dir}", f"rm.out={tmp_path / 'rm'}",
            "rm.batch_size=6", "rm.epochs=2", "rm.heldout_fraction=0.1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    # 18 training pairs in batches of 6 -> 3 steps per epoch, 6 in all; the last update always prints.
    assert "[rm train] 6/6 loss=" in result.output
    quiet = CliRunner().invoke(app, [*args, "--quiet"])
    assert quiet.exit_code == 0 and "[rm train]" not in quiet.output
