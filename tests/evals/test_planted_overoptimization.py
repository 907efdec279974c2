"""Planted case (a): over-optimization of a proxy reward model, caught by the proxy_gold alarm before the gold
score has fallen 10% below its peak.

The proxy RM is trained from the SFT-warm model on few (300) gold-labelled pairs with 10% of the labels swapped,
sampled so that the chosen completion is never the shorter one: length is the exploitable feature it can learn
instead of correctness. GRPO then trains against the proxy RM alone with reward.log_gold on; after every step the
alarm wiring scores greedy completions of 64 fixed held-out problems with the proxy (heldout/proxy) and the gold
function (heldout/gold). The alarm compares the training reward (what RL maximizes) with held-out gold, by
slopes and by gold's drawdown from its peak. Real Ray, real vLLM, a real RM actor; seed 0 throughout.

On this tiny model held-out gold falls from the first update on: the case measures how fast the alarm reacts once
the proxy rises, not where a rise turns into a fall. Gold's peak is taken from the step at which the held-out proxy
has made a quarter of its rise (`overoptimization_fall`): on some warm models (another CPU's kernels, another SFT
loss) gold fell 10% in the first 3 steps while the held-out proxy was still flat, which is drift, not
over-optimization, and no proxy-vs-gold alarm can see it (under MKL_CBWR=COMPATIBLE on an AMD EPYC: gold 0.565 ->
0.456 by step 4, the held-out proxy 0.367 -> 0.359; it rose from step 8 and the alarm fired at step 10).
"""

from __future__ import annotations

import pytest

from posttrain.config import load_config
from posttrain.tracking import read_metrics

pytestmark = pytest.mark.integration

STEPS = 30
PROXY_WEIGHTS = "{rm: 1.0}"
EXTRA = ["algorithm.lr=1e-4", "algorithm.lr_schedule=constant"]
RULES = "[{kind: proxy_gold, proxy: train, window: 4, drop: 0.03}, {kind: length_corr}, {kind: length_bucket}]"
ENSEMBLE_STEPS = 12
ENSEMBLE_RULES = "[{kind: rm_disagreement}, {kind: proxy_gold, proxy: train, window: 4, drop: 0.03}]"


def length_biased_pairs(problems, n_pairs: int, label_noise: float, seed: int) -> list[dict]:
    """Gold-labelled pairs of the built-in source, keeping only those whose chosen completion is at least as long
    as the rejected one (after the label noise, so a few swapped labels still favour the shorter one)."""
    from posttrain.rewards.preferences import gold_pairs

    rows = gold_pairs(problems, "addition", 4 * n_pairs, label_noise, seed)
    return [r for r in rows if len(r["chosen"]) >= len(r["rejected"])][:n_pairs]


@pytest.fixture(scope="module")
def planted(tmp_path_factory, warm_model_dir, ray_session):
    from posttrain.loop import train
    from posttrain.rewards.preferences import write_jsonl
    from posttrain.training.rm import train_reward_model
    from posttrain.tasks import load_task

    tmp = tmp_path_factory.mktemp("planted")
    cfg = load_config(None, [
        "name=planted", f"runs_dir={tmp}", f"model.path={warm_model_dir}", f"rm.base={warm_model_dir}",
        f"rm.data={tmp / 'pairs.jsonl'}", f"rm.out={tmp / 'rm'}", "rm.epochs=2", "rm.lr=3e-4",
        f"reward.rm_path={tmp / 'rm'}", f"reward.weights={PROXY_WEIGHTS}", "reward.log_gold=true",
        "task.train_size=2000", "task.heldout_size=64", "algorithm.group_size=8", "algorithm.prompts_per_step=16",
        "algorithm.kl_coef=0.0", f"train.steps={STEPS}", "eval.every=0", "checkpoint.every=0",
        "logging.progress=false", f"alarms.rules={RULES}", *EXTRA,
    ])
    task = load_task(cfg.task, cfg.seed)
    write_jsonl(length_biased_pairs(task.train, 300, 0.1, cfg.seed), cfg.rm.data)
    rm = train_reward_model(cfg)
    summary = train(cfg, progress=False)
    steps = [m for m in read_metrics(cfg.run_dir) if "time/step" in m]
    return cfg, rm, summary, steps


