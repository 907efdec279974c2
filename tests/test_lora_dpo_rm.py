"""LoRA for offline DPO (model.lora) and for reward-model training (rm.lora): only the adapters (and the reward head)
train, the base weights stay bit-exact, DPO's reference is the policy with its adapters off (equal to a separate
frozen base model), the outputs are plain HF directories (merged) plus peft adapters that rebuild them, and bad
targets are one user error, exit 2. Real tiny models, no Ray."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from posttrain.config import load_config
from posttrain.models.loading import PromptEncoder, load_causal_lm
from posttrain.rewards.preferences import gold_pairs, write_jsonl
from posttrain.tasks import load_task
from posttrain.training import dpo as D
from numerics_bounds import FLOAT64, assert_same, lora_merge_bounds

ADAPTED = ("q_proj", "v_proj")
# 2 ranks vs 1 sum in other orders: those runs are in float64, where they agree to F64_TOL (tests/numerics_bounds.py)


@pytest.fixture(autouse=True)
def one_thread():
    """The tests that drive the models in-process use one intra-op thread, as the configs' topology.torch_threads=1
    (on a shared machine more threads than free cores only slow every process down)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _pairs_file(tmp_path, n: int = 16) -> str:
    task = load_task(load_config(None, ["task.train_size=200", "task.heldout_size=10"]).task, 0)
    return str(D.write_pairs(D.pairs_from_task(task.train, n, seed=0), tmp_path / "pairs.jsonl"))


def _dpo_cfg(tmp_path, model_dir: str, *extra: str):
    return load_config(None, [
        "algorithm.name=dpo", f"model.path={model_dir}", f"dpo.pairs={_pairs_file(tmp_path)}", f"runs_dir={tmp_path}",
        "name=dpo-lora", "topology.torch_threads=1", "task.train_size=200", "task.heldout_size=10",
        "model.lora.r=8", "model.lora.alpha=16", f"model.lora.target_modules=[{', '.join(ADAPTED)}]",
        "algorithm.lr=0.01", "dpo.batch_size=16", *extra])


def _merges_agree(rebuilt: dict, saved: dict, bounds: dict) -> None:
    """peft's merge of the saved adapter against the run's own merge, float32: within the rounding bound of each
    adapted layer (tests/numerics_bounds.py); every other tensor is a copy, equal bit for bit."""
    assert rebuilt.keys() == saved.keys() and bounds and bounds.keys() <= saved.keys()
    for name, t in saved.items():
        over = (rebuilt[name] - t).abs() - bounds.get(name, torch.zeros_like(t))
        assert float(over.max()) <= 0, (name, float(over.max()))


def _encoded(cfg, tok):
    enc = PromptEncoder(tok, cfg.model.chat_template)
    pairs = D.read_pairs(cfg.dpo.pairs)
    return ([enc.encode(p.prompt) for p in pairs], [D.encode_completion(enc, p.chosen) for p in pairs],
            [D.encode_completion(enc, p.rejected) for p in pairs])


# ---------------------------------------------------------------- DPO


