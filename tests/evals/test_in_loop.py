"""The loop's alarm wiring and the in-loop gate, without Ray: alarms fed hand-made step records, the gate fed
hand-made eval results, the best pointer and checkpoint retention on real directories."""

from __future__ import annotations

import json

import pytest

from posttrain.config import load_config
from posttrain.errors import PosttrainError
from posttrain.evals.alarm_wiring import LoopAlarms
from posttrain.evals.in_loop import InLoopEval
from posttrain import checkpoint as ckpt


def _alarms(*rules: str, extra=()):
    return LoopAlarms(load_config(None, [f"alarms.rules=[{', '.join(rules)}]", *extra]))


def test_alarms_fire_with_their_evidence_and_default_thresholds():
    alarms = _alarms("{kind: length_corr, window: 3}", "{kind: repetition, action: stop}")
    # length 2, 3, 4 against reward 0.1, 0.2, 0.3: Pearson r = 1 > 0.8 (the default) and the reward rises (slope
    # 0.1 per step), judged once the window (3) is full
    out1 = alarms.observe({"step": 1, "response_length": 2, "reward_mean": 0.1, "entropy": None}, ["12"])
    out2 = alarms.observe({"step": 2, "response_length": 3, "reward_mean": 0.2}, ["123"])
    assert "alarm/length_corr" not in out1 and "alarm/length_corr" not in out2
    # 'abababab' in character 3-grams (no tokenizer): aba bab aba bab aba bab -> 6 grams, 2 distinct, 4 repeats
    out3 = alarms.observe({"step": 3, "response_length": 4, "reward_mean": 0.3}, ["abababab"])
    assert out3["repetition_rate"] == pytest.approx(4 / 6)
    assert out3["alarm/length_corr"]["pearson"] == pytest.approx(1.0) and out3["alarm/length_corr"]["action"] == "warn"
    assert out3["alarm/length_corr"]["reward_slope"] == pytest.approx(0.1)
    falling = _alarms("{kind: length_corr, window: 3}")  # r = 1 too, but the reward falls: not length hacking
    for step, (n, r) in enumerate([(4, 0.3), (3, 0.2), (2, 0.1)], start=1):
        assert "alarm/length_corr" not in falling.observe({"step": step, "response_length": n, "reward_mean": r}, ["1"])
    assert out3["alarm/repetition"] == {"action": "stop", "repetition_rate": pytest.approx(4 / 6), "threshold": 0.5}
    assert alarms.due_action(3).kind == "repetition" and alarms.due_action(2) is None
    assert alarms.summary()["alarm_count"] == 2
    json.dumps(out3)  # goes to metrics.jsonl as is


def test_length_bucket_alarm_reads_each_completions_length_and_reward():
    alarms = _alarms("{kind: length_bucket, window: 3}")
    short_long = (["1", "1", "1234", "1234"], [0.0, 0.0, 1.0, 1.0])  # no tokenizer: length in characters
    more_long = (["1", "1234", "1234", "1234"], [0.0, 1.0, 1.0, 1.0])
    outs = [alarms.observe({"step": s, "reward_mean": 0.5}, *short_long) for s in (1, 2, 3)]
    outs += [alarms.observe({"step": s, "reward_mean": 0.75}, *more_long) for s in (4, 5)]
    assert not any("alarm/length_bucket" in o for o in outs)  # the last window (3 steps) is not yet all "after"
    out = alarms.observe({"step": 6, "reward_mean": 0.75}, *more_long)
    # first window: 0.5 -> last window (steps 4-6): 0.75; within each length the reward did not move
    ev = out["alarm/length_bucket"]
    assert ev["overall_gain"] == pytest.approx(0.25) and ev["within_bucket_gain"] == pytest.approx(0.0)
    assert "sample_lengths_rewards" not in out  # per-sample lists stay out of metrics.jsonl
    json.dumps(out)
    quality = _alarms("{kind: length_bucket, window: 3}")  # same lengths, better answers: quiet
    for step in range(1, 7):
        r = 0.0 if step <= 3 else 1.0
        assert "alarm/length_bucket" not in quality.observe({"step": step}, ["1", "1234"], [r, r])


def test_rm_disagreement_needs_an_ensemble_and_reads_the_logged_spread(tmp_path):
    with pytest.raises(PosttrainError, match="reward.rm_ensemble"):
        _alarms("{kind: rm_disagreement}")
    ens = ["reward.weights={rm: 1.0}", f"reward.rm_path={tmp_path}/a", f"reward.rm_ensemble=[{tmp_path}/b]"]
    alarms = _alarms("{kind: rm_disagreement}", extra=ens)
    assert "alarm/rm_disagreement" not in alarms.observe({"step": 1, "reward/rm_disagreement": 0.4}, ["1"])
    assert "alarm/rm_disagreement" not in alarms.observe({"step": 2, "reward/rm_disagreement": 0.6}, ["1"])  # = 1.5x
    assert alarms.observe({"step": 3, "reward/rm_disagreement": 0.7}, ["1"])["alarm/rm_disagreement"]["ratio"] == \
        pytest.approx(1.75)
    with pytest.raises(PosttrainError, match="reward.rm_ensemble is set but reward.weights has no 'rm' weight"):
        load_config(None, [f"reward.rm_ensemble=[{tmp_path}/b]"])