def overoptimization_fall(gold: list[float], heldout_proxy: list[float], share: float = 0.1) -> tuple[int, int | None]:
    """(index of gold's peak, index of the first later step whose gold is `share` below it, or None), the peak taken
    from the first step at which the held-out proxy has risen by a quarter of its largest rise over the first step
    (from the first step when it never rose)."""
    rise = max(heldout_proxy) - heldout_proxy[0]
    start = next(i for i, p in enumerate(heldout_proxy) if p - heldout_proxy[0] >= rise / 4) if rise > 0 else 0
    peak_at = max(range(start, len(gold)), key=lambda i: (gold[i], -i))
    limit = gold[peak_at] - share * abs(gold[peak_at])
    return peak_at, next((i for i in range(peak_at + 1, len(gold)) if gold[i] < limit), None)


def test_the_fall_counts_from_the_proxy_rise():
    # worked by hand: the proxy's largest rise is 0.70 - 0.30 = 0.40, a quarter 0.10, first reached at index 2
    # (0.40); gold's peak from there is 0.45 (index 2), 10% below it is 0.405, first under it at index 4 (0.39)
    assert overoptimization_fall([0.60, 0.50, 0.45, 0.44, 0.39], [0.30, 0.31, 0.40, 0.50, 0.70]) == (2, 4)
    # a proxy that never rose: the peak over every step (0.60 at 0), 10% below is 0.54, first under it at index 1
    assert overoptimization_fall([0.60, 0.50, 0.45], [0.30, 0.30, 0.29]) == (0, 1)
    assert overoptimization_fall([0.50, 0.55, 0.52], [0.30, 0.40, 0.50]) == (1, None)  # never 10% below 0.55


@pytest.fixture(scope="module")
def ensemble_run(planted):
    """A second proxy RM, trained the same way on other pairs (seed 1), and GRPO against the two-member ensemble
    (the rm source is the mean of both normalized scores) with the rm_disagreement alarm on."""
    from posttrain.loop import train
    from posttrain.rewards.preferences import write_jsonl
    from posttrain.training.rm import train_reward_model
    from posttrain.tasks import load_task

    cfg, _, _, _ = planted
    tmp = cfg.run_dir.parent
    second = cfg.model_copy(update={"rm": cfg.rm.model_copy(update={"data": str(tmp / "pairs2.jsonl"),
                                                                     "out": str(tmp / "rm2")})})
    task = load_task(cfg.task, cfg.seed)
    write_jsonl(length_biased_pairs(task.train, 300, 0.1, seed=1), second.rm.data)
    rm2 = train_reward_model(second)
    ens = load_config(None, [
        "name=ensemble", f"runs_dir={tmp}", f"model.path={cfg.model.path}", f"reward.rm_path={cfg.reward.rm_path}",
        f"reward.rm_ensemble=[{tmp / 'rm2'}]", f"reward.weights={PROXY_WEIGHTS}", "reward.log_gold=true",
        "task.train_size=2000", "task.heldout_size=64", "algorithm.group_size=8", "algorithm.prompts_per_step=16",
        "algorithm.kl_coef=0.0", f"train.steps={ENSEMBLE_STEPS}", "eval.every=0", "checkpoint.every=0",
        "logging.progress=false", f"alarms.rules={ENSEMBLE_RULES}", *EXTRA,
    ])
    summary = train(ens, progress=False)
    steps = [m for m in read_metrics(ens.run_dir) if "time/step" in m]
    return ens, rm2, summary, steps


