"""The planner's formulas against numbers worked out by hand (a Llama-2-7B-shaped config), and the layouts'
feasibility, reasons and choice."""

import json

import pytest

from posttrain.errors import PosttrainError
from posttrain.topology import memory as M
from posttrain.topology.devices import parse_cluster
from posttrain.topology.flops import Workload
from posttrain.topology.model_shape import read_model_shape, shape_from_config
from posttrain.topology.plan import PlanInputs, choose, colocated, plan_layouts, split, split_pairs

LLAMA_7B = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                intermediate_size=11008, vocab_size=32000, tie_word_embeddings=False, model_type="llama")
LLAMA31_8B = dict(LLAMA_7B, num_key_value_heads=8, intermediate_size=14336, vocab_size=128256)


def test_parameter_count_of_a_7b_llama():
    # embeddings 32000*4096 = 131,072,000; per layer: attention 4*4096^2 = 67,108,864, MLP 3*4096*11008 =
    # 135,266,304, norms 2*4096 = 8,192 -> 202,383,360; * 32 = 6,476,267,520; final norm 4,096; lm_head 131,072,000.
    # Total 6,738,415,616 (Llama-2-7B's published count).
    assert shape_from_config(LLAMA_7B).params == 6_738_415_616
    # Tied embeddings drop the lm_head: 6,738,415,616 - 131,072,000.
    assert shape_from_config(dict(LLAMA_7B, tie_word_embeddings=True)).params == 6_607_343_616


