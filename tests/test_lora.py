"""LoRA through peft (models/lora.py, the Trainer with model.lora): which layers get adapters, the merged weights
against a hand computation, only the adapters trained, the reference = the trainer's base model with adapters off
(equal to a separate ReferenceModel before and after a step), the partial weight sync into the HF engine, and the
checkpoint (peft's adapter format + a merged model/) with an exact load. No Ray: the classes hold no Ray code."""

from __future__ import annotations

import pytest
import torch

from posttrain.config import LoraConfig, load_config
from posttrain.errors import PosttrainError
from posttrain.models import lora as L
from posttrain.models.loading import load_causal_lm
from posttrain.training.batch import completion_logprobs, pack
from posttrain.training.trainer import Trainer, TrainBatch
from numerics_bounds import FLOAT64, assert_same

PROMPTS = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16], [17, 18]]
COMPLETIONS = [[20, 21, 22, 23], [24, 25], [26, 27, 28], [29, 30, 31, 32, 33]]
# tiny "1m" model: hidden 128, MLP 512, 4 layers; a LoRA of rank r on an [out, in] layer has r * (in + out) weights.
# Per layer: q, k, v, o 4 * r (128 + 128) + gate, up 2 * r (128 + 512) + down r (512 + 128) = 2944 r.
ADAPTER_WEIGHTS_PER_RANK = 4 * 2944
# base + adapter (x W^T + s x A^T B^T) and the merged layer (x (W + s B A)^T) sum in other orders: those comparisons
# run in float64, where they agree to F64_TOL on any CPU (tests/numerics_bounds.py).


def _cfg(model_dir: str, *extra: str) -> dict:
    return load_config(None, [f"model.path={model_dir}", "topology.torch_threads=1", "algorithm.kl_coef=0.05",
                              "algorithm.group_size=2", "algorithm.prompts_per_step=2", "algorithm.lr=0.01",
                              "model.lora.r=4", "model.lora.alpha=8", *extra]).to_dict()


def _batch(ref_logprobs=None) -> TrainBatch:
    engine = [[-3.0] * len(c) for c in COMPLETIONS]
    return TrainBatch(prompts=PROMPTS, completions=COMPLETIONS, advantages=[1.0, -1.0, 0.5, -0.5],
                      engine_logprobs=engine, ref_logprobs=ref_logprobs)


def _policy_logprobs(trainer: Trainer) -> torch.Tensor:
    with torch.no_grad():
        return completion_logprobs(trainer.model.eval(), pack(PROMPTS, COMPLETIONS, trainer.pad_id))