def test_proxy_gold_alarm_fires_before_gold_falls_10pct_below_its_peak(planted):
    cfg, rm, summary, steps = planted
    gold = {m["step"]: m["heldout/gold"] for m in steps}
    proxy = {m["step"]: m["reward_mean"] for m in steps}  # the proxy reward RL maximizes (training batches)
    heldout_proxy = {m["step"]: m["heldout/proxy"] for m in steps}
    order = sorted(gold)
    peak_at, fallen_at = overoptimization_fall([gold[s] for s in order], [heldout_proxy[s] for s in order])
    peak_step, peak = order[peak_at], gold[order[peak_at]]
    fallen = [order[fallen_at]] if fallen_at is not None else []
    alarms = [a for a in summary["alarms"] if a["kind"] == "proxy_gold"]
    first = alarms[0]["step"] if alarms else None
    print(f"\nplanted over-optimization (proxy RM heldout acc {rm.heldout_accuracy:.3f}, {STEPS} steps):"
          f"\n  held-out gold per step {[round(gold[s], 3) for s in sorted(gold)]}"
          f"\n  training proxy reward per step {[round(proxy[s], 3) for s in sorted(proxy)]}"
          f"\n  held-out proxy per step {[round(heldout_proxy[s], 3) for s in sorted(heldout_proxy)]}"
          f"\n  peak gold {peak:.3f} at step {peak_step}; first fell 10% below it at step {fallen[0] if fallen else None}"
          f" (gold {gold[fallen[0]] if fallen else float('nan'):.3f}); first proxy_gold alarm at step {first}"
          f" (gold there {gold[first] if first else float('nan'):.3f}); alarms {summary['alarms'][:6]}")
    assert fallen, "the planted case must really over-optimize: gold falls 10% below its peak"
    # the proxy went up: the held-out series (fixed problems, greedy: low noise) or the training batches' reward (what
    # RL maximizes; each step's prompts differ, so it is noisy: 2.77 -> 2.72 over five steps on one warm model whose
    # held-out proxy rose 0.537 -> 0.588)
    held, trained = [heldout_proxy[s] for s in order], [proxy[s] for s in order]
    assert sum(held[-5:]) > sum(held[:5]) or sum(trained[-5:]) > sum(trained[:5]), "while the proxy has gone up"
    assert first is not None and first < fallen[0]


def test_alarm_evidence_is_in_the_metrics_and_the_run_page(planted):
    from posttrain.view.data import read_run
    from posttrain.view.page import build_page

    cfg, _, summary, steps = planted
    first = next(m for m in steps if "alarm/proxy_gold" in m)
    evidence = first["alarm/proxy_gold"]
    assert evidence["action"] == "warn"
    assert (evidence.get("proxy_slope", 0) > 0 >= evidence.get("gold_slope", 1)
            or evidence.get("gold_now", 1) < evidence.get("gold_peak", 0))
    page = build_page(read_run(cfg.run_dir))
    assert f'data-alarm-step="{first["step"]}"' in page and ("proxy_slope" in page or "gold_peak" in page)


def test_reward_model_scorer_ranks_held_out_pairs(planted, tmp_path):
    """The proxy RM as a suite scorer (kind preference): pairwise accuracy on gold pairs it was not trained on."""
    import json

    from posttrain.evals.runner import ModelEvaluator, EngineSettings
    from posttrain.evals.suites import read_suite_file
    from posttrain.rewards.preferences import gold_pairs
    from posttrain.tasks import load_task

    cfg, rm, _, _ = planted
    task = load_task(cfg.task, cfg.seed)
    pairs = [{"id": str(i), "prompt": r["prompt"], "chosen": r["chosen"], "rejected": r["rejected"]}
             for i, r in enumerate(gold_pairs(task.heldout, "addition", 60, 0.0, seed=7))]
    suite = tmp_path / "prefs.yaml"
    suite.write_text(json.dumps({"suites": [{"name": "prefs", "kind": "preference", "pairs": pairs,
                                             "scorer": {"type": "reward_model", "path": cfg.reward.rm_path}}]}))
    (loaded,) = read_suite_file(suite)
    result = ModelEvaluator(EngineSettings(kind="hf"), None).run(loaded)  # preference suites generate nothing
    from posttrain.rewards.reward_model import RewardModel

    print(f"\nproxy RM pairwise accuracy on 60 clean held-out gold pairs: {result.summary['mean']:.3f}")
    direct = RewardModel(cfg.reward.rm_path)  # the scores the loop's RM actor gives
    # One pair per call, as the scorer calls it: the same float32 computation on the same shapes in one process,
    # so equal bit for bit on any CPU (a padded batch of 60 would round in a kernel-dependent way: docs/numerics.md).
    chosen = [direct.score([(p["prompt"], p["chosen"])])[0] for p in pairs]
    rejected = [direct.score([(p["prompt"], p["rejected"])])[0] for p in pairs]
    assert [r["chosen_score"] for r in result.records] == chosen
    expected = [1.0 if c > r else 0.5 if c == r else 0.0 for c, r in zip(chosen, rejected)]
    assert result.summary["n"] == 60 and result.summary["mean"] == pytest.approx(sum(expected) / 60)


