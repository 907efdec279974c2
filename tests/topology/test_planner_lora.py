"""The planner with LoRA, against numbers worked out by hand for a Qwen2-0.5B shape (hidden 896, 24 layers, 14 heads,
2 KV heads, head_dim 64, intermediate 4864, vocab 151936, tied embeddings, q/k/v biases), and against peft's own
count on a small model."""

import json

import pytest
from typer.testing import CliRunner

from posttrain.errors import PosttrainError
from posttrain.topology import memory as M
from posttrain.topology.devices import parse_cluster
from posttrain.topology.flops import Workload
from posttrain.topology.lora import LoraShape, adapted_weight_params, lora_trainable_params
from posttrain.topology.model_shape import shape_from_config
from posttrain.topology.plan import PlanInputs, colocated

QWEN2_05B = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                 intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True, model_type="qwen2")
R16 = LoraShape(r=16)  # all-linear, merged sync


def test_qwen2_05b_parameter_count():
    # Per layer: q and o 896*896 = 802,816 each; k and v 896*128 (2 KV heads * 64) = 114,688 each; q/k/v biases
    # 896 + 128 + 128 = 1,152 -> attention 1,836,160. MLP 3 * 896 * 4864 = 13,074,432. Norms 2 * 896 = 1,792.
    # Layer 14,912,384; * 24 = 357,897,216. Embeddings 151,936 * 896 = 136,134,656 (tied: no lm_head), final norm
    # 896. Total 494,032,768: Qwen2-0.5B's published count.
    assert shape_from_config(QWEN2_05B).params == 494_032_768


def test_lora_trainable_parameters_by_hand():
    s = shape_from_config(QWEN2_05B)
    # r * (in + out) per adapted [out, in] layer, r = 16: q [896, 896] 16 * 1,792 = 28,672; k, v [128, 896]
    # 16 * 1,024 = 16,384 each; o 28,672; gate, up [4864, 896] and down [896, 4864] 16 * 5,760 = 92,160 each.
    # Layer 2 * 28,672 + 2 * 16,384 + 3 * 92,160 = 366,592; * 24 = 8,798,208 (all-linear leaves out lm_head).
    assert lora_trainable_params(s, R16) == 8_798_208
    # q and v only: (28,672 + 16,384) * 24 = 1,081,344.
    assert lora_trainable_params(s, LoraShape(16, ("q_proj", "v_proj"))) == 1_081_344
    # A longer suffix picks one layer: layers.0 is not a suffix of layers.10 or layers.20.
    assert lora_trainable_params(s, LoraShape(16, ("layers.0.self_attn.q_proj",))) == 28_672
    # The LM head only when named, and only untied: 16 * (896 + 151,936) = 2,445,312.
    untied = shape_from_config(dict(QWEN2_05B, tie_word_embeddings=False))
    assert lora_trainable_params(untied, LoraShape(16, ("lm_head",))) == 2_445_312
    with pytest.raises(PosttrainError, match="tied to the input embedding"):
        lora_trainable_params(s, LoraShape(16, ("lm_head",)))
    # A merged sync sends the adapted matrices: per layer 2 * 802,816 + 2 * 114,688 + 3 * 4,358,144 = 14,909,440
    # (no biases, no norms); * 24 = 357,826,560 of the 494,032,768 (the embeddings never change).
    assert adapted_weight_params(s, R16) == 357_826_560
    with pytest.raises(PosttrainError, match=r"model.lora.target_modules: \['embed_tokens'\] match no linear layer"):
        lora_trainable_params(s, LoraShape(16, ("q_proj", "embed_tokens")))


