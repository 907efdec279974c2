"""The eval loop inside training, on real Ray with real engines and real checkpoints (one Ray session for the
module):

(b) a clean GRPO run on the built-in addition task with the verifier reward, every alarm that applies on (rm_disagreement needs
    reward models): none fires;
    meanwhile the evaluator actor gates each checkpoint and best.json follows the best one.
(r) alarm actions: a rule that fires on purpose rolls trainer and engines back to the best checkpoint, twice,
    then a stop rule ends the run cleanly.

The planted over-optimization case (a) is in test_planted_overoptimization.py.
"""

from __future__ import annotations

import json

import pytest

from posttrain.config import load_config
from posttrain.loop import train
from posttrain.tracking import read_metrics
from posttrain import checkpoint as ckpt

pytestmark = pytest.mark.integration

ALL_ALARMS = ("[{kind: length_corr, window: 8}, {kind: length_bucket, window: 4}, {kind: kl_accel},"
              " {kind: entropy_collapse}, {kind: repetition}]")
SUITE = """
suites:
  - name: heldout
    kind: generation
    task: {task: addition, split: heldout, size: 48, seed: 0, max_digits: 3}
    scorer: {type: verifier, task: addition}
    sampling: {temperature: 0.0, max_new_tokens: 8}
  - name: gold
    kind: generation
    task: {task: addition, split: heldout, size: 48, seed: 0, max_digits: 3}
    scorer: {type: gold}
    sampling: {temperature: 0.0, max_new_tokens: 8}
"""


def _cfg(tmp, model_dir, name, *extra):
    return load_config(None, [
        f"name={name}", f"runs_dir={tmp}", f"model.path={model_dir}", "rollout.engine=hf", "algorithm.prompts_per_step=8",
        "algorithm.group_size=8", "algorithm.kl_coef=0.0", "algorithm.lr=1e-3", "task.heldout_size=32",
        "task.train_size=2000", "eval.every=0", "logging.progress=false", "topology.rollout_cpus=0.5",
        # The zero-signal alarm is off: this is about the reward-hacking alarms and the evaluator. At kl 0 and lr
        # 1e-3 the warm model can lose its few right answers; on an AMD EPYC (family 25 model 17) no group had a
        # signal at steps 8-12 and that alarm stopped the run at step 12 (tests/test_no_signal.py tests it). At lr
        # 1e-4 the run kept its signal but length_bucket fired on noise at steps 11-12.
        "alarms.no_signal_steps=0", *extra])


@pytest.fixture(scope="module")
def suite_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("suites") / "loop-suite.yaml"
    p.write_text(SUITE)
    return str(p)


@pytest.fixture(scope="module")
def clean_run(ray_session, tmp_path_factory, warm_model_dir, suite_file):
    cfg = _cfg(tmp_path_factory.mktemp("clean"), warm_model_dir, "clean", "train.steps=12", "checkpoint.every=4",
               "checkpoint.keep_last=1", f"eval.suites=[{suite_file}]", f"alarms.rules={ALL_ALARMS}")
    return cfg, train(cfg, progress=False)


def test_clean_run_raises_no_alarm(clean_run):
    cfg, summary = clean_run
    steps = [m for m in read_metrics(cfg.run_dir) if "time/step" in m]
    assert len(steps) == 12 and all("repetition_rate" in m for m in steps)
    fired = [(m["step"], k) for m in steps for k in m if k.startswith("alarm/")]
    print(f"\nclean run (addition, verifier reward, 12 steps, 5 alarms on): alarm count {summary['alarm_count']}")
    assert summary["alarm_count"] == 0 and fired == []