def test_dpo_lora_trains_only_adapters_and_its_reference_is_the_frozen_base(tmp_path, tiny_model_dir):
    """20 full-batch steps on 16 pairs through run_dpo's own pieces (load_policy, dpo_reference_logprobs, dpo_step):
    the loss falls from log 2 and the margin rises, every base tensor is bit-identical afterwards, and the
    reference (the trained policy with adapters off) equals a separately loaded base model within 1e-6."""
    cfg = _dpo_cfg(tmp_path, tiny_model_dir)
    torch.manual_seed(0)
    policy, tok, adapters = D.load_policy(cfg)
    base_before = {n: t.detach().clone() for n, t in adapters.get_base_model().state_dict().items()
                   if ".lora_" not in n}
    prompts, chosen, rejected = _encoded(cfg, tok)
    pad = tok.pad_token_id
    ref_c, ref_r = D.dpo_reference_logprobs(cfg, adapters, prompts, chosen, rejected, pad)
    frozen, _ = load_causal_lm(tiny_model_dir)
    frozen_c, frozen_r = (D.reference_logprobs(frozen, prompts, chosen, pad),
                          D.reference_logprobs(frozen, prompts, rejected, pad))
    assert (ref_c - frozen_c).abs().max() <= 1e-6 and (ref_r - frozen_r).abs().max() <= 1e-6

    params = [p for p in policy.parameters() if p.requires_grad]
    trained = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert trained and all(".lora_A." in n or ".lora_B." in n for n in trained)
    assert {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in trained} == set(ADAPTED)
    optimizer = torch.optim.AdamW(params, lr=cfg.algorithm.lr)
    policy.train()
    losses, margins = [], []
    for _ in range(20):
        out, _ = D.dpo_step(policy, optimizer, params, prompts, chosen, rejected, ref_c, ref_r, pad_id=pad,
                            beta=cfg.algorithm.dpo_beta, max_grad_norm=cfg.algorithm.max_grad_norm)
        losses.append(float(out.loss.detach()))
        margins.append(float(out.margin))
    print(f"\ndpo+lora: loss {losses[0]:.4f} -> {losses[-1]:.4f}, margin {margins[0]:.4f} -> {margins[-1]:.4f}")
    assert losses[0] == pytest.approx(math.log(2), abs=1e-5) and margins[0] == pytest.approx(0.0, abs=1e-5)
    assert losses[-1] < losses[0] - 0.05 and margins[-1] > 0.1

    base_after = {n: t for n, t in adapters.get_base_model().state_dict().items() if ".lora_" not in n}
    assert base_after.keys() == base_before.keys()
    assert all(torch.equal(base_after[n], base_before[n]) for n in base_before)
    policy.eval()
    after_c, after_r = D.dpo_reference_logprobs(cfg, adapters, prompts, chosen, rejected, pad)
    assert (after_c - frozen_c).abs().max() <= 1e-6 and (after_r - frozen_r).abs().max() <= 1e-6
    adapted_c = D.reference_logprobs(policy, prompts, chosen, pad)  # adapters on: the policy moved away
    assert (adapted_c - frozen_c).abs().max() > 1e-3


