"""LoRA adapters (peft) on a loaded HF causal LM: which linear layers `model.lora.target_modules` names, putting
the adapters on, and the merged weights W + (alpha/r)·B@A of the adapted layers under the base model's HF names,
computed without touching the model (the engines and the checkpoint's `model/` get these; the base weights stay
bit-exact, so the adapters-off reference is the base model itself).

Matching follows peft's rule: a target matches a module whose name equals it or ends in "." + it;
"all-linear" is every linear layer but the LM head.
"""

from __future__ import annotations

import json
from pathlib import Path

from posttrain.config.lora import AdapterConfig, LoraConfig
from posttrain.errors import PosttrainError

ADAPTER_DIR = "adapter"             # in a checkpoint: peft's format (adapter_config.json, adapter_model.safetensors)
BASE_RECORD = "posttrain_base.json"  # in ADAPTER_DIR: the base model's path and content hash
ADAPTER_NAME = "default"
# vLLM stacks these sibling layers into one parameter (qkv_proj, gate_up_proj in its Llama/Qwen/Mistral models'
# packed_modules_mapping) and cannot reload part of one: a sync sends a group whole (rollout/vllm_sync.py checks).
PACKED_SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def linear_layer_names(model) -> list[str]:
    """Module names of the linear layers (torch Linear, and transformers' Conv1D of GPT-2-style models)."""
    import torch

    linear_types: tuple = (torch.nn.Linear,)
    try:
        from transformers.pytorch_utils import Conv1D

        linear_types += (Conv1D,)
    except ImportError:  # pragma: no cover
        pass
    return [name for name, m in model.named_modules() if isinstance(m, linear_types)]


def output_layer_name(model) -> str | None:
    head = model.get_output_embeddings()
    return next((name for name, m in model.named_modules() if m is head), None) if head is not None else None


def target_layer_names(model, target_modules: list[str] | str) -> list[str]:
    """The linear layers `target_modules` adapts, in model order (see the module docstring for the rule)."""
    linear = linear_layer_names(model)
    if target_modules == "all-linear":
        head = output_layer_name(model)
        return [n for n in linear if n != head]
    return [n for n in linear if any(n == t or n.endswith("." + t) for t in target_modules)]


def layer_suffixes(names: list[str]) -> list[str]:
    """Deduplicated last name parts, in first-seen order: ["q_proj", "k_proj", ..., "lm_head"]."""
    return list(dict.fromkeys(n.rsplit(".", 1)[-1] for n in names))


def check_targets(lora: AdapterConfig, model, model_dir: str | Path, field: str = "model.lora") -> list[str]:
    """The adapted layers' names, or a PosttrainError when the targets name none of the model's linear layers or
    would adapt a head tied to the input embedding (the engines hold one tensor for both)."""
    names = target_layer_names(model, lora.target_modules)
    if not names:
        raise PosttrainError(
            f"{field}.target_modules={lora.target_modules} names no linear layer of the model in {model_dir}; "
            f"its linear layers are: {', '.join(layer_suffixes(linear_layer_names(model)))}",
            hint="list some of these names (e.g. q_proj and v_proj) or use all-linear",
        )
    head = output_layer_name(model)
    if head in names and getattr(model.config.get_text_config(), "tie_word_embeddings", False):
        raise PosttrainError(
            f"{field}.target_modules={lora.target_modules} adapts the LM head ({head}) of {model_dir}, which is "
            "tied to the input embedding: the adapted head would untie them",
            hint=f"leave {head.rsplit('.', 1)[-1]} out of target_modules",
        )
    return names


def check_lora_targets(lora: LoraConfig, model_dir: str | Path) -> None:
    """`check_targets` on the model built from its config.json on the meta device: no weights are read, so the
    driver can refuse bad targets before any actor starts."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(model_dir))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    check_targets(lora, model, model_dir)


def apply_lora(model, lora: LoraConfig, model_dir: str | Path):
    """Puts adapters on `model` (an HF causal LM, modified in place: its targets become peft LoRA layers) and
    returns the PeftModel around it. Only the adapters require grad. B starts at zero, so the adapted model equals
    the base model until the first update."""
    return _peft_wrap(model, lora, check_targets(lora, model, model_dir), "CAUSAL_LM")


def _peft_wrap(model, lora: AdapterConfig, names: list[str], task_type: str):
    """peft's adapters on `model` for `lora`, checked to land on exactly the layers `names` (our matching rule)."""
    import peft

    config = peft.LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, bias="none",
                             target_modules=lora.target_modules, task_type=task_type)
    wrapped = peft.get_peft_model(model, config)
    got = list(adapted_layers(wrapped))
    if got != names:  # our rule and peft's disagree: a bug, not a user error
        raise RuntimeError(f"peft adapted {got}, expected {names}")
    return wrapped


