"""model.dtype: auto | float32 | bfloat16 (models/dtype.py, machine.has_native_bf16). Native-bfloat16 detection on
hand-written /proc/cpuinfo flag lines; auto's meaning on CPU and GPU; bfloat16 refused on a CPU without it, through
the real CLI (the flags reader swapped in-process: no product hook fakes a CPU) as one message, exit 2, before Ray;
and bfloat16 reaching the trainer (one real step on a tiny model), the reference, the hf engine (weights synced
from the trainer) and the dtype handed to vLLM; the planner resolving auto for the cluster's devices. No Ray."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from posttrain import machine
from posttrain.cli import app
from posttrain.config import load_config
from posttrain.errors import PosttrainError
from posttrain.models import dtype as D
from test_bad_inputs import BF16_REFUSAL

# Flag lines cut from real /proc/cpuinfo files (the parts that matter, in their order).
SAPPHIRE_RAPIDS = "fpu vme sse2 avx2 avx512f avx512bw avx512_vnni avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8"
COOPER_LAKE = "fpu sse2 avx2 avx512f avx512_vnni avx512_bf16"
ZEN4 = "fpu sse2 avx2 avx512f avx512_bf16 avx512vbmi2 avx512_vnni"
SPR_VM_NO_AMX = "fpu sse2 avx2 avx512f avx512_vnni avx512_bf16 avx512_fp16"  # a VM that hides AMX (this CI box)
CASCADE_LAKE = "fpu vme sse2 avx2 avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni"
ZEN3 = "fpu sse2 avx2 fma bmi2 sha_ni vaes"
GRAVITON3 = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm sve svebf16 i8mm bf16"
GRAVITON2 = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp"


@pytest.mark.parametrize("flags,native", [
    (SAPPHIRE_RAPIDS, True), (COOPER_LAKE, True), (ZEN4, True), (SPR_VM_NO_AMX, True), (GRAVITON3, True),
    ("amx_bf16", True),
    (CASCADE_LAKE, False), (ZEN3, False), (GRAVITON2, False), ("", False),
    ("avx512_fp16 avx512bf16x svebf16", False),  # whole flags only: look-alikes are not bf16
])
def test_native_bf16_is_read_from_the_flags_line(flags, native):
    assert machine.has_native_bf16(flags) is native


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="reads /proc/cpuinfo")
def test_this_machines_flags_are_read():
    flags = machine.cpu_flags()
    assert flags and " " in flags
    assert machine.describe_machine()["native_bf16"] is machine.has_native_bf16(flags)


def test_the_cpu_is_named_with_its_family_and_model_which_a_vms_generic_name_hides():
    cpuinfo = ["processor\t: 0", "vendor_id\t: GenuineIntel", "cpu family\t: 6", "model\t\t: 207",
               "model name\t: Intel(R) Xeon(R) Processor", "processor\t: 1", "model\t\t: 1"]
    assert machine.describe_cpuinfo(cpuinfo) == "Intel(R) Xeon(R) Processor (family 6 model 207)"
    assert machine.describe_cpuinfo(["model name\t: AMD EPYC"]) == "AMD EPYC"
    assert machine.describe_cpuinfo(["processor\t: 0"]) is None


def test_auto_is_bfloat16_on_a_gpu_and_float32_on_cpu_and_the_rest_are_themselves():
    assert D.resolve_dtype("auto", cuda=True) == "bfloat16"
    assert D.resolve_dtype("auto", cuda=False) == "float32"
    for name in ("float32", "bfloat16", "float16", "float64"):
        assert D.resolve_dtype(name, cuda=False) == D.resolve_dtype(name, cuda=True) == name


def test_bfloat16_on_a_cpu_without_it_is_refused_naming_the_field_the_cpu_and_what_to_do(monkeypatch):
    monkeypatch.setattr(D, "cpu_model", lambda: "Intel(R) Xeon(R) CPU E5-2686 v4 @ 2.30GHz")
    with pytest.raises(PosttrainError) as e:
        D.weights_dtype("bfloat16", flags=CASCADE_LAKE)
    text = str(e.value)
    assert "model.dtype=bfloat16" in text and "E5-2686 v4" in text and "set model.dtype=float32" in text
    assert D.weights_dtype("bfloat16", flags=SAPPHIRE_RAPIDS) == "bfloat16"
    assert D.weights_dtype("bfloat16", cuda=True, flags="") == "bfloat16"  # a GPU engine: the CPU does not matter
    assert D.weights_dtype("auto", flags=CASCADE_LAKE) == "float32"
    assert D.weights_dtype("float32", flags="") == "float32"


def test_the_config_takes_auto_and_names_the_choices_for_a_typo():
    assert load_config(None, ["model.dtype=auto"]).model.dtype == "auto"
    assert load_config(None, []).model.dtype == "float32"  # the default: what CPU results were measured in
    with pytest.raises(PosttrainError, match=r"model.dtype: got 'bf16'.*'auto'"):
        load_config(None, ["model.dtype=bf16"])


def _train_args(tmp: Path, model: str, *extra: str) -> list[str]:
    cfg = tmp / "run.yaml"
    cfg.write_text(yaml.safe_dump({"name": "bad", "runs_dir": str(tmp / "runs"), "model": {"path": model}}))
    return ["train", str(cfg), "task.train_size=200", "task.heldout_size=20", "logging.progress=false", *extra]


def test_cli_refuses_bfloat16_on_a_cpu_without_it_before_ray(tmp_path, tiny_model_dir, monkeypatch):
    """The CPU is faked by swapping the flags reader in this process; the CLI path is the real one. Ray never
    starts (ray.init would be the next thing) and nothing is written."""
    monkeypatch.setattr(D, "cpu_flags", lambda: CASCADE_LAKE)
    monkeypatch.setattr(D, "cpu_model", lambda: "Intel(R) Xeon(R) CPU E5-2686 v4 @ 2.30GHz")
    result = CliRunner().invoke(app, _train_args(tmp_path, tiny_model_dir, "model.dtype=bfloat16"))
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), text
    assert text.count("error:") == 1 and "Traceback" not in text
    assert text == "error: " + BF16_REFUSAL  # docs/errors.md's row
    assert not (tmp_path / "runs").exists()
    assert "ray" not in sys.modules or not __import__("ray").is_initialized()


# ---------------------------------------------------------------- bfloat16 reaches every role (on a native-bf16 CPU)

needs_bf16 = pytest.mark.skipif(not machine.has_native_bf16(machine.cpu_flags()),
                                reason="this CPU has no native bfloat16: model.dtype=bfloat16 is refused here")
PROMPTS = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16], [17, 18]]
COMPLETIONS = [[20, 21, 22, 23], [24, 25], [26, 27, 28], [29, 30, 31, 32, 33]]


def _cfg(model_dir: str, *extra: str) -> dict:
    return load_config(None, [f"model.path={model_dir}", "topology.torch_threads=1", "algorithm.kl_coef=0.05",
                              "algorithm.group_size=2", "algorithm.prompts_per_step=2", "algorithm.lr=0.01",
                              "rollout.engine=hf", *extra]).to_dict()


@needs_bf16
def test_a_bfloat16_trainer_holds_bfloat16_weights_takes_a_step_and_syncs_a_bfloat16_engine(tiny_model_dir):
    from posttrain.rollout.engine import SamplingSpec
    from posttrain.rollout.hf_engine import HfEngine
    from posttrain.training.reference import ReferenceModel
    from posttrain.training.trainer import TrainBatch, Trainer

    cfg = _cfg(tiny_model_dir, "model.dtype=bfloat16")
    trainer, reference = Trainer(cfg, tiny_model_dir), ReferenceModel(cfg, tiny_model_dir)
    engine = HfEngine(tiny_model_dir, dtype="bfloat16")
    for model in (trainer.model, reference.model, engine.model):
        assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    ref = reference.logprobs(PROMPTS, COMPLETIONS)
    assert all(lp < 0 for row in ref for lp in row)
    metrics = trainer.train_step(TrainBatch(prompts=PROMPTS, completions=COMPLETIONS, advantages=[1.0, -1.0, 0.5, -0.5],
                                            engine_logprobs=[[-3.0] * len(c) for c in COMPLETIONS],
                                            ref_logprobs=ref))
    assert all(v == v for v in metrics.values() if isinstance(v, float)), metrics  # no NaN
    assert {p.dtype for p in trainer.model.parameters()} == {torch.bfloat16}
    assert any(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())  # lr 0.01 moves bf16
    engine.update_weights(trainer.export_arrays())
    synced = dict(engine.model.named_parameters())
    assert all(torch.equal(p, synced[n]) for n, p in trainer.model.named_parameters())
    out = engine.generate([PROMPTS[0]], SamplingSpec(n=2, max_new_tokens=4), seeds=[1])
    assert len(out[0]) == 2


def test_auto_loads_float32_on_cpu(tiny_model_dir):
    from posttrain.training.reference import ReferenceModel

    reference = ReferenceModel(_cfg(tiny_model_dir, "model.dtype=auto"), tiny_model_dir)
    assert {p.dtype for p in reference.model.parameters()} == {torch.float32}


@pytest.mark.integration
def test_vllm_is_handed_the_resolved_dtype_never_its_own_auto(tiny_model_dir):
    """vLLM's own dtype=auto would pick a half type for a float32 checkpoint, unlike the trainer: posttrain's auto
    reaches the real engine as float32 on this CPU."""
    pytest.importorskip("vllm")
    from posttrain.rollout.vllm_engine import VllmEngine

    engine = VllmEngine(tiny_model_dir, dtype="auto", max_model_len=128, kv_cache_gb=1)
    assert engine.llm.llm_engine.model_config.dtype == torch.float32


@pytest.mark.parametrize("cluster,planned", [("1x8xH100-80GB", "bfloat16"), ("1x2xCPU-8GB", "float32")])
def test_the_planner_sizes_auto_for_the_clusters_devices_not_this_machine(cluster, planned, tiny_model_dir):
    """`posttrain plan` may run on a laptop for a GPU cluster: auto is resolved for the cluster, and no CPU check."""
    from posttrain.topology.from_config import plan_inputs

    cfg = load_config(None, [f"model.path={tiny_model_dir}", "model.dtype=auto"])
    assert plan_inputs(cfg, cluster=cluster).dtype == planned