def test_evaluator_gates_every_checkpoint_and_keeps_the_best(clean_run):
    cfg, summary = clean_run
    evals = [m for m in read_metrics(cfg.run_dir) if "eval/score" in m]
    # the starting model (step 0), checkpoints at 4 and 8, the final one at 12; one evaluation at a time, so 4 and
    # 8 may give way to a newer checkpoint
    done = sorted(m["step"] for m in evals)
    assert done[0] == 0 and done[-1] == 12 and set(done) <= {0, 4, 8, 12}
    for m in evals:
        assert 0 <= m["eval/heldout/mean"] <= 1 and m["eval/gold/mean"] <= 1 and m["eval/samples_per_s"] > 0
    later = [m for m in evals if m["step"] > 0]  # the first checkpoint's previous is the starting model
    assert all("eval/vs_previous/heldout/ci_low" in m for m in later)
    assert all("eval/vs_best/regressed" in m for m in later[1:])  # the first checkpoint is the first best
    best = ckpt.read_best_pointer(cfg.run_dir)
    last_best = [m["step"] for m in sorted(evals, key=lambda m: m["step"]) if m.get("eval/is_best")][-1]
    assert best["step"] == last_best == max(evals, key=lambda m: m["step"])["eval/best_step"]
    # keep_last=1, yet retention kept the best checkpoint beside the newest
    kept = [p.name for p in ckpt.list_checkpoints(cfg.run_dir / "checkpoints")]
    assert best["checkpoint"] in kept and kept[-1] == "step_000012"
    assert summary["best_checkpoint"].endswith(best["checkpoint"])
    assert all("eval/vs_start/heldout/diff" in m for m in later)  # each checkpoint's gain over the start
    gate = json.loads((cfg.run_dir / "checkpoints" / "step_000012" / "gate.json").read_text())
    assert gate["verdict"] in ("pass", "fail") and gate["reason"].startswith("score ")
    assert (cfg.run_dir / "evals" / "step_000012" / "report.html").is_file()
    print(f"\nin-loop eval: {[(m['step'], round(m['eval/score'], 3), m.get('eval/is_best')) for m in evals]}, "
          f"best {best['checkpoint']}, evaluator {evals[-1]['eval/samples_per_s']:.1f} samples/s")


def test_rollback_restores_the_best_weights_into_trainer_and_engines_then_stop_ends_the_run(
        ray_session, tmp_path_factory, warm_model_dir, suite_file):
    # repetition with threshold -1 fires at every step it is allowed to (the rate is >= 0); after_step holds it back
    rules = ("[{kind: repetition, threshold: -1.0, action: rollback, after_step: 5},"
             " {kind: repetition, threshold: -1.0, action: stop, after_step: 9}]")
    cfg = _cfg(tmp_path_factory.mktemp("rollback"), warm_model_dir, "rollback", "train.steps=12",
               "checkpoint.every=2", "checkpoint.keep_last=2", f"eval.suites=[{suite_file}]", f"alarms.rules={rules}",
               # every group is trained, so every step measures the engine-vs-trainer gap below: on one warm model
               # (SFT through the chunked head, AMD EPYC) no group after the rollback had unequal rewards
               "algorithm.skip_zero_variance_groups=false")
    summary = train(cfg, progress=False)
    metrics = read_metrics(cfg.run_dir)
    steps = {m["step"]: m for m in metrics if "time/step" in m}
    # rollback after steps 6, 7, 8 and 9; at step 10 both rules fire and stop wins
    assert [r["step"] for r in summary["rollbacks"]] == [6, 7, 8, 9]
    assert summary["stopped_by_alarm"].startswith("repetition at step 10") and summary["steps"] == 10
    assert sorted(steps) == list(range(1, 11))
    best_at_6 = summary["rollbacks"][0]["to"]
    assert best_at_6 in ("step_000002", "step_000004", "step_000006")
    # Engines got the restored weights too: the trainer recomputes the logprobs of what the engines sampled with
    # the same weights, so their gap stays at float noise (a stale engine would be off by far more).
    gaps = [steps[s]["logprob_gap_mean"] for s in (7, 8, 9, 10) if steps[s]["logprob_gap_mean"] is not None]
    assert len(gaps) == 4 and max(gaps) < 1e-3, gaps  # every group is trained: each step has its gap
    assert any(m.get("alarm/rollback_to") == best_at_6 for m in metrics)
    assert (cfg.run_dir / "checkpoints" / "step_000010").is_dir()  # the clean stop wrote its checkpoint
