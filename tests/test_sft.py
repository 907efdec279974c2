"""SFT warm start and greedy held-out evaluation: loss masking worked by hand, agreement of the batched greedy loop
with `model.generate`, and a short real SFT run on the tiny model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from posttrain.config import load_config
from posttrain.training.heldout import greedy_accuracy, sampled_completions
from posttrain.models.loading import PromptEncoder, load_causal_lm
from posttrain.tasks import Problem, load_task
from posttrain.training import sft as sft_module
from posttrain.training.sft import encode_sft_example, pack_examples, run_sft, sft_loss, warmup_lr


# One intra-op thread: on a shared CI machine two threads on a model this small can be several times slower.
THREADS = "topology.torch_threads=1"


@pytest.fixture(scope="module")
def base_dir(tiny_model_dir):
    return Path(tiny_model_dir)


@pytest.fixture(scope="module")
def model_and_tok(base_dir):
    return load_causal_lm(base_dir)


def test_encode_marks_answer_and_eos_only(model_and_tok):
    _, tok = model_and_tok
    ids, mask = encode_sft_example(PromptEncoder(tok), Problem(id="x", prompt="47+385=", answer="432"))
    assert tok.decode(ids[:7]) == "47+385="
    assert ids[7:] == [tok.convert_tokens_to_ids(c) for c in "432"] + [tok.eos_token_id]
    assert mask == [0] * 7 + [1, 1, 1, 1]


def test_sft_loss_counts_only_answer_and_eos_tokens():
    # Sequence "p p a a E <pad>": targets are positions 2, 3 (answer) and 4 (EOS); vocab of 5.
    input_ids = torch.tensor([[3, 4, 2, 3, 1, 0]])
    loss_mask = torch.tensor([[0, 0, 1, 1, 1, 0]])
    logits = torch.zeros(1, 6, 5, requires_grad=True)
    with torch.no_grad():
        logits[0, 1, 2] = math.log(3.0)   # predicts target 2 at position 2: p = 3/7
        logits[0, 3, 1] = math.log(4.0)   # predicts EOS at position 4: p = 4/8
        logits[0, 0, 0] = 50.0            # predicts a prompt token: must not matter
        logits[0, 4, 3] = 50.0            # predicts the pad after EOS: must not matter
    loss = sft_loss(logits, input_ids, loss_mask)
    expected = -(math.log(3 / 7) + math.log(1 / 5) + math.log(4 / 8)) / 3
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    loss.backward()
    # Only the logits that predict targets (positions 1, 2, 3) receive gradient.
    touched = logits.grad.abs().sum(-1)[0]
    assert touched[[1, 2, 3]].gt(0).all() and touched[[0, 4, 5]].eq(0).all()


def test_pack_right_pads_with_zero_loss_mask():
    ids, mask = pack_examples([([5, 6, 7], [0, 1, 1]), ([5, 6], [0, 1])], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [5, 6, 0]]
    assert mask.tolist() == [[0, 1, 1], [0, 1, 0]]


def test_warmup_is_linear_then_constant():
    assert [warmup_lr(s, 1.0, 4) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert warmup_lr(0, 1e-3, 0) == 1e-3


def test_greedy_accuracy_agrees_with_generate(model_and_tok):
    model, tok = model_and_tok
    encoder = PromptEncoder(tok)
    task = load_task(load_config().task, seed=0)
    # Mixed prompt lengths, so the batch is really left-padded; perturb the random model so that its greedy
    # outputs differ between prompts instead of repeating one token.
    problems = task.heldout[:12] + [Problem(id="s", prompt="12+34=", answer="46")]
    torch.manual_seed(1)
    with torch.no_grad():
        model.lm_head.weight.add_(torch.randn_like(model.lm_head.weight))
    acc, texts = greedy_accuracy(model, encoder, task, problems, max_new_tokens=6, batch_size=5)
    for p, text in zip(problems, texts):
        ids = torch.tensor([encoder.encode(p.prompt)])
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=6)
        assert text == encoder.decode_completion(out[0, ids.shape[1]:].tolist()), p.prompt
    assert len({*texts}) > 1
    assert acc == sum(task.score(p, t) for p, t in zip(problems, texts)) / len(problems)


def test_sampled_completions_draw_from_the_models_distribution(model_and_tok):
    """2,000 one-token draws for each of two prompts of different lengths (so one is left-padded) against the
    model's own softmax at the prompt's last position: every token's share within 5 binomial standard deviations
    (+2 draws) of its probability. Greedy picking would put all 2,000 on one token."""
    model, tok = model_and_tok
    encoder = PromptEncoder(tok)
    short, long = encoder.encode("12+34="), encoder.encode("123+456=")
    n = 2000
    draw = lambda seed: sampled_completions(model, [short, long] * n, torch.Generator().manual_seed(seed),  # noqa: E731
                                            pad_id=tok.pad_token_id, eos_id=tok.eos_token_id, max_new_tokens=1)
    drawn = draw(0)
    assert drawn == draw(0) and drawn != draw(1)  # seeded
    for row, prompt in enumerate((short, long)):
        with torch.no_grad():
            probs = torch.softmax(model(torch.tensor([prompt])).logits[0, -1].double(), -1)
        counts = torch.bincount(torch.tensor([c[0] for c in drawn[row::2]]), minlength=len(probs)).double()
        bound = 5 * (probs * (1 - probs) / n).sqrt() + 2 / n
        assert ((counts / n - probs).abs() <= bound).all(), (counts / n - probs).abs().max()
        assert int((counts > 0).sum()) > 1


def test_short_sft_writes_loadable_model_and_never_trains_on_heldout(base_dir, tmp_path, monkeypatch):
    cfg = load_config(overrides=[
        "task.train_size=2000", "task.heldout_size=50", "sft.batch_size=32", "sft.max_steps=30",
        "sft.eval_every=15", "sft.target_accuracy=1.0", "sft.warmup_steps=5", THREADS,
    ])
    task = load_task(cfg.task, cfg.seed)
    heldout = {p.prompt for p in task.heldout}
    train = {p.prompt for p in task.train}
    seen: list[torch.Tensor] = []
    real_loss = sft_module.sft_batch_loss

    def recording_loss(model, input_ids, attention_mask, loss_mask):
        seen.append(input_ids.clone())
        return real_loss(model, input_ids, attention_mask, loss_mask)

    monkeypatch.setattr(sft_module, "sft_batch_loss", recording_loss)
    evals: list[tuple[int, float]] = []
    out = tmp_path / "sft-model"
    out.mkdir()
    (out / "stale.txt").write_text("from an earlier run")  # replaced whole, not merged into
    result = run_sft(cfg, base_dir, out, on_eval=lambda s, a: evals.append((s, a)))

    assert result.steps == 30 and len(seen) == 30 and not result.reached_target
    assert evals == result.history and [s for s, _ in evals] == [15, 30]
    _, tok = load_causal_lm(base_dir)
    prompts = {tok.decode(row.tolist(), skip_special_tokens=True).split("=")[0] + "=" for b in seen for row in b}
    assert prompts <= train and not prompts & heldout
    assert len(prompts) == 30 * 32  # one epoch is 62 batches: no example repeats within it

    model, _ = load_causal_lm(out)  # an HF dir with safetensors and the tokenizer
    assert list(out.glob("*.safetensors"))
    assert json.loads((out / "sft.json").read_text())["steps"] == 30
    assert not (out / "stale.txt").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["sft-model"]  # no temp dirs left behind
    acc, _ = greedy_accuracy(model, PromptEncoder(tok), task, task.heldout)
    assert acc == pytest.approx(result.heldout_accuracy)


def test_sft_is_deterministic_and_stops_at_target(base_dir, tmp_path):
    cfg = load_config(overrides=[
        "task.train_size=500", "task.heldout_size=20", "sft.batch_size=16", "sft.max_steps=10",
        "sft.eval_every=5", "sft.target_accuracy=0.0", "sft.warmup_steps=2", THREADS,
    ])
    threads_before = torch.get_num_threads()
    a = run_sft(cfg, base_dir, tmp_path / "a")
    b = run_sft(cfg, base_dir, tmp_path / "b")
    assert a.steps == 5 and a.reached_target  # target 0 is met at the first evaluation
    sa = load_causal_lm(tmp_path / "a")[0].state_dict()
    sb = load_causal_lm(tmp_path / "b")[0].state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert torch.get_num_threads() == threads_before  # run_sft restores the caller's thread count
