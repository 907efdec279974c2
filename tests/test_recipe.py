"""The shape the in-process trainings share (training/recipe.py) and the SFT loop that SFT and SFT on traces share:
the loss sees the callers' loss masks (answer or assistant tokens only), the caller's thread setting comes back."""

from __future__ import annotations

import subprocess
import sys

from posttrain.config import load_config
from posttrain.models.loading import PromptEncoder, load_causal_lm
from posttrain.tasks import load_task
from posttrain.training import sft as sft_module


def test_the_sft_loop_takes_its_loss_on_the_callers_mask_only(tiny_model_dir, monkeypatch):
    cfg = load_config(None, ["task.train_size=40", "task.heldout_size=5", "sft.batch_size=8", "sft.max_steps=3"])
    model, tok = load_causal_lm(tiny_model_dir)
    encoder = PromptEncoder(tok)
    examples = [sft_module.encode_sft_example(encoder, p) for p in load_task(cfg.task, cfg.seed).train]
    by_ids = {tuple(ids): mask for ids, mask in examples}
    seen = []
    real_loss = sft_module.sft_batch_loss

    def recording_loss(model, input_ids, attention_mask, loss_mask):
        seen.append((input_ids.clone(), loss_mask.clone()))
        return real_loss(model, input_ids, attention_mask, loss_mask)

    monkeypatch.setattr(sft_module, "sft_batch_loss", recording_loss)
    steps = list(sft_module.sft_steps(model, examples, tok.pad_token_id, cfg.sft, cfg.seed))
    assert [s for s, _ in steps] == [1, 2, 3] and len(seen) == 3
    for ids, mask in seen:
        for row, m in zip(ids.tolist(), mask.tolist()):
            n = next(k for k in range(len(row), 0, -1) if tuple(row[:k]) in by_ids)
            assert m == by_ids[tuple(row[:n])] + [0] * (len(row) - n)  # answer + EOS, never prompt or padding


RESTORES_THREADS = """
import torch
from posttrain.config import load_config
from posttrain.training.recipe import run_recipe

torch.set_num_threads(2)
seen = []

def setup():
    seen.append(torch.get_num_threads())
    raise RuntimeError("setup failed")

try:
    run_recipe(load_config(None, ["topology.torch_threads=1"]), setup, lambda s: s, lambda s, t: t)
except RuntimeError as e:
    assert str(e) == "setup failed", e
print(seen[0], torch.get_num_threads())
"""


def test_run_recipe_restores_the_callers_threads_on_error():
    # In a fresh process: once an in-process vLLM engine (an earlier test's) has bound its threads, vLLM makes
    # torch.set_num_threads a no-op for the rest of the process.
    done = subprocess.run([sys.executable, "-c", RESTORES_THREADS], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "2"]  # setup ran with topology.torch_threads; the caller's 2 came back