def test_parameter_count_matches_the_built_tiny_models(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    # Qwen2 carries q/k/v biases: the count must include them to match exactly.
    assert read_model_shape(tiny_model_dir).params == model.num_parameters()
    assert read_model_shape(f"{tiny_model_dir}/config.json").params == model.num_parameters()


def test_memory_formulas():
    s7 = shape_from_config(LLAMA_7B)
    # 16 bytes/param mixed-precision Adam, fully sharded over 8: 16 * 6,738,415,616 / 8 = 13,476,831,232.
    assert M.train_state_bytes(s7, "bfloat16", 8) == 13_476_831_232
    assert M.weight_bytes(s7, "bfloat16") == 13_476_831_232  # 2 bytes/param
    # KV per token, Llama-3.1-8B bf16: 2 * 32 layers * 8 kv heads * 128 head_dim * 2 bytes = 131,072.
    assert M.kv_bytes_per_token(shape_from_config(LLAMA31_8B), "bfloat16") == 131_072
    # Activations s=1024, b=4 (4096 tokens), bf16, Llama-style layer: 8h + 2*kv_dim + 4i = 32,768 + 8,192 + 44,032
    # = 84,992 elements/token/layer * 2 B = 169,984 B; * 4096 tokens * 32 layers = 22,280,142,848;
    # + fp32 logits 4096 * 32000 * 4 = 524,288,000 -> 22,804,430,848.
    assert M.activation_bytes(s7, 1024, 4, "bfloat16", checkpointing=False) == 22_804_430_848
    # Full recomputation keeps the layer input h per token: 4096*2 B * 4096 * 32 = 1,073,741,824 + 524,288,000.
    assert M.activation_bytes(s7, 1024, 4, "bfloat16", checkpointing=True) == 1_598_029_824
    # Megatron's GPT count for comparison: s*b*h*(34 + 5*a*s/h) = 16,777,216 * (34 + 40) = 1,241,513,984 per
    # layer * 32 = 39,728,447,488.
    assert M.megatron_activation_bytes(s7, 1024, 4, checkpointing=False) == 39_728_447_488


def _inputs(cluster="8xH100-80GB", **kw):
    base = dict(cluster=parse_cluster(cluster), policy=shape_from_config(LLAMA_7B),
                workload=Workload(sequences=64, prompt_tokens=512, completion_tokens=512, micro_batch=1),
                dtype="bfloat16", reference=True, checkpointing=True, usd_per_device_hour=3.0)
    return PlanInputs(**{**base, **kw})


def test_colocated_memory_and_time_by_hand():
    plan = colocated(_inputs())
    assert plan.feasible and plan.devices["policy"] == list(range(8))
    # Per device: policy states 13,476,831,232 + reference weights 13,476,831,232/8 = 1,684,603,904 (resident),
    # plus the largest phase working set: the engine's (tp=1: 13.5 GB weights <= half of 72 GB usable) weights
    # 13,476,831,232 + KV 64 seqs * 1024 tokens * 524,288 B/token (2*32*32*128*2) / 8 = 4,294,967,296
    # = 17,771,798,528 (> policy activations 399,507,456 and reference forward 1024 * (84,992 * 2 + 32000 * 4)
    # = 305,135,616).
    # Peak 13,476,831,232 + 1,684,603,904 + 17,771,798,528 = 32,933,233,664.
    assert plan.peak_bytes_per_device == pytest.approx(32_933_233_664)
    assert plan.headroom_bytes == pytest.approx(80e9 - 32_933_233_664)
    t = plan.phase_seconds
    # Generate: compute 2N*(64*512 prompt + 64*512 generated) = 8.832e14 FLOPs / (8 * 989e12 * 0.30) = 0.372 s,
    # but decoding 512 steps each reading 13,476,831,232 B at 3.35e12 B/s takes 2.0597 s: memory-bound.
    assert t["generate"] == pytest.approx(512 * 13_476_831_232 / 3.35e12)
    # Reference: 2N * 65,536 tokens = 8.832e14 / (8 * 989e12 * 0.30) = 0.37210 s.
    assert t["reference"] == pytest.approx(2 * 6_738_415_616 * 65_536 / (8 * 989e12 * 0.30))
    # Train: 6N * 65,536 = 2.6497e15 / (8 * 989e12 * 0.40) = 0.83723 s.
    assert t["train_policy"] == pytest.approx(6 * 6_738_415_616 * 65_536 / (8 * 989e12 * 0.40))
    # Sync on the same devices: weights through device memory, 13,476,831,232 / 3.35e12 = 0.00402 s.
    assert t["sync"] == pytest.approx(13_476_831_232 / 3.35e12)
    assert plan.step_seconds == pytest.approx(sum(t.values()))
    # Cost: every device of the cluster is paid: step * 8 * $3/h / 3600.
    assert plan.usd_per_step == pytest.approx(plan.step_seconds * 8 * 3.0 / 3600)


def test_infeasible_layout_names_the_device_and_the_roles():
    # 256 sequences of 1024 tokens, whole micro-batch (32/device), no recomputation: activations alone
    # 32 * 1024 * 169,984 * 32 = 178 GB.
    inp = _inputs(workload=Workload(256, 512, 512), checkpointing=False)
    plan = colocated(inp)
    assert not plan.feasible
    assert plan.reason.startswith("device 0 needs") and "policy" in plan.reason and "72.0 GB usable" in plan.reason
    assert choose(plan_layouts(inp), "auto") is None


def test_split_pairs_needs_a_reward_model_or_critic():
    assert "not applicable" in split_pairs(_inputs()).reason
    plan = split_pairs(_inputs(reward=shape_from_config(LLAMA_7B)))
    assert plan.feasible
    # policy, reference and engine share one device set; the reward model gets the rest.
    a, b = set(plan.devices["policy"]), set(plan.devices["reward"])
    assert plan.devices["reference"] == plan.devices["rollout"] == plan.devices["policy"]
    assert a.isdisjoint(b) and a | b == set(range(8))


def test_split_gives_each_role_its_own_devices_and_auto_picks_the_cheapest():
    inp = _inputs(cluster="2x8xH100-80GB", reward=shape_from_config(LLAMA_7B))
    plans = plan_layouts(inp)
    sp = split(inp)
    ids = [set(v) for v in sp.devices.values()]
    assert sp.feasible and sum(len(s) for s in ids) == 16 and all(a.isdisjoint(b) for a in ids for b in ids if a is not b)
    best = choose(plans, "auto")
    assert best.usd_per_step == min(p.usd_per_step for p in plans if p.feasible)
    assert choose(plans, "split").layout == "split"
    json.dumps([p.to_dict() for p in plans])  # the plan file is plain JSON


def test_cluster_strings():
    c = parse_cluster("2x8xH100-80GB")
    assert (c.nodes, c.devices_per_node, c.devices, c.device.memory_bytes) == (2, 8, 16, 80e9)
    assert parse_cluster("8xH100").nodes == 1
    assert parse_cluster("4xA100-40GB").device.memory_bytes == 40e9
    with pytest.raises(PosttrainError, match="NODESxDEVICESxTYPE"):
        parse_cluster("eight H100s")
    with pytest.raises(PosttrainError, match="unknown device"):
        parse_cluster("8xTPU")
