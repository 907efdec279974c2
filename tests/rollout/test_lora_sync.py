"""LoRA's weight sync into a real vLLM engine. merged: the trainer sends only the adapted layers, merged (plus the
unchanged shards vLLM packs with them), the engine loads them in place, and its logprobs are then the trainer's
adapted policy's. A payload with part of a packed parameter is refused (vLLM would leave the rest undefined: NaN).
adapter: the trainer sends the adapter (peft format), the engine serves it through vLLM's own LoRA support; its
logprobs are again the trainer's adapted policy's (so both modes' engines agree within twice SYNC_TOL)."""

from __future__ import annotations

import json

import pytest
import torch

from posttrain.config import load_config
from posttrain.models import lora as L
from posttrain.errors import PosttrainError
from posttrain.rollout.engine import SamplingSpec
from posttrain.models.weights import ADAPTER_CONFIG_KEY, arrays_from_tensors, payload_as_safetensors
from posttrain.training.batch import completion_logprobs, pack
from posttrain.training.trainer import Trainer

pytestmark = pytest.mark.integration

PROMPT = [5, 6, 7, 8, 9, 10]
COMPLETION = [20, 21, 22, 23, 24, 25, 26, 27]
SYNC_TOL = 1e-3  # as tests/rollout/test_weight_sync.py; measured here: ~3e-7 merged, <= 2e-6 adapter (nats, float32)


def _adapted_logprobs(trainer: Trainer) -> list[float]:
    with torch.no_grad():
        return completion_logprobs(trainer.model.eval(), pack([PROMPT], [COMPLETION], trainer.pad_id))[0].tolist()


def _set_adapters(trainer: Trainer, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in trainer.model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)


def _gap(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b))


def test_merged_sync_reaches_vllm_in_place(tiny_models, release_vllm_groups):
    from posttrain.rollout.vllm_engine import VllmEngine

    base_dir = str(tiny_models.untied_a)
    cfg = load_config(None, [f"model.path={base_dir}", "topology.torch_threads=1", "model.lora.r=4",
                             "model.lora.target_modules=[q_proj, v_proj, gate_proj]"]).to_dict()
    trainer = Trainer(cfg, base_dir)
    engine = VllmEngine(base_dir, max_model_len=128, kv_cache_gb=1)
    base = engine.completion_logprobs(PROMPT, COMPLETION)
    assert _gap(base, _adapted_logprobs(trainer)) < SYNC_TOL  # B = 0: the adapted model is the base model

    for seed in (1, 2):  # twice: each sync is base + the current delta, never a delta on top of the last one
        _set_adapters(trainer, seed)
        want = _adapted_logprobs(trainer)
        assert _gap(want, base) > 0.1, "the adapters must move the logprobs for this test to mean anything"
        payload = trainer.export_arrays()
        assert {n.rsplit(".", 2)[1] for n in payload["tensors"]} == {"q_proj", "k_proj", "v_proj", "gate_proj",
                                                                    "up_proj"}
        engine.update_weights(payload)
        got = engine.completion_logprobs(PROMPT, COMPLETION)
        assert _gap(got, want) < SYNC_TOL, (got, want)

    # the adapted layers alone (q without k): refused before anything is loaded, the engine keeps its weights
    with pytest.raises(Exception, match="part of a packed parameter"):
        engine.update_weights(arrays_from_tensors(L.merged_adapted_weights(trainer.lora), partial=True))
    assert _gap(engine.completion_logprobs(PROMPT, COMPLETION), want) < SYNC_TOL


def test_adapter_sync_is_served_by_vllm(tiny_models, release_vllm_groups):
    from posttrain.rollout.vllm_engine import VllmEngine

    base_dir = str(tiny_models.untied_a)
    cfg = load_config(None, [f"model.path={base_dir}", "topology.torch_threads=1", "model.lora.r=4",
                             "model.lora.target_modules=all-linear", "model.lora.sync=adapter"]).to_dict()
    trainer = Trainer(cfg, base_dir)
    engine = VllmEngine(base_dir, max_model_len=128, kv_cache_gb=1, max_lora_rank=4)
    base = engine.completion_logprobs(PROMPT, COMPLETION)  # no adapter yet: the base model, = a fresh adapter's
    assert _gap(base, _adapted_logprobs(trainer)) < SYNC_TOL

    for seed in (1, 2):  # each sync a new adapter version; the old one is dropped
        _set_adapters(trainer, seed)
        want = _adapted_logprobs(trainer)
        assert _gap(want, base) > 0.1, "the adapters must move the logprobs for this test to mean anything"
        payload = trainer.export_arrays()
        assert all(".lora_A." in n or ".lora_B." in n for n in payload["tensors"])
        assert sum(raw.nbytes for _, _, raw in payload["tensors"].values()) < sum(
            t.numel() * 4 for t in L.merged_adapted_weights(trainer.lora).values()) / 4
        engine.update_weights(payload if seed == 1 else payload_as_safetensors(payload))  # both payload kinds
        assert engine.adapter.loaded_ids() == {seed}
        got = engine.completion_logprobs(PROMPT, COMPLETION)
        assert _gap(got, want) < SYNC_TOL, (got, want)
        # generate serves the adapter too: the logprobs of its greedy completion are the adapted policy's
        (out,) = engine.generate([PROMPT], SamplingSpec(n=1, max_new_tokens=6, temperature=0.0), [0])[0]
        with torch.no_grad():
            trained = completion_logprobs(trainer.model.eval(), pack([PROMPT], [out.token_ids], trainer.pad_id))[0]
        assert _gap(out.logprobs, trained.tolist()) < SYNC_TOL

    # an adapter vLLM refuses (here a rank above the engine's max_lora_rank, 8): one message, the old one stays
    config = json.loads(payload[ADAPTER_CONFIG_KEY])
    with pytest.raises(PosttrainError, match="vLLM refused the policy's adapter"):
        engine.update_weights({**payload, ADAPTER_CONFIG_KEY: json.dumps({**config, "r": 16})})
    assert engine.adapter.loaded_ids() == {2}
    assert _gap(engine.completion_logprobs(PROMPT, COMPLETION), want) < SYNC_TOL