def adapted_layers(peft_model) -> dict:
    """HF module name -> its peft LoRA layer (names as in the base model, e.g. model.layers.0.self_attn.q_proj)."""
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in peft_model.get_base_model().named_modules() if isinstance(m, LoraLayer)}


def merged_adapted_weights(peft_model) -> dict:
    """{"<layer>.weight": W + scale·B@A} for the adapted layers only (HF names, CPU, contiguous, the base dtype):
    what changed since the base model. The model is not modified."""
    import torch

    out = {}
    with torch.no_grad():
        for name, layer in adapted_layers(peft_model).items():
            base = layer.get_base_layer().weight
            a, b = layer.lora_A[ADAPTER_NAME].weight, layer.lora_B[ADAPTER_NAME].weight
            if layer.fan_in_fan_out:  # Conv1D (GPT-2) stores W as [in, out]: add (B A)^T = A^T B^T
                a, b = b.T, a.T
            # one fused W + scale·(B A) (peft's get_delta_weight builds B A, then its scaled copy, then the sum: the
            # whole export took 0.16-0.31 s that way against 0.13-0.21 s, 80m shape, all-linear, 1 thread; same
            # bits in tests/test_lora.py); in the adapters' dtype (float32 under a bf16 base), then the base's
            merged = torch.addmm(base.to(a.dtype), b, a, alpha=layer.scaling[ADAPTER_NAME])
            out[f"{name}.weight"] = merged.to(device="cpu", dtype=base.dtype).contiguous()
    return out


def sync_weights_of_adapted(peft_model) -> dict:
    """What the engines need after a step: `merged_adapted_weights`, plus the unchanged base weights of the layers
    packed with an adapted one (k_proj and v_proj beside an adapted q_proj; see PACKED_SIBLINGS)."""
    import torch

    out = merged_adapted_weights(peft_model)
    modules = dict(peft_model.get_base_model().named_modules())
    with torch.no_grad():
        for name in list(out):
            parent, leaf, _ = name.rsplit(".", 2)
            for group in (g for g in PACKED_SIBLINGS if leaf in g):
                for sibling in group:
                    key = f"{parent}.{sibling}.weight"
                    if key not in out and f"{parent}.{sibling}" in modules:
                        out[key] = modules[f"{parent}.{sibling}"].weight.detach().to("cpu").contiguous()
    return out


def adapter_payload(peft_model) -> dict:
    """What the engines need after a step with model.lora.sync=adapter: the adapters themselves, in peft's format
    (tensor names as in adapter_model.safetensors, e.g. base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight,
    and adapter_config.json's text under ADAPTER_CONFIG_KEY), as an array payload (models/weights.py). r·(in+out)
    numbers per adapted layer instead of the merged layers' in·out; rollout/lora_serving.py serves it."""
    import peft
    import torch

    from posttrain.models.weights import ADAPTER_CONFIG_KEY, arrays_from_tensors

    with torch.no_grad():
        state = peft.get_peft_model_state_dict(peft_model, adapter_name=ADAPTER_NAME)
        tensors = {name: t.detach().to("cpu").contiguous() for name, t in state.items()}
    config = peft_model.peft_config[ADAPTER_NAME].to_dict()
    config = {k: sorted(v) if isinstance(v, set) else v for k, v in config.items()}  # as peft's save_pretrained
    return {**arrays_from_tensors(tensors), ADAPTER_CONFIG_KEY: json.dumps(config, default=str)}


def merged_state_dict(peft_model) -> dict:
    """The whole adapted model as an HF state dict of the base architecture (adapted layers merged, the rest the
    base model's own Parameters, so ties stay visible by identity)."""
    merged = merged_adapted_weights(peft_model)
    out = {}
    for name, t in peft_model.get_base_model().state_dict(keep_vars=True).items():
        if ".lora_" in name:
            continue
        hf_name = name.replace(".base_layer.", ".")
        out[hf_name] = merged.get(hf_name, t)
    return out


def save_merged_model(peft_model, tokenizer, out_dir: str | Path) -> Path:
    """Writes the adapted model merged as a plain HF directory (model.safetensors, config, generation config,
    tokenizer) that transformers and vLLM load without peft."""
    from safetensors.torch import save_file

    from posttrain.models.weights import unique_tensors

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    base = peft_model.get_base_model()
    save_file(unique_tensors(base, merged_state_dict(peft_model)), str(out / "model.safetensors"),
              metadata={"format": "pt"})
    base.config.save_pretrained(str(out))
    if getattr(base, "generation_config", None) is not None:
        base.generation_config.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