def test_dpo_lora_run_writes_a_merged_model_and_an_adapter_that_rebuilds_it(tmp_path, tiny_model_dir):
    """run_dpo end to end (8 steps): model/ is a plain HF directory (no peft needed), its non-adapted tensors are
    the base's bit for bit, and base + the peft adapter in runs/<name>/adapter, merged, equals it within 1e-6."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from posttrain.models.lora import ADAPTER_DIR, read_base_record
    from posttrain.tracking import read_metrics

    cfg = _dpo_cfg(tmp_path, tiny_model_dir, "train.steps=8")
    summary = D.run_dpo(cfg, log=lambda m: None)
    run_dir = tmp_path / "dpo-lora"
    assert summary["model_dir"] == str(run_dir / "model") and summary["adapter_dir"] == str(run_dir / ADAPTER_DIR)
    steps = [m for m in read_metrics(run_dir) if "rewards/margins" in m]
    assert len(steps) == 8 and steps[0]["loss"] == pytest.approx(math.log(2), abs=1e-5)
    assert steps[-1]["rewards/margins"] > steps[0]["rewards/margins"]
    assert read_base_record(run_dir)["model_path"] == tiny_model_dir
    assert (run_dir / ADAPTER_DIR / "adapter_config.json").is_file()

    merged = load_file(str(run_dir / "model" / "model.safetensors"))
    base = load_file(str(next(Path(tiny_model_dir).glob("*.safetensors"))))
    assert merged.keys() == base.keys()
    changed = {n for n in merged if not torch.equal(merged[n], base[n])}
    assert changed and all(n.rsplit(".", 2)[-2] in ADAPTED for n in changed), sorted(changed)[:5]
    plain = AutoModelForCausalLM.from_pretrained(str(run_dir / "model"))  # no peft involved
    base_model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    adapted = PeftModel.from_pretrained(base_model, str(run_dir / ADAPTER_DIR))
    bounds = lora_merge_bounds(adapted)
    _merges_agree(adapted.merge_and_unload().state_dict(), plain.state_dict(), bounds)


def test_dpo_lora_targets_naming_no_layer_exit_2(tmp_path, tiny_model_dir):
    from posttrain.cli import app

    result = CliRunner().invoke(app, ["dpo", f"model.path={tiny_model_dir}", f"dpo.pairs={_pairs_file(tmp_path)}",
                                      f"runs_dir={tmp_path}", "model.lora.target_modules=[query, value]"])
    text = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert "model.lora.target_modules=['query', 'value'] names no linear layer" in text and "Traceback" not in text


# ---------------------------------------------------------------- reward model


def _rm_cfg(tmp_path, model_dir: str, *extra: str):
    cfg = load_config(None, ["task.train_size=500", "task.heldout_size=50"])
    rows = gold_pairs(load_task(cfg.task, 0).train, "addition", 400, 0.0, 0)
    data = write_jsonl(rows, tmp_path / "pairs.jsonl")
    return load_config(None, [f"rm.data={data}", f"rm.base={model_dir}", f"rm.out={tmp_path / 'rm'}", "rm.epochs=2",
                              "rm.lr=1e-3", "rm.center_coef=0.01", "rm.heldout_fraction=0.25",
                              "topology.torch_threads=1", "rm.lora.r=8", "rm.lora.alpha=16", *extra])


def test_rm_lora_trains_adapters_and_the_head_and_saves_a_plain_reward_model(tmp_path, tiny_model_dir):
    """rm.lora on the existing RM test's clean gold pairs: the trainable set is the adapters plus the head's copy; after
    2 epochs held-out accuracy is above chance; rm.out loads with the loop's RewardModel; against the base (and the
    same seeded random head) only the adapted layers and the head changed; base + rm.out/adapter rebuilds rm.out."""
    from peft import PeftModel

    from posttrain.models.lora import ADAPTER_DIR, apply_lora_reward_model
    from posttrain.rewards.reward_model import STATS_FILE, RewardModel, load_backbone
    from posttrain.training.rm import train_reward_model

    cfg = _rm_cfg(tmp_path, tiny_model_dir)
    model, _ = load_backbone(tiny_model_dir, "rm.base")
    wrapped = apply_lora_reward_model(model, cfg.rm.lora, tiny_model_dir)
    trained = [n for n, p in wrapped.named_parameters() if p.requires_grad]
    assert [n for n in trained if ".lora_" not in n] == ["base_model.model.score.modules_to_save.default.weight"]
    assert len(trained) == 1 + 2 * 4 * 7  # all-linear: 7 layers in each of 4 blocks, A and B, plus the head

    result = train_reward_model(cfg)
    print(f"\nrm+lora: held-out accuracy {[h['heldout_accuracy'] for h in result.history]}, "
          f"margin {result.heldout_margin:.3f}, {result.wall_seconds:.1f} s")
    assert result.heldout_accuracy > 0.55, result.history
    stats = json.loads((tmp_path / "rm" / STATS_FILE).read_text())
    assert stats["heldout_accuracy"] == result.heldout_accuracy and stats["rm"]["lora"]["r"] == 8
    rm = RewardModel(str(tmp_path / "rm"))  # the loop's loader, no peft
    raw = rm.raw_scores([("12+34=", "46"), ("12+34=", "xyz")])
    assert all(math.isfinite(x) for x in raw)

    saved = load_file(str(tmp_path / "rm" / "model.safetensors"))
    torch.manual_seed(cfg.seed)  # the trainer's seed: the same random head it started from
    start, _ = load_backbone(tiny_model_dir, "rm.base")
    start = start.state_dict()
    assert saved.keys() == start.keys()
    changed = {n for n in saved if not torch.equal(saved[n], start[n])}
    linear = {n for n in start if n.endswith("_proj.weight")}
    assert changed == linear | {"score.weight"}, sorted(changed ^ (linear | {"score.weight"}))[:5]

    fresh, _ = load_backbone(tiny_model_dir, "rm.base")
    adapted = PeftModel.from_pretrained(fresh, str(tmp_path / "rm" / ADAPTER_DIR))
    bounds = lora_merge_bounds(adapted)
    _merges_agree(adapted.merge_and_unload().state_dict(), saved, bounds)


def test_rm_lora_bad_targets_are_the_policy_error_under_rm_lora_exit_2(tmp_path, tiny_model_dir):
    from posttrain.cli import app

    cfg = _rm_cfg(tmp_path, tiny_model_dir)
    base = ["rm", "train", f"rm.data={cfg.rm.data}", f"rm.base={tiny_model_dir}", f"rm.out={tmp_path / 'rm'}"]
    for targets, message in (("[query, value]", "rm.lora.target_modules=['query', 'value'] names no linear layer of "
                                                "the model"),
                             ("[q_proj, score]", "rm.lora.target_modules=['q_proj', 'score'] names the reward head")):
        result = CliRunner().invoke(app, [*base, f"rm.lora.target_modules={targets}"])
        text = " ".join(result.output.split())
        assert result.exit_code == 2, result.output
        assert message in text and "Traceback" not in text, text
    assert not (tmp_path / "rm").exists()


# ---------------------------------------------------------------- the sharded trainer (topology.trainer_ranks=2)


def _ranks_cfg(model_dir: str):
    # as tests/test_scaleout.py: 6 samples, 2 minibatches of 3 (split 2 + 1 between the ranks), 2 passes, a KL term
    return load_config(None, [f"model.path={model_dir}", "algorithm.group_size=2", "algorithm.prompts_per_step=3",
                              "algorithm.minibatches=2", "algorithm.updates_per_batch=2", "algorithm.lr=1e-2",
                              "algorithm.kl_coef=0.05", "train.steps=4", "topology.torch_threads=1",
                              "topology.trainer_ranks=2", "model.lora.r=4", "model.lora.alpha=8", *FLOAT64])


def _ranks_batches():
    import random

    from posttrain.training.trainer import TrainBatch

    rng = random.Random(0)
    out = []
    for step in range(4):
        prompts = [[rng.randrange(3, 40) for _ in range(rng.randrange(3, 7))] for _ in range(6)]
        comps = [[rng.randrange(3, 40) for _ in range(rng.randrange(1, 6))] for _ in range(6)]
        out.append(TrainBatch(prompts=prompts, completions=comps, advantages=[rng.uniform(-1, 1) for _ in comps],
                              engine_logprobs=[[-3.5] * len(c) for c in comps],
                              ref_logprobs=[[rng.uniform(-4, -3) for _ in c] for c in comps], step=step))
    return out


def _rank_main(rank: int, cfg_dict: dict, model_dir: str, port: int, out_dir: str) -> None:
    """One rank in its own process (what a Ray actor of TrainerGroup runs): 3 steps, a checkpoint, its results."""
    from posttrain.training.distributed import ShardedTrainer

    t = ShardedTrainer(cfg_dict, model_dir, rank, 2)
    t.join("127.0.0.1", port)
    batches = _ranks_batches()
    metrics = [t.train_step(b) for b in batches[:3]]
    ref = t.reference_logprobs(batches[0].prompts, batches[0].completions)
    weights = t.export_weights()
    t.save(f"{out_dir}/ckpt")
    adapters = {n: p.detach().clone() for n, p in t.model.named_parameters() if p.requires_grad}
    torch.save({"metrics": metrics, "ref": ref, "weights": weights, "adapters": adapters}, f"{out_dir}/rank{rank}.pt")
    t.leave()


def test_lora_on_two_ranks_takes_the_steps_of_one_and_shares_its_checkpoint(tmp_path, tiny_model_dir):
    """topology.trainer_ranks=2 with model.lora (replicated base, all-reduced adapter gradients), two real processes
    in a gloo group, in float64: 3 steps give the single Trainer's losses, grad norms and exported weights within
    F64_TOL (tests/numerics_bounds.py), the two ranks' adapters are bit-identical, only rank 0 answers
    reference_logprobs/export (the same as the single Trainer's), and the checkpoint is the single Trainer's format:
    a fresh single Trainer resumes it and takes step 4 like the uninterrupted one."""
    import multiprocessing as mp

    from safetensors.torch import load as load_bytes

    from posttrain.training.distributed import free_port
    from posttrain.training.trainer import Trainer

    cfg = _ranks_cfg(tiny_model_dir)
    port, ctx = free_port(), mp.get_context("spawn")
    procs = [ctx.Process(target=_rank_main, args=(r, cfg.to_dict(), tiny_model_dir, port, str(tmp_path)))
             for r in range(2)]
    for p in procs:
        p.start()
    batches = _ranks_batches()
    single = Trainer(cfg.to_dict(), tiny_model_dir)
    one = [single.train_step(b) for b in batches[:3]]
    for p in procs:
        p.join(timeout=300)
    assert [p.exitcode for p in procs] == [0, 0]
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2))
    for m1, m2 in zip(one, r0["metrics"]):
        assert m2["trainer_ranks"] == 2
        for key in ("loss", "policy_loss", "kl", "grad_norm", "entropy", "trained_tokens"):
            assert_same(m2[key], m1[key], key)
    assert len({m["loss"] for m in one}) == 3
    assert all(torch.equal(r0["adapters"][n], r1["adapters"][n]) for n in r0["adapters"])
    assert r1["ref"] is None and r1["weights"] is None
    ref = single.reference_logprobs(batches[0].prompts, batches[0].completions)
    assert_same(r0["ref"], ref, "reference logprobs")
    w1, w2 = load_bytes(single.export_weights()), load_bytes(r0["weights"])
    assert_same(w2, w1, "weights")

    fresh = Trainer(cfg.to_dict(), tiny_model_dir)
    fresh.load(str(tmp_path / "ckpt"))
    rng = torch.get_rng_state()  # the checkpoint's; both trainers share this process's RNG (minibatch order)
    m_single = single.train_step(batches[3])
    torch.set_rng_state(rng)
    m_fresh = fresh.train_step(batches[3])
    assert_same(m_fresh["loss"], m_single["loss"], "loss")
    assert_same(m_fresh["grad_norm"], m_single["grad_norm"], "grad_norm")


@pytest.mark.integration
def test_loop_with_lora_on_two_ranks_gives_the_loss_curve_of_one(tiny_model_dir, tmp_path):
    """The whole loop on real Ray (TrainerGroup, HF engine, LoRA reference and merged sync), 3 steps with 1 and with
    2 trainer ranks, in float64: the same losses and KL within F64_TOL, and both write the LoRA checkpoint layout."""
    from posttrain.config import RayConfig
    from posttrain.loop import train
    from posttrain.orchestration.runtime import start_ray, stop_ray

    curves = {}
    start_ray(RayConfig(num_cpus=8), 8)
    try:
        for ranks in (1, 2):
            cfg = load_config(None, [
                f"name=r{ranks}", f"runs_dir={tmp_path}", f"model.path={tiny_model_dir}", "task.heldout_size=8",
                "reward.weights={verifier: 1.0, length: 1.0}", "algorithm.group_size=4",
                "algorithm.prompts_per_step=4", "algorithm.skip_zero_variance_groups=false", "algorithm.kl_coef=0.02",
                "algorithm.lr=1e-2", "rollout.engine=hf", "train.steps=3", "eval.every=0", "checkpoint.every=3",
                "logging.progress=false", "topology.torch_threads=1", f"topology.trainer_ranks={ranks}",
                "model.lora.r=4", "model.lora.alpha=8", *FLOAT64])
            train(cfg, progress=False)
            rows = [json.loads(x) for x in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
            curves[ranks] = [(m["loss"], m["kl"]) for m in rows if "time/step" in m]
            (step_dir,) = (cfg.run_dir / "checkpoints").glob("step_*")
            assert (step_dir / "adapter" / "adapter_model.safetensors").is_file()
            assert (step_dir / "model" / "model.safetensors").is_file()
    finally:
        stop_ray()
    assert len(curves[1]) == 3 and curves[1][2][1] > 0  # the adapters moved the policy away from its reference
    for (l1, k1), (l2, k2) in zip(curves[1], curves[2]):
        assert_same(l2, l1, "loss")
        assert_same(k2, k1, "kl")
