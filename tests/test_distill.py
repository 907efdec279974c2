"""On-policy distillation (algorithms/distill.py, algorithm.name=opd): the per-token reverse-KL advantage against
numbers worked out by hand, the config's rules for the distill section, and the teacher's tokenizer check."""

import hashlib
import json

import pytest
import torch
from numerics_bounds import f64

from posttrain.algorithms.advantages import compute_advantages
from posttrain.algorithms.distill import distill_advantages, mean_reverse_kl, reverse_kl_advantages
from posttrain.config import load_config
from posttrain.errors import PosttrainError


def _cfg(*overrides):
    return load_config(None, ["algorithm.name=opd", "distill.teacher=/teacher", *overrides])


def test_reverse_kl_advantage_by_hand():
    # student (behaviour) logprobs and teacher logprobs on the sampled tokens; seq 1's last token is padding
    student = f64([[-1.0, -2.0, -0.5], [-3.0, -0.1, -9.0]])
    teacher = f64([[-0.5, -2.5, -0.5], [-1.0, -0.3, 0.0]])
    mask = f64([[1, 1, 1], [1, 1, 0]])
    # A_t = teacher - student: [0.5, -0.5, 0], [2.0, -0.2, 0 (masked)]; coef 2 doubles each, no discounting
    assert torch.allclose(reverse_kl_advantages(student, teacher, mask), f64([[0.5, -0.5, 0.0], [2.0, -0.2, 0.0]]))
    assert torch.allclose(reverse_kl_advantages(student, teacher, mask, 2.0), f64([[1.0, -1.0, 0.0], [4.0, -0.4, 0.0]]))
    # mean reverse KL = mean(student - teacher) over the 5 tokens = (-0.5 + 0.5 + 0 - 2.0 + 0.2) / 5 = -0.36
    assert mean_reverse_kl(student, teacher, mask) == pytest.approx(-0.36)


def test_reward_mix_adds_the_group_advantage_on_every_token():
    student = f64([[-1.0, -1.0], [-1.0, -1.0]])
    teacher = f64([[-1.0, -0.5], [-2.0, -1.0]])
    mask = f64([[1, 1], [1, 0]])
    rewards = f64([1.0, 0.0])
    # one group of 2: GRPO advantages (r - mean) / std, std (unbiased) of {1, 0} = 0.7071 -> +0.7071, -0.7071
    g = 0.5 / 0.5 ** 0.5
    adv = distill_advantages(rewards, mask, student, teacher, coef=1.0, reward_coef=0.5, group_size=2)
    # seq 0: KL part [0, 0.5] + 0.5 * g ; seq 1: KL part [-1, 0 masked] - 0.5 * g on the sampled token only
    expected = f64([[0.5 * g, 0.5 + 0.5 * g], [-1.0 - 0.5 * g, 0.0]])
    assert torch.allclose(adv, expected, atol=1e-5)
    # reward_coef 0: the reward plays no part
    pure = distill_advantages(rewards, mask, student, teacher, coef=1.0, reward_coef=0.0, group_size=2)
    assert torch.allclose(pure, f64([[0.0, 0.5], [-1.0, 0.0]]))


def test_compute_advantages_dispatches_opd():
    cfg = _cfg("algorithm.group_size=2", "distill.coef=2")
    assert cfg.algorithm.kl_coef == 0 and cfg.algorithm.skip_zero_variance_groups is False  # the preset
    student, teacher, mask = f64([[-1.0, -2.0]]), f64([[-0.5, -2.0]]), f64([[1, 1]])
    out = compute_advantages(cfg.algorithm, f64([1.0]), mask=mask, logprobs=student, teacher_logprobs=teacher,
                             distill=cfg.distill)
    assert torch.allclose(out.advantages, f64([[1.0, 0.0]])) and out.returns is None
    with pytest.raises(ValueError, match="teacher"):
        compute_advantages(cfg.algorithm, f64([1.0]), mask=mask, logprobs=student)


@pytest.mark.parametrize("overrides, match", [
    (["algorithm.name=opd"], "needs distill.teacher"),
    (["distill.teacher=/t"], "only opd uses a teacher"),
    (["algorithm.name=opd", "distill.teacher=/t", "algorithm.group_size=1", "distill.reward_coef=1"],
     "group_size"),
])
def test_distill_config_rules(overrides, match):
    with pytest.raises(PosttrainError, match=match):
        load_config(None, overrides)


def test_a_resume_refuses_another_teacher_and_other_runs_keep_their_fingerprint():
    # opd: the teacher and the coefficients are part of what a resume must not change
    assert _cfg().fingerprint() != _cfg("distill.teacher=/another").fingerprint()
    assert _cfg().fingerprint() != _cfg("distill.coef=2").fingerprint()
    # any other algorithm: the (unused, default) distill section is not hashed, so checkpoints written before the
    # section existed still resume; a hash over the four historical keys alone gives the same value
    grpo = load_config(None, ["algorithm.name=grpo"])
    d = grpo.to_dict()
    four = {k: d[k] for k in ("model", "task", "algorithm", "seed")}
    assert grpo.fingerprint() == hashlib.sha256(json.dumps(four, sort_keys=True).encode()).hexdigest()[:16]