def _random_adapters(peft_model, seed: int = 1) -> None:
    """B = 0 at init makes every delta zero; random B makes the merge visible."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)


# ---------------------------------------------------------------- targets


def test_targets_follow_peft_matching_and_all_linear_leaves_the_head_out(tiny_model_dir):
    model, _ = load_causal_lm(tiny_model_dir)
    assert L.layer_suffixes(L.linear_layer_names(model)) == [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]
    all_linear = L.target_layer_names(model, "all-linear")
    assert len(all_linear) == 4 * 7 and "lm_head" not in all_linear
    assert L.target_layer_names(model, ["q_proj", "v_proj"])[:2] == ["model.layers.0.self_attn.q_proj",
                                                                      "model.layers.0.self_attn.v_proj"]
    assert len(L.target_layer_names(model, ["self_attn.q_proj"])) == 4  # a dotted suffix
    assert L.target_layer_names(model, ["proj"]) == []  # a suffix is a whole name part, not a substring


def test_targets_naming_no_layer_list_the_models_linear_layers(tiny_model_dir):
    with pytest.raises(PosttrainError) as e:
        L.check_lora_targets(LoraConfig(target_modules=["query", "value"]), tiny_model_dir)
    msg = str(e.value)
    assert "model.lora.target_modules=['query', 'value']" in msg and tiny_model_dir in msg
    assert "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, lm_head" in msg


def test_a_tied_head_is_refused(tmp_path):
    from posttrain.models.tiny import build_tiny_model

    tied = build_tiny_model(tmp_path / "tied", "1m", tie_word_embeddings=True)
    with pytest.raises(PosttrainError, match="tied to the input embedding"):
        L.check_lora_targets(LoraConfig(target_modules=["q_proj", "lm_head"]), tied)


# ---------------------------------------------------------------- merged weights


def test_merged_weights_are_w_plus_scaled_b_a_and_the_model_is_untouched(tiny_model_dir):
    model, _ = load_causal_lm(tiny_model_dir, "float64")
    base = {k: v.clone() for k, v in model.state_dict().items()}
    peft_model = L.apply_lora(model, LoraConfig(r=4, alpha=8, target_modules=["q_proj", "down_proj"]), tiny_model_dir)
    _random_adapters(peft_model)
    merged = L.merged_adapted_weights(peft_model)
    assert len(merged) == 8
    modules = dict(model.named_modules())
    for name, w in merged.items():
        layer = modules[name.removesuffix(".weight")]
        a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
        by_hand = base[name] + (8 / 4) * (b @ a)  # W + alpha/r B A
        assert_same(w, by_hand, name)  # one fused addmm against a matmul and an add
        assert float((w - base[name]).abs().max()) > 0.01  # the adapters really change the layer
    # nothing was merged into the model: its base layers still hold the base weights, bit for bit
    for name in merged:
        assert torch.equal(modules[name.removesuffix(".weight")].base_layer.weight, base[name])
    # the whole merged state dict is a plain model that computes what the adapted model computes
    plain, _ = load_causal_lm(tiny_model_dir, "float64")
    plain.load_state_dict(L.merged_state_dict(peft_model))
    ids = torch.tensor([PROMPTS[0] + COMPLETIONS[0]])
    with torch.no_grad():
        assert_same(plain(ids).logits, peft_model.eval()(input_ids=ids).logits, "merged vs base + adapter")


# ---------------------------------------------------------------- the trainer


def test_only_the_adapters_are_trained(tiny_model_dir):
    trainer = Trainer(_cfg(tiny_model_dir), tiny_model_dir)
    trainable = [p for p in trainer.model.parameters() if p.requires_grad]
    assert sum(p.numel() for p in trainable) == 4 * ADAPTER_WEIGHTS_PER_RANK == 47104
    assert [p for g in trainer.optimizer.param_groups for p in g["params"]] == trainable
    frozen = {n: p.clone() for n, p in trainer.model.named_parameters() if not p.requires_grad}
    trainer.train_step(_batch())
    assert all(torch.equal(p, frozen[n]) for n, p in trainer.model.named_parameters() if not p.requires_grad)
    assert any(float(p.detach().abs().max()) > 0 for n, p in trainer.model.named_parameters() if "lora_B" in n)


def test_reference_with_adapters_off_equals_a_separate_reference_model(tiny_model_dir):
    """Exactly, before and after a step: with the adapters off each LoRA layer runs its base Linear alone."""
    from posttrain.training.reference import ReferenceModel

    cfg = _cfg(tiny_model_dir)
    trainer = Trainer(cfg, tiny_model_dir)
    reference = ReferenceModel(cfg, tiny_model_dir)
    want = reference.logprobs(PROMPTS, COMPLETIONS)
    assert trainer.reference_logprobs(PROMPTS, COMPLETIONS) == want
    policy_before = _policy_logprobs(trainer)
    trainer.model.train()
    trainer.train_step(_batch(ref_logprobs=want))
    trainer.train_step(_batch(ref_logprobs=want))
    assert trainer.model.training  # reference_logprobs leaves the train mode as it found it
    assert trainer.reference_logprobs(PROMPTS, COMPLETIONS) == want
    moved = float((_policy_logprobs(trainer) - policy_before).abs().max())
    assert moved > 0.01, f"the policy's logprobs should have moved after two steps at lr 0.01 ({moved})"


def test_sync_sends_the_adapted_layers_and_their_packed_siblings_into_the_hf_engine(tiny_model_dir):
    from posttrain.rollout.hf_engine import HfEngine
    from posttrain.models.weights import export_arrays, payload_as_safetensors, payload_tensors

    trainer = Trainer(_cfg(tiny_model_dir, "model.lora.target_modules=[q_proj, v_proj]", *FLOAT64), tiny_model_dir)
    _random_adapters(trainer.lora)
    payload = trainer.export_arrays()
    names = sorted(payload["tensors"])
    # q and v merged; k (unchanged) rides along because vLLM stacks q, k, v into one parameter
    assert names == sorted(f"model.layers.{i}.self_attn.{p}_proj.weight" for i in range(4) for p in "qkv")
    sent = sum(raw.nbytes for _, _, raw in payload["tensors"].values())
    whole_model = load_causal_lm(tiny_model_dir, "float64")[0]
    full = sum(raw.nbytes for _, _, raw in export_arrays(whole_model)["tensors"].values())
    assert sent == 12 * 128 * 128 * 8 and full > 4 * sent  # bytes: 12 float64 128x128 matrices vs the whole model
    assert torch.equal(payload_tensors(payload)["model.layers.0.self_attn.k_proj.weight"],
                       trainer.lora.get_base_model().model.layers[0].self_attn.k_proj.weight.detach())
    want = _policy_logprobs(trainer)
    engine = HfEngine(tiny_model_dir, dtype="float64")
    for p in (payload, payload_as_safetensors(payload)):  # arrays (the loop) and bytes keep "partial"
        engine.update_weights(p)
        got = [engine.completion_logprobs(pr, c) for pr, c in zip(PROMPTS, COMPLETIONS)]
        assert_same(got, [want[i, : len(c)] for i, c in enumerate(COMPLETIONS)], "engine after sync vs trainer")


# ---------------------------------------------------------------- checkpoint


def test_checkpoint_holds_peft_adapter_and_merged_model_and_loads_exactly(tiny_model_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from posttrain import checkpoint as ckpt

    cfg = _cfg(tiny_model_dir, *FLOAT64)
    trainer = Trainer(cfg, tiny_model_dir)
    trainer.train_step(_batch())
    tmp = ckpt.begin_checkpoint(tmp_path / "checkpoints", 1)
    trainer.save(str(tmp))
    final = ckpt.finalize_checkpoint(tmp, 1)
    files = set(ckpt.verify_checkpoint(final)["files"])
    assert {"adapter/adapter_config.json", "adapter/adapter_model.safetensors", "adapter/posttrain_base.json",
            "model/model.safetensors", "model/config.json", "trainer_state.pt"} <= files

    ids = torch.tensor([PROMPTS[0] + COMPLETIONS[0]])
    with torch.no_grad():
        want = trainer.model.eval()(input_ids=ids).logits
        from_peft = PeftModel.from_pretrained(load_causal_lm(tiny_model_dir, "float64")[0], str(final / "adapter"))
        merged = AutoModelForCausalLM.from_pretrained(str(final / "model"), dtype=torch.float64)
        # the same adapter, the same computation in one process: bitwise equal on any CPU
        assert torch.equal(from_peft.eval()(input_ids=ids).logits, want)
        assert_same(merged(ids).logits, want, "merged model/ vs base + adapter")

    resumed = Trainer(cfg, tiny_model_dir)
    resumed.load(str(final))
    adapters = {n: p for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert all(torch.equal(p, adapters[n]) for n, p in resumed.model.named_parameters() if p.requires_grad)
    saved, loaded = trainer.optimizer.state_dict()["state"], resumed.optimizer.state_dict()["state"]
    assert saved.keys() == loaded.keys() and all(torch.equal(saved[k]["exp_avg"], loaded[k]["exp_avg"]) for k in saved)
    assert resumed.updates == trainer.updates == 1
    # the next step from the loaded state is the straight run's next step (one process here: one torch RNG, which
    # load set to the saved state; each trainer starts its step from that state)
    rng = torch.get_rng_state()
    assert torch.equal(rng, torch.load(final / "trainer_state.pt", weights_only=True)["torch_rng"])
    trainer.model.train()
    trainer.train_step(_batch())
    torch.set_rng_state(rng)
    resumed.train_step(_batch())
    assert all(torch.equal(p, adapters[n]) for n, p in resumed.model.named_parameters() if p.requires_grad)


# ---------------------------------------------------------------- posttrain export --merge


def _run_with_checkpoint(tmp_path, model_dir: str, *extra: str):
    """A run directory as `train` leaves it (config.yaml, checkpoints/step_000001) from one trainer step."""
    from posttrain.config import RunConfig, dump_config
    from posttrain import checkpoint as ckpt

    cfg = RunConfig.model_validate(_cfg(model_dir, f"runs_dir={tmp_path}", "name=r", *extra))
    cfg.run_dir.mkdir(parents=True)
    (cfg.run_dir / "config.yaml").write_text(dump_config(cfg))
    trainer = Trainer(cfg.to_dict(), model_dir)
    _random_adapters(trainer.lora) if trainer.lora is not None else trainer.train_step(_batch())
    tmp = ckpt.begin_checkpoint(cfg.run_dir / "checkpoints", 1)
    trainer.save(str(tmp))
    return cfg.run_dir, trainer, ckpt.finalize_checkpoint(tmp, 1)


def test_export_merge_writes_a_plain_hf_model_of_the_adapted_policy(tiny_model_dir, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM
    from typer.testing import CliRunner

    from posttrain.cli import app

    run_dir, trainer, final = _run_with_checkpoint(tmp_path, tiny_model_dir, *FLOAT64)
    out = tmp_path / "merged"
    result = CliRunner().invoke(app, ["export", str(run_dir), "--step", "1", "--merge", str(out)])
    assert result.exit_code == 0, result.output
    assert "merged the LoRA adapter" in " ".join(result.output.split())
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float64)
    ids = torch.tensor([PROMPTS[2] + COMPLETIONS[2]])
    with torch.no_grad():
        assert_same(model(ids).logits, trainer.model.eval()(input_ids=ids).logits, "export --merge vs base + adapter")
    # peft's merge_and_unload (B A, scaled, added) and the trainer's own merge (one addmm; the checkpoint's model/)
    exported, in_ckpt = load_file(str(out / "model.safetensors")), load_file(str(final / "model" / "model.safetensors"))
    assert_same(exported, in_ckpt, "peft's merge vs the trainer's")
    assert (out / "tokenizer_config.json").is_file() and not any(out.glob("adapter*"))


def test_export_merge_of_a_full_weight_run_copies_its_model_and_says_so(tiny_model_dir, tmp_path):
    from typer.testing import CliRunner

    from posttrain.cli import app

    run_dir, _, final = _run_with_checkpoint(tmp_path, tiny_model_dir, "model.lora=null")
    out = tmp_path / "copied"
    result = CliRunner().invoke(app, ["export", str(run_dir), "--merge", str(out)])
    assert result.exit_code == 0, result.output
    assert "has no LoRA adapter (full fine-tuning): copied the model of" in " ".join(result.output.split())
    assert (out / "model.safetensors").read_bytes() == (final / "model" / "model.safetensors").read_bytes()


def test_with_lora_no_reference_role_is_reserved():
    from posttrain.topology.placement import role_bundles

    names = lambda *o: [n for n, _ in role_bundles(load_config(None, ["algorithm.kl_coef=0.05", *o]))]  # noqa: E731
    assert "reference" in names() and "reference" not in names("model.lora.r=8")