def test_alarm_warmup_and_no_rules_cost_nothing():
    assert LoopAlarms(load_config(None)).observe({"step": 1}, ["x"]) == {}  # the default: no alarms, no extra key
    alarms = _alarms("{kind: repetition, after_step: 2}")
    assert "alarm/repetition" not in alarms.observe({"step": 2}, ["aaaaaa"])
    assert "alarm/repetition" in alarms.observe({"step": 3}, ["aaaaaa"])


def test_alarm_config_errors_say_what_to_do():
    with pytest.raises(PosttrainError, match="reward.log_gold"):
        _alarms("{kind: proxy_gold}")
    with pytest.raises(PosttrainError, match="set eval.suites"):
        _alarms("{kind: kl_accel, action: rollback}")
    with pytest.raises(PosttrainError, match="alarms.rules.0.action"):
        _alarms("{kind: kl_accel, action: panic}")


def test_best_pointer_is_atomic_and_retention_keeps_the_best(tmp_path):
    root = tmp_path / "checkpoints"
    for step in (2, 4, 6, 8):
        ckpt.finalize_checkpoint(ckpt.begin_checkpoint(root, step), step)
    assert ckpt.read_best_pointer(tmp_path) is None
    ckpt.write_best_pointer(tmp_path, {"checkpoint": "step_000002", "step": 2})
    assert ckpt.read_best_pointer(tmp_path)["step"] == 2
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp file left behind
    (root / "step_000004" / ckpt.HOLD).touch()  # the evaluator has yet to read it
    removed = ckpt.prune_checkpoints(root, keep_last=1)
    assert [p.name for p in removed] == ["step_000006"]
    assert [p.name for p in ckpt.list_checkpoints(root)] == ["step_000002", "step_000004", "step_000008"]
    ckpt.verify_checkpoint(root / "step_000004")  # the hold file is not part of the checkpoint


def _result(step: int, scores: list[float]) -> dict:
    records = [{"id": str(i), "prompt": "p", "output": "o", "score": s, "tokens": 1} for i, s in enumerate(scores)]
    mean = sum(scores) / len(scores)
    return {"step": step, "model_dir": "m", "seconds": 2.0, "samples": len(scores),
            "suites": [{"suite": "s", "kind": "generation", "summary": {"mean": mean, "se": 0.0, "n": len(scores),
                                                                          "mean_tokens": 1.0},
                        "records": records, "cached": False, "seconds": 2.0}]}


def test_gate_against_previous_and_best_moves_the_best_pointer(tmp_path):
    cfg = load_config(None, [f"runs_dir={tmp_path}", "name=r", "eval.suites=[addition]"])
    gate = InLoopEval(cfg, actor=None, log=lambda m: None)
    first = gate._gate(_result(2, [1.0] * 30 + [0.0] * 10), tmp_path / "r/checkpoints/step_000002")
    assert first["eval/is_best"] == 1 and first["eval/score"] == 0.75 and "eval/vs_previous/regressed" not in first
    assert first["eval/samples_per_s"] == 20.0  # 40 samples in 2 s
    # B loses 20 of A's 30 passes and gains none: 20 discordant pairs all one way, exact McNemar
    # p = 2 * 0.5**20 = 1.9e-6 -> regressed against both the previous and the best (the same checkpoint here)
    (tmp_path / "r/checkpoints/step_000004").mkdir(parents=True)
    worse = gate._gate(_result(4, [1.0] * 10 + [0.0] * 30), tmp_path / "r/checkpoints/step_000004")
    verdict = json.loads((tmp_path / "r/checkpoints/step_000004/gate.json").read_text())  # what `posttrain view` shows
    assert verdict["verdict"] == "fail" and "vs best: s -0.500 REGRESSED" in verdict["reason"]
    assert worse["eval/vs_previous/regressed"] == 1 and worse["eval/vs_best/regressed"] == 1
    assert worse["eval/vs_best/s/diff"] == pytest.approx(-0.5) and worse["eval/vs_best/s/p_holm"] == pytest.approx(2 * 0.5**20)
    assert worse["eval/is_best"] == 0 and ckpt.read_best_pointer(cfg.run_dir)["step"] == 2
    better = gate._gate(_result(6, [1.0] * 40), tmp_path / "r/checkpoints/step_000006")
    assert better["eval/vs_previous/regressed"] == 0 and better["eval/is_best"] == 1 and better["eval/best_step"] == 6
    assert ckpt.read_best_pointer(cfg.run_dir) == {"checkpoint": "step_000006", "step": 6, "score": 1.0,
                                                  "path": str(tmp_path / "r/checkpoints/step_000006")}
    assert (cfg.run_dir / "evals/step_000004/report.html").is_file()
    # a resumed run finds its previous and best results on disk
    again = InLoopEval(cfg, actor=None)
    assert again.best["step"] == 6 and again.previous["step"] == 6