# ------------------------------------------------------------------ the teacher's tokenizer


def test_same_tokenizer_passes_and_a_swapped_id_is_named(tmp_path, tiny_model_dir):
    import json
    import shutil

    from posttrain.models.loading import load_tokenizer
    from posttrain.models.tokenizer_match import check_teacher, first_tokenizer_difference

    student = load_tokenizer(tiny_model_dir)
    bad = tmp_path / "teacher"
    shutil.copytree(tiny_model_dir, bad)
    check_teacher(tiny_model_dir, student, bad)  # a copy (other weights would not matter): passes
    tok = json.loads((bad / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    vocab["7"], vocab["8"] = vocab["8"], vocab["7"]
    (bad / "tokenizer.json").write_text(json.dumps(tok))
    diff = first_tokenizer_difference(student, load_tokenizer(bad))
    assert diff == f"token '7' is id {vocab['8']} in the student, {vocab['7']} in the teacher"
    with pytest.raises(PosttrainError, match="distill.teacher: the tokenizer in .* differs from the student's") as e:
        check_teacher(tiny_model_dir, student, bad)
    assert tiny_model_dir in str(e.value) and "token '7'" in str(e.value)


# ------------------------------------------------------------------ learning: the student moves toward the teacher

OPD_STEPS, OPD_K, OPD_Z_MIN = 24, 5, 4.0


def opd_run(student: str, teacher: str, runs_dir: str) -> list[dict]:
    """A short opd run (hf engine, real Ray), its metrics per step."""
    from posttrain.config import load_config
    from posttrain.loop import train
    from posttrain.tracking import read_metrics

    cfg = load_config(None, [
        "name=opd", f"runs_dir={runs_dir}", f"model.path={student}", "algorithm.name=opd", f"distill.teacher={teacher}",
        "algorithm.prompts_per_step=24", "algorithm.group_size=4", "algorithm.lr=1e-3", "algorithm.lr_schedule=constant",
        f"train.steps={OPD_STEPS}", "rollout.engine=hf", "task.train_size=2000", "task.heldout_size=50",
        "eval.every=0", "checkpoint.every=0", "logging.progress=false", "ray.num_cpus=4",
    ])
    train(cfg, progress=False)
    return read_metrics(cfg.run_dir)


@pytest.mark.integration
def test_opd_lowers_the_reverse_kl_to_the_teacher(tiny_model_dir, warm_model_dir, tmp_path):
    """Student = the random tiny model, teacher = the same model SFT-warmed on addition (same tokenizer): the mean
    per-token reverse KL on the student's own samples falls over the run (window z-test, as the algorithm runs)."""
    from test_algorithm_runs import learning_z

    from posttrain.config import RayConfig
    from posttrain.orchestration.runtime import start_ray, stop_ray

    start_ray(RayConfig(num_cpus=4), 4)
    try:
        metrics = opd_run(tiny_model_dir, warm_model_dir, str(tmp_path))
    finally:
        stop_ray()
    kl = [m["distill/reverse_kl"] for m in metrics if "distill/reverse_kl" in m]  # the step records
    assert len(kl) == OPD_STEPS
    fall, z = learning_z([-x for x in kl], OPD_K)  # 5- or 3-step windows, as the algorithm runs
    print(f"reverse KL per step {[round(x, 3) for x in kl]}: fall {fall:+.3f}, z {z:.2f}")
    assert z > OPD_Z_MIN and fall > 0, f"reverse KL did not fall: {[round(x, 3) for x in kl]} (z {z:.2f})"


def test_the_plan_holds_the_teacher_like_a_reference_of_its_own_shape():
    from posttrain.topology import memory as M
    from posttrain.topology.devices import parse_cluster
    from posttrain.topology.flops import Workload
    from posttrain.topology.model_shape import shape_from_config
    from posttrain.topology.plan import PlanInputs, colocated

    llama_7b = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                    intermediate_size=11008, vocab_size=32000, tie_word_embeddings=False, model_type="llama")
    teacher = shape_from_config(dict(llama_7b, num_key_value_heads=8, intermediate_size=14336))  # another shape
    base = dict(cluster=parse_cluster("8xH100-80GB"), policy=shape_from_config(llama_7b), reference=False,
                workload=Workload(sequences=64, prompt_tokens=512, completion_tokens=512, micro_batch=1),
                dtype="bfloat16", checkpointing=True)
    without, with_teacher = colocated(PlanInputs(**base)), colocated(PlanInputs(**base, teacher=teacher))
    assert "teacher" in with_teacher.devices and with_teacher.memory["teacher"]["phase"] == "reference"
    # resident on each of the 8 devices: the teacher's bf16 weights / 8; the engine's working set stays the largest
    assert with_teacher.peak_bytes_per_device - without.peak_bytes_per_device == pytest.approx(
        M.weight_bytes(teacher, "bfloat16") / 8)
    # its forward over 64 * 1024 scored tokens, 2 N_teacher FLOPs per token, at 30% of 8 x 989 TFLOP/s
    assert with_teacher.phase_seconds["reference"] == pytest.approx(
        2 * teacher.params * 65_536 / (8 * 989e12 * 0.30))