def save_adapter(peft_model, out_dir: str | Path, base_record: dict) -> Path:
    """peft's own format (loadable with `PeftModel.from_pretrained(base, out_dir)`), plus BASE_RECORD: which base
    model the adapter belongs to ({"model_path", "model_hash"})."""
    out = Path(out_dir)
    peft_model.save_pretrained(str(out), safe_serialization=True)
    (out / BASE_RECORD).write_text(json.dumps(base_record, indent=1) + "\n")
    return out


def load_adapter(peft_model, adapter_dir: str | Path) -> None:
    """Restores the adapter weights saved by `save_adapter` into `peft_model` (exactly: the saved tensors are
    copied into the adapter parameters)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    state = load_file(str(Path(adapter_dir) / "adapter_model.safetensors"))
    result = set_peft_model_state_dict(peft_model, state, adapter_name=ADAPTER_NAME)
    missing = [k for k in result.missing_keys if ".lora_" in k]
    if result.unexpected_keys or missing:
        raise RuntimeError(f"adapter {adapter_dir} does not match the policy's adapters: missing {missing[:5]}, "
                           f"unexpected {list(result.unexpected_keys)[:5]}")


def read_base_record(ckpt_dir: str | Path) -> dict | None:
    """The base model a checkpoint's adapter was trained on, or None for a full-weight checkpoint."""
    path = Path(ckpt_dir) / ADAPTER_DIR / BASE_RECORD
    return json.loads(path.read_text()) if path.is_file() else None


def check_resume_kind(lora: LoraConfig | None, model_path: str | Path, ckpt_dir: str | Path) -> None:
    """--resume refuses a checkpoint of the other kind (full weights with model.lora set, an adapter without it) and
    an adapter whose base model is not the one at model.path (its recorded content hash differs)."""
    record = read_base_record(ckpt_dir)
    if lora is not None and record is None:
        raise PosttrainError(
            f"--resume: the checkpoint {ckpt_dir} holds full weights (a run without model.lora), but the config sets "
            "model.lora",
            hint="resume without model.lora, or start a new run (name=<new name>) with model.path=<checkpoint>/model "
                 "and model.lora",
        )
    if lora is None and record is not None:
        raise PosttrainError(
            f"--resume: the checkpoint {ckpt_dir} holds a LoRA adapter, but the config has no model.lora",
            hint="resume with the run's own config (runs/<name>/config.yaml), which has model.lora",
        )
    if record is not None:
        check_adapter_base(record, model_path, ckpt_dir, "--resume")


def check_adapter_base(record: dict, model_path: str | Path, ckpt_dir: str | Path, where: str) -> None:
    """PosttrainError unless the model at `model_path` is the base the checkpoint's adapter was trained on (the
    content hash in its BASE_RECORD: weights, config and tokenizer files)."""
    from posttrain.models.loading import model_content_hash
    from posttrain.models.loading import check_model_dir

    check_model_dir(model_path)
    if model_content_hash(model_path) != record["model_hash"]:
        raise PosttrainError(
            f"{where}: the adapter in {ckpt_dir} was trained on the base model {record['model_path']}, but "
            f"model.path {model_path} holds different weights (content sha256 differs)",
            hint="point model.path at the base model the run started from",
        )


def apply_lora_reward_model(model, lora: AdapterConfig, model_dir: str | Path, field: str = "rm.lora"):
    """`apply_lora` for a reward model (an HF sequence-classification model: the causal LM's body under a 1-output
    `score` head): adapters on the body's target layers, and the head trained whole, since it starts random (peft's
    SEQ_CLS task copies it into modules_to_save and leaves it out of all-linear). Returns the PeftModel; after
    training, `merge_and_unload()` gives the plain HF model with the adapters merged and the trained head."""
    body = model.base_model  # the LM without its head: all-linear must not take the score head
    names = [f"{model.base_model_prefix}.{n}" for n in check_targets(lora, body, model_dir, field)]
    head = next(n for n in ("score", "classifier") if getattr(model, n, None) is not None)  # peft's head names
    if isinstance(lora.target_modules, list) and head in lora.target_modules:
        raise PosttrainError(f"{field}.target_modules={lora.target_modules} names the reward head ({head}), which is "
                             "trained whole", hint=f"leave {head} out of {field}.target_modules")
    return _peft_wrap(model, lora, names, "SEQ_CLS")