def test_lora_count_matches_peft_on_a_small_qwen2():
    """The layer list (names and [out, in] shapes) is the model's: peft's count on a real model agrees."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               intermediate_size=96, vocab_size=100, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen2Config(**cfg))
    shape = shape_from_config(dict(cfg, model_type="qwen2"))
    assert shape.params == model.num_parameters()
    for targets in ("all-linear", ["q_proj", "v_proj"], ["mlp.down_proj", "lm_head"]):
        peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=targets))
        trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
        assert lora_trainable_params(shape, LoraShape(4, targets if isinstance(targets, str) else tuple(targets))) \
            == trainable, targets
        model = peft_model.unload()


def _inputs(lora=R16, reference=True):
    # One 24 GB CPU slot, 8 sequences of 32 prompt + 32 completion tokens, float32, no recomputation.
    return PlanInputs(cluster=parse_cluster("1x1xCPU-24GB"), policy=shape_from_config(QWEN2_05B),
                      workload=Workload(sequences=8, prompt_tokens=32, completion_tokens=32), dtype="float32",
                      reference=reference, lora=lora)


def test_lora_trainer_memory_by_hand():
    s = shape_from_config(QWEN2_05B)
    # Full fine-tuning in fp32: 16 B/param (weights, gradients, two AdamW moments) * 494,032,768 = 7,904,524,288.
    assert M.train_state_bytes(s, "float32") == 7_904_524_288
    # LoRA: frozen weights 4 * 494,032,768 = 1,976,131,072 once, adapters 16 * 8,798,208 = 140,771,328.
    full, lora = colocated(_inputs(lora=None)), colocated(_inputs())
    assert lora.memory["policy"]["resident"] == {"frozen_weights": 1_976_131_072, "adapter_states": 140_771_328}
    # Activations, 8 * 64 = 512 tokens: a layer keeps 8h + 2kv + 4i = 7,168 + 256 + 19,456 = 26,880 elements per
    # token * 4 B = 107,520; * 512 * 24 layers = 1,321,205,760; fp32 logits 512 * 151,936 * 4 = 311,164,928:
    # 1,632,370,688. LoRA adds A's output, r = 16 per adapted layer (7 * 24 = 168): 2,688 * 4 B * 512 = 5,505,024.
    assert full.memory["policy"]["working"]["activations"] == 1_632_370_688
    assert lora.memory["policy"]["working"]["activations"] == 1_632_370_688 + 5_505_024
    # No reference role with LoRA: the frozen copy (1,976,131,072 B in the full plan) is gone.
    assert full.memory["reference"]["resident"]["weights"] == 1_976_131_072
    assert "reference" not in lora.memory and set(lora.devices) == {"policy", "rollout"}
    # Trainer totals: full 7,904,524,288 + 1,632,370,688 = 9,536,894,976; LoRA 2,116,902,400 + 1,637,875,712 =
    # 3,754,778,112.
    def trainer_total(plan):
        return sum(plan.memory["policy"]["resident"].values()) + sum(plan.memory["policy"]["working"].values())

    assert (trainer_total(full), trainer_total(lora)) == (9_536_894_976, 3_754_778_112)
    # On 4 devices the full policy's training states shard (7,904,524,288 / 4 = 1,976,131,072 each); a LoRA policy
    # does not (each rank holds the whole base and adapters, training/distributed.py), so its resident stays.
    four = dict(cluster=parse_cluster("1x4xCPU-24GB"), policy=s, dtype="float32",
                workload=Workload(sequences=8, prompt_tokens=32, completion_tokens=32))
    full4, lora4 = colocated(PlanInputs(**four, lora=None)), colocated(PlanInputs(**four, lora=R16))
    assert full4.memory["policy"]["resident"]["train_states"] == 1_976_131_072
    assert lora4.memory["policy"]["resident"] == {"frozen_weights": 1_976_131_072, "adapter_states": 140_771_328}


def test_lora_time_and_sync_by_hand():
    full, lora = colocated(_inputs(lora=None)), colocated(_inputs())
    cpu = parse_cluster("1x1xCPU").device
    tokens, n = 512, 494_032_768
    # Training a frozen base: forward 2N + input gradients 2N, no weight gradients; the adapters 6 per parameter:
    # (4 * 494,032,768 + 6 * 8,798,208) * 512 = 1,038,807,203,840 FLOPs vs 6N * 512 = 1,517,668,663,296.
    assert lora.phase_seconds["train_policy"] == pytest.approx(1_038_807_203_840 / (cpu.peak_flops * cpu.train_mfu))
    assert full.phase_seconds["train_policy"] == pytest.approx(6 * n * tokens / (cpu.peak_flops * cpu.train_mfu))
    # The reference pass is the same forward (2N per token), run by the trainer with the adapters off.
    assert lora.phase_seconds["reference"] == full.phase_seconds["reference"] > 0
    # Merged sync: 357,826,560 adapted elements * 4 B = 1,431,306,240 B (vs 1,976,131,072 for every weight);
    # adapter sync: 8,798,208 * 4 B = 35,192,832 B.
    assert lora.phase_seconds["sync"] == pytest.approx(1_431_306_240 / cpu.memory_bandwidth)
    assert full.phase_seconds["sync"] == pytest.approx(1_976_131_072 / cpu.memory_bandwidth)
    adapter = colocated(_inputs(lora=LoraShape(16, sync="adapter")))
    assert adapter.phase_seconds["sync"] == pytest.approx(35_192_832 / cpu.memory_bandwidth)
    # Without a KL term there is no reference pass at all.
    assert colocated(_inputs(reference=False)).phase_seconds["reference"] == 0


def test_plan_cli_prints_trainable_parameters_and_the_reference_in_the_trainer(tmp_path):
    from posttrain.cli import app

    (tmp_path / "config.json").write_text(json.dumps(QWEN2_05B))
    args = ["plan", "--cluster", "1x1xCPU-24GB", "--policy-config", str(tmp_path), "--out", str(tmp_path / "p.json"),
            "rollout.max_new_tokens=32", "rollout.vllm.max_model_len=64", "algorithm.kl_coef=0.04"]
    r = CliRunner().invoke(app, [*args, "model.lora.r=16"])
    assert r.exit_code == 0, r.output
    assert "8,798,208 trainable params (1.78% of 494,032,768)" in r.output
    assert "reference: in trainer (adapters off)" in r.output
    doc = json.loads((tmp_path / "p.json").read_text())
    assert doc["trainable_params"] == 8_798_208 and doc["lora"]["adapted_layers"] == 168
    assert all("reference" not in p["devices"] for p in doc["layouts"])
    r = CliRunner().invoke(app, args)
    assert "full fine-tuning: 494,032,768 trainable params; reference: own actor" in r.output
    r = CliRunner().invoke(app, [*args, "model.lora.target_modules=[q_proj,embed_tokens]"])
    assert r.exit_code == 2 and "match no linear layer" in r.output