class _Evaluator:
    """Stands in for the evaluator actor: records what the driver sends it."""

    def __init__(self):
        self.sent = []
        self.evaluate = self

    def remote(self, step, model_dir):
        self.sent.append((step, model_dir))
        return object()


def test_the_starting_model_is_step_0_the_first_previous_and_the_baseline_of_every_gain(tmp_path):
    cfg = load_config(None, [f"runs_dir={tmp_path}", "name=r", "eval.suites=[addition]"])
    base = tmp_path / "base-model"
    base.mkdir()
    evaluator = _Evaluator()
    gate = InLoopEval(cfg, actor=evaluator, log=lambda m: None)
    gate.submit_start(base)
    (tmp_path / "r/checkpoints/step_000002").mkdir(parents=True)
    gate.submit(2, tmp_path / "r/checkpoints/step_000002")  # queued behind step 0
    assert evaluator.sent == [(0, str(base))] and gate.queued[0] == 2
    start = gate._gate({**_result(0, [1.0] * 30 + [0.0] * 10), "model_dir": str(base)}, None)
    assert start["eval/score"] == 0.75 and "eval/is_best" not in start and "eval/vs_previous/regressed" not in start
    assert ckpt.read_best_pointer(cfg.run_dir) is None and gate.best_checkpoint() is None  # the start is no checkpoint
    assert list(base.iterdir()) == []  # no gate.json or hold file written into the user's model
    # the first checkpoint loses 20 of the start's 30 passes (40 paired problems): -0.5 vs previous and vs the start
    worse = gate._gate(_result(2, [1.0] * 10 + [0.0] * 30), tmp_path / "r/checkpoints/step_000002")
    assert worse["eval/vs_previous/s/diff"] == pytest.approx(-0.5) and worse["eval/vs_previous/regressed"] == 1
    assert worse["eval/vs_start/s/diff"] == pytest.approx(-0.5) and worse["eval/vs_start/s/ci_high"] < 0
    assert worse["eval/is_best"] == 1 and ckpt.read_best_pointer(cfg.run_dir)["step"] == 2  # the first checkpoint
    verdict = json.loads((tmp_path / "r/checkpoints/step_000002/gate.json").read_text())
    assert "vs start: s -0.500" in verdict["reason"] and "vs previous: s -0.500 REGRESSED" in verdict["reason"]
    assert InLoopEval(cfg, actor=None).start["step"] == 0  # a resume keeps the start as the baseline
    # all 40 pass: +0.25 over the start (10 problems flip 0 -> 1, none the other way), +0.75 over step 2
    better = gate._gate(_result(4, [1.0] * 40), tmp_path / "r/checkpoints/step_000004")
    assert better["eval/vs_start/s/diff"] == pytest.approx(0.25) and better["eval/vs_previous/s/diff"] == pytest.approx(0.75)
    assert better["eval/is_best"] == 1 and gate.best_checkpoint() == tmp_path / "r/checkpoints/step_000004"
    assert gate.summary()["eval_scores"] == [{"step": 0, "score": 0.75}, {"step": 2, "score": 0.25},
                                             {"step": 4, "score": 1.0}]


def test_gold_drawdown_by_hand():
    from posttrain.evals.alarms import gold_drawdown

    # peak 0.60 at step 1; limit 0.60 - 0.05 * 0.60 = 0.57; 0.56 < 0.57 and proxy 0.4 > 0.2 at the peak -> fires
    ev = gold_drawdown([1, 2, 3], [0.2, 0.3, 0.4], [0.60, 0.58, 0.56], drop=0.05)
    assert ev == {"gold_peak": 0.60, "gold_peak_step": 1, "gold_now": 0.56, "proxy_at_peak": 0.2, "proxy_now": 0.4}
    assert gold_drawdown([1, 2, 3], [0.2, 0.3, 0.4], [0.60, 0.58, 0.575], drop=0.05) is None  # 0.575 >= 0.57
    assert gold_drawdown([1, 2, 3], [0.2, 0.3, 0.1], [0.60, 0.58, 0.50], drop=0.05) is None  # proxy fell too
    alarms = _alarms("{kind: proxy_gold, proxy: train, drop: 0.05}", extra=["reward.log_gold=true"])
    assert alarms.monitor.specs[0].keys["proxy"] == "reward_mean" and alarms.monitor.specs[0].drop == 0.05
