"""The run_reward suite (evals/run_suite.py): `posttrain eval --from-run` on a run directory as `posttrain train`
writes it (config.yaml, then the reward functions' sha256 appended), with the tiny model on the transformers engine:
the run's held-out split, the run's reward composed as in training, one batch call per suite, the cache, compare,
the in-loop evaluator and best.json, and each bad input as one message."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from posttrain.cli import app
from posttrain.config import dump_config, load_config
from posttrain.errors import PosttrainError
from posttrain.rewards.functions import check_functions, record_sources
from posttrain.tasks import load_task

MODULE = '''
from pathlib import Path

def always_one(prompts, completions, **kwargs):  # batch form; logs each call's batch size beside this file
    with open(Path(__file__).with_suffix(".calls"), "a") as f:
        f.write(f"{len(completions)}\\n")
    return [1.0] * len(completions)

def half_on_even(prompt, completion):            # per sample; None (does not apply) on odd rows
    return 0.5 if "even" in prompt else None
'''


def make_run(tmp: Path, module: str = MODULE) -> tuple[Path, Path]:
    """A run directory as `posttrain train` leaves it at start; returns (run dir, the functions' file)."""
    fn = tmp / "fns.py"
    fn.write_text(module)
    data = tmp / "data.jsonl"
    data.write_text("".join(json.dumps({"id": f"r{i}", "prompt": f"{i} {'even' if i % 2 == 0 else 'odd'}:",
                                        "answer": str(i)}) + "\n" for i in range(8)))
    cfg = load_config(None, [
        "name=r", f"runs_dir={tmp / 'runs'}", "task.name=jsonl", f"task.path={data}", "task.heldout_size=4",
        "seed=3", "reward.weights={verifier: 0}",
        f"reward.functions=[{{name: always_one, fn: '{fn}:always_one', weight: 2}}, "
        f"{{name: half_on_even, fn: '{fn}:half_on_even'}}]",
    ])
    run = cfg.run_dir
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(dump_config(cfg))
    record_sources(run / "config.yaml", check_functions(cfg.reward.functions))
    return run, fn


@pytest.fixture(scope="module")
def runner():
    return CliRunner()


def test_eval_from_run_scores_the_heldout_split_with_the_runs_reward(tmp_path, tiny_model_dir, runner):
    run, fn = make_run(tmp_path)
    cfg = load_config(run / "config.yaml")
    heldout = load_task(cfg.task, cfg.seed).heldout  # the split the loop evaluates on
    even = sum("even" in p.prompt for p in heldout)
    assert len(heldout) == 4 and even >= 1
    args = ["eval", "--model", tiny_model_dir, "--from-run", str(run), "--out", str(tmp_path / "out"),
            "--engine", "hf", "--cache-dir", str(tmp_path / "cache"), "--quiet"]
    result = runner.invoke(app, args)
    print(result.output)
    assert result.exit_code == 0, result.output
    (suite,) = json.loads((tmp_path / "out" / "results.json").read_text())["suites"]
    assert suite["suite"] == "run_reward" and [r["id"] for r in suite["records"]] == [p.id for p in heldout]
    # reward = 0 * verifier + 2 * always_one (1.0) + half_on_even (0.5 on even rows, None adds nothing on odd ones)
    by_id = {p.id: p for p in heldout}
    for r in suite["records"]:
        assert r["score"] == (2.5 if "even" in by_id[r["id"]].prompt else 2.0), r
        assert r["components"]["always_one"] == 1.0 and "errors" not in r
    s = suite["summary"]
    assert s["mean"] == pytest.approx(2 + 0.5 * even / 4)
    assert s["components"]["always_one"] == {"mean": 1.0, "se": 0.0, "n": 4, "ci_low": 1.0, "ci_high": 1.0}
    assert s["components"]["half_on_even"] == {"mean": 0.5, "se": 0.0, "n": even, "ci_low": 0.5, "ci_high": 0.5}
    assert 0.0 <= s["components"]["verifier"]["mean"] <= 1.0 and s["failures"]["always_one"] == 0
    assert (tmp_path / "fns.calls").read_text().split() == ["4"]  # the batch function: one call for the suite
    assert re.search(r"run_reward\s+2\.\d{3} \+- 0\.\d{3}  95% CI \[\d\.\d{3}, 2\.\d{3}\]  \(n=4\)", result.output)
    assert re.search(r"always_one\s+1\.000 \+- 0\.000  95% CI \[1\.000, 1\.000\]  \(n=4\)", result.output)

    again = runner.invoke(app, args)  # cached: the functions are not called again
    assert again.exit_code == 0 and "(n=4, cached)" in again.output
    assert (tmp_path / "fns.calls").read_text().split() == ["4"]

    copy = tmp_path / "copy"
    shutil.copytree(tiny_model_dir, copy)
    cmp = runner.invoke(app, ["compare", tiny_model_dir, str(copy), "--from-run", str(run), "--out",
                              str(tmp_path / "cmp"), "--engine", "hf", "--cache-dir", str(tmp_path / "cache"),
                              "--quiet"])
    assert cmp.exit_code == 0 and "run_reward" in cmp.output, cmp.output


def test_the_in_loop_evaluator_gates_on_the_runs_reward(tmp_path, tiny_model_dir):
    """eval.suites: [run_reward]: the evaluator actor's class builds the suite from the run, the gate logs each
    source's mean and best.json points at the evaluated checkpoint."""
    from posttrain.evals.in_loop import CheckpointEvaluator, InLoopEval
    from posttrain import checkpoint as ckpt

    run, _ = make_run(tmp_path)
    evaluator = CheckpointEvaluator(["run_reward"], {"kind": "hf"}, None, run_dir=str(run))
    result = evaluator.evaluate(2, tiny_model_dir)
    cfg = load_config(run / "config.yaml", ["eval.suites=[run_reward]"])
    record = InLoopEval(cfg, actor=None, log=lambda m: None)._gate(result, run / "checkpoints" / "step_000002")
    assert record["eval/run_reward/always_one/mean"] == 1.0 and record["eval/run_reward/half_on_even/mean"] == 0.5
    assert record["eval/score"] == record["eval/run_reward/mean"] >= 2.0 and record["eval/is_best"] == 1
    assert ckpt.read_best_pointer(run)["step"] == 2


def test_read_run_refuses_a_changed_function_unless_allowed(tmp_path):
    from posttrain.evals.run_suite import read_run

    run, fn = make_run(tmp_path)
    old = re.search(r"sha256 ([0-9a-f]{64})", (run / "config.yaml").read_text()).group(1)
    fn.write_text(MODULE + "# edited\n")
    with pytest.raises(PosttrainError, match=rf"reward function 'always_one' \({fn}\) changed since the run: sha256 "
                       rf"{old} \(run\) -> [0-9a-f]{{64}} \(now\)"):
        read_run(run)
    warnings = []
    _, sources, _task = read_run(run, allow_changed=True, warn=warnings.append)
    assert len(warnings) == 2 and "--allow-changed-reward" in warnings[0] and sources["always_one"] != old


@pytest.mark.parametrize("args,expect", [
    (["--suite", "run_reward"], "--suite run_reward: this suite is built from a run's config"),
    ([], "give --suite (a suite file or built-in name) or --from-run"),
])
def test_run_reward_needs_a_run(tmp_path, tiny_model_dir, runner, args, expect):
    result = runner.invoke(app, ["eval", "--model", tiny_model_dir, "--out", str(tmp_path / "o"), *args])
    assert result.exit_code == 2 and expect in " ".join(result.output.split()), result.output


@pytest.mark.integration
def test_a_run_with_eval_suites_run_reward_gates_on_its_own_reward(tmp_path, tiny_model_dir, ray_session):
    """The real loop: Ray, the evaluator actor resolving run_reward against the run being trained (its config.yaml
    and functions), eval/run_reward/<source>/mean in metrics.jsonl for the starting model (step 0) and the final
    checkpoint, which is gated against step 0; best.json pointing at the final checkpoint; a resume evaluates the
    start no more."""
    import time

    from posttrain.loop import train
    from posttrain.tracking import read_metrics
    from posttrain import checkpoint as ckpt

    fn = tmp_path / "fns.py"
    fn.write_text(MODULE)
    cfg = load_config(None, [
        "name=gated", f"runs_dir={tmp_path}", f"model.path={tiny_model_dir}", "rollout.engine=hf",
        "task.train_size=64", "task.heldout_size=4", "algorithm.prompts_per_step=2", "algorithm.group_size=4",
        "algorithm.kl_coef=0", "eval.every=0", "train.steps=2", "checkpoint.every=0", "logging.progress=false",
        f"reward.functions=[{{name: always_one, fn: '{fn}:always_one', weight: 2}}]", "eval.suites=[run_reward]",
    ])
    t = time.perf_counter()
    summary = train(cfg, progress=False)
    print(f"2-step run with eval.suites=[run_reward]: {time.perf_counter() - t:.1f} s")
    evals = {m["step"]: m for m in read_metrics(cfg.run_dir) if "eval/score" in m}
    assert sorted(evals) == [0, 2]  # the starting model (step 0), then the final checkpoint
    for m in evals.values():  # reward = verifier (0 or 1 per held-out problem) + 2 * always_one (1.0 on all 4)
        assert m["eval/run_reward/always_one/mean"] == 1.0
        assert m["eval/run_reward/verifier/mean"] in (0, .25, .5, .75, 1)
        assert m["eval/score"] == m["eval/run_reward/mean"] == pytest.approx(2.0 + m["eval/run_reward/verifier/mean"])
    start = json.loads((cfg.run_dir / "evals" / "step_000000" / "results.json").read_text())
    assert start["model_dir"] == tiny_model_dir and start["step"] == 0  # the unchanged starting weights
    # the first checkpoint's gate pairs with step 0 (the same 4 held-out problems: the paired diff is the gain)
    first = evals[2]
    assert first["eval/vs_previous/run_reward/diff"] == pytest.approx(first["eval/score"] - evals[0]["eval/score"])
    gate = json.loads((cfg.run_dir / "checkpoints" / "step_000002" / "gate.json").read_text())
    assert "vs previous: run_reward" in gate["reason"]
    assert first["eval/vs_start/run_reward/diff"] == first["eval/vs_previous/run_reward/diff"]
    best = ckpt.read_best_pointer(cfg.run_dir)  # the start is the baseline, never the best: best is a checkpoint
    assert best["step"] == first["eval/best_step"] == 2 and best["checkpoint"] == "step_000002"
    assert [e["step"] for e in summary["eval_scores"]] == [0, 2] and summary["best_eval"] == best
    # a resume evaluates its new checkpoints only: step 0 is neither evaluated again nor logged twice
    before = (cfg.run_dir / "evals" / "step_000000" / "results.json").stat().st_mtime_ns
    train(load_config(cfg.run_dir / "config.yaml", ["train.steps=3"]), resume=True, progress=False)
    steps = [m["step"] for m in read_metrics(cfg.run_dir) if "eval/score" in m]
    assert sorted(steps) == [0, 2, 3], steps
    assert (cfg.run_dir / "evals" / "step_000000" / "results.json").stat().st_mtime_ns == before


COLUMN_MODULE = '''
def by_parity(prompt, completion, parity):  # per sample, takes the dataset's own column by name
    return 1.0 if parity == "even" else 0.0
'''


def test_run_reward_gives_the_datasets_columns_to_the_runs_functions(tmp_path):
    """A function that requires a dataset column loads (as the loop's start check allows it) and gets each row's
    value, in the driver (`--from-run`) and so in the evaluator actor, which builds the same suite."""
    from posttrain.evals.run_suite import run_suite

    fn = tmp_path / "cols.py"
    fn.write_text(COLUMN_MODULE)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"id": f"r{i}", "prompt": f"{i}:", "answer": str(i),
                                        "parity": "even" if i % 2 == 0 else "odd"}) + "\n" for i in range(8)))
    cfg = load_config(None, [
        "name=c", f"runs_dir={tmp_path / 'runs'}", "task.name=dataset", f"task.path={data}", "task.heldout_size=4",
        "seed=3", "reward.weights={verifier: 0}", f"reward.functions=[{{name: parity, fn: '{fn}:by_parity'}}]"])
    cfg.run_dir.mkdir(parents=True)
    (cfg.run_dir / "config.yaml").write_text(dump_config(cfg))
    suite = run_suite(cfg.run_dir)
    rows = [{"prompt": s["prompt"], "output": "x", "record": s, "tokens": 1, "id": s["id"]} for s in suite.samples]
    scores, _extras = suite.score.batch(rows)
    assert scores == [1.0 if int(s["id"][1:]) % 2 == 0 else 0.0 for s in suite.samples]
    assert {s["columns"]["parity"] for s in suite.samples} <= {"even", "odd"}