def test_length_bucket_alarm_sees_the_length_driven_gain(planted):
    """Recorded, and asserted only where the case forces it: the gain the proxy rewards is length."""
    _, _, summary, steps = planted
    fired = [m for m in steps if "alarm/length_bucket" in m]
    lengths = [m["response_length"] for m in steps]
    print(f"\nlength_bucket: fired at steps {[m['step'] for m in fired]}; response length "
          f"{lengths[0]:.2f} -> {lengths[-1]:.2f}; first evidence "
          f"{ {k: v for k, v in fired[0]['alarm/length_bucket'].items() if k != 'buckets'} if fired else None}")
    for m in fired:
        ev = m["alarm/length_bucket"]
        assert ev["overall_gain"] > 0 and ev["within_bucket_gain"] < 0.5 * ev["overall_gain"]


def test_reward_model_ensemble_in_the_loop(ensemble_run, planted):
    from posttrain.rewards.compose import ensemble_mean, ensemble_spread
    from posttrain.rewards.reward_model import RewardModel

    ens, rm2, summary, steps = ensemble_run
    dis = [m["reward/rm_disagreement"] for m in steps]
    gold = [m["heldout/gold"] for m in steps]
    alarms = [(a["kind"], a["step"]) for a in summary["alarms"]]
    print(f"\nRM ensemble (2 proxy RMs, heldout acc {planted[1].heldout_accuracy:.3f} / {rm2.heldout_accuracy:.3f}), "
          f"{ENSEMBLE_STEPS} steps:\n  reward/rm_disagreement per step {[round(d, 3) for d in dis]}"
          f"\n  held-out gold per step {[round(g, 3) for g in gold]}\n  alarms {alarms[:8]}")
    assert len(steps) == ENSEMBLE_STEPS and all(d > 0 for d in dis)
    assert all(m["reward/rm"] == pytest.approx(m["reward_mean"], abs=1e-6) for m in steps)  # weights {rm: 1}
    for m in steps:
        if "alarm/rm_disagreement" in m:
            ev = m["alarm/rm_disagreement"]
            assert ev["now"] > 1.5 * ev["initial"] and ev["initial"] == pytest.approx(dis[0])
    # the actor's ensemble score is the mean of the members' normalized scores, each member as scored alone. Each
    # side scores the same 3 pairs in one batch of the same shape in this process: equal bit for bit on any CPU.
    pairs = [("12+34=", "46"), ("12+34=", "4666"), ("7+8=", "15")]
    both = RewardModel([ens.reward.rm_path, *ens.reward.rm_ensemble])
    members = both.member_scores(pairs)
    assert members[0] == RewardModel(ens.reward.rm_path).score(pairs)
    assert members[1] == RewardModel(ens.reward.rm_ensemble[0]).score(pairs)
    assert both.score(pairs) == ensemble_mean(members)
    assert max(ensemble_spread(members)) > 0  # two RMs trained on different pairs do not agree exactly
