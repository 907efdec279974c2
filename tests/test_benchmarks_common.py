"""benchmarks/common.py's pure pieces, checked by hand: the median, the order of alternating rounds, a markdown table,
the results JSON, and the matched builder giving posttrain and TRL the same values."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import SimpleNamespace

BENCH = Path(__file__).parents[1] / "benchmarks"


def _common():
    spec = importlib.util.spec_from_file_location("bench_common", BENCH / "common.py")
    mod = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # its dataclasses look themselves up there
    spec.loader.exec_module(mod)
    return mod


common = _common()


def test_median():
    assert common.median([3, 1, 2]) == 2
    assert common.median([4, 1, 3, 2]) == 2.5
    assert common.median(x for x in (None, 5, 1)) == 3  # None left out, any iterable
    assert common.median([]) is None
    assert math.isnan(common.median([None], empty=float("nan")))


def test_round_order_alternates_and_rotates():
    assert [common.round_order(("a", "b"), r) for r in range(3)] == [("a", "b"), ("b", "a"), ("a", "b")]
    assert [common.round_order(("x", "y", "z"), r) for r in range(4)] == [
        ("x", "y", "z"), ("y", "z", "x"), ("z", "x", "y"), ("x", "y", "z")]
    assert common.round_ratios([1.0, 3.0], [2.0, 4.0]) == [0.5, 0.75]


def test_markdown_table_of_two_rows():
    table = common.md_table(["size", "step s", "ratio"], [["4m", "0.50", ""], ["94m", 2, "0.25"]])
    assert table == ("| size | step s | ratio |\n"
                     "|---|---|---|\n"
                     "| 4m | 0.50 |  |\n"
                     "| 94m | 2 | 0.25 |")


def test_results_json_written_whole(tmp_path):
    path = tmp_path / "results" / "x.json"
    common.write_json(path, {"a": [1, 2]})
    assert path.read_text() == '{\n "a": [\n  1,\n  2\n ]\n}\n'
    common.write_json(path, {"b": 1}, indent=None, end="")
    assert path.read_text() == '{"b": 1}'
    assert common.read_json(path) == {"b": 1} and common.read_json(tmp_path / "none.json", {}) == {}
    assert [p.name for p in path.parent.iterdir()] == ["x.json"]  # no temporary file left beside it


def _matched(**kw):
    return common.Matched(prompts_per_step=3, group_size=4, max_new_tokens=16, kl_coef=0.04, lr=2e-5, clip_eps=0.2,
                          torch_threads=2, seed=7, reward=f"{BENCH / 'workload_rewards.py'}:vowel_share", **kw)


def test_matched_builder_gives_both_sides_the_same_values():
    from posttrain.config import load_config

    batches = [[SimpleNamespace(prompt=f"{i}+{j}=", answer=str(i + j)) for j in range(3)] for i in range(5)]
    for lora in (None, {"r": 8, "alpha": 16.0, "dropout": 0.0, "target_modules": "all-linear"}):
        m = _matched(lora=lora)
        cfg = load_config(None, ["model.path=/nonexistent", *m.posttrain_overrides()])
        spec = m.trl_spec("/nonexistent", batches, "/tmp/out")
        trl = common.trl_grpo_args(spec)
        a, r = cfg.algorithm, cfg.rollout
        assert (a.name, a.lr_schedule, a.loss_agg) == ("grpo", "constant", "token")
        assert trl["per_device_train_batch_size"] == a.prompts_per_step * a.group_size == 12
        assert trl["num_generations"] == a.group_size == 4
        assert trl["max_completion_length"] == r.max_new_tokens == 16
        assert trl["beta"] == a.kl_coef == 0.04
        assert trl["learning_rate"] == a.lr == 2e-5 and trl["lr_scheduler_type"] == "constant"
        assert trl["epsilon"] == a.clip_eps == 0.2 and trl["num_iterations"] == 1
        assert trl["max_grad_norm"] == a.max_grad_norm == 1.0
        assert trl["temperature"] == r.temperature == 1.0 and trl["top_p"] == r.top_p == 1.0
        assert trl["seed"] == cfg.seed == 7
        assert cfg.topology.torch_threads == spec["torch_threads"] == 2
        assert trl["max_steps"] == 5 and spec["batches"][1][2] == {"prompt": "1+2=", "answer": "3"}
        assert [f.fn for f in cfg.reward.functions] == [spec["reward"]] and cfg.reward.weights == {}
        if lora:
            assert {k: getattr(cfg.model.lora, k) for k in lora} == lora == spec["peft"]
        else:
            assert spec["peft"] is None


def test_matched_builtin_reward_leaves_posttrain_on_the_task_verifier():
    overrides = _matched(reward_builtin=True).posttrain_overrides()
    assert not [o for o in overrides if o.startswith("reward.")]


def test_seeded_rounds_alternate_the_sides_and_keep_each_result_as_it_comes(tmp_path):
    results_path = tmp_path / "r.json"
    common.write_json(results_path, {"runs": [{"side": "a", "seed": 1, "v": "old"}, {"side": "b", "seed": 9}]})
    order, on_disk = [], []

    def run_one(side, seed):
        order.append((side, seed))
        on_disk.append(len(common.read_json(results_path)["runs"]))  # what a stopped benchmark would have kept
        return {"side": side, "seed": seed, "v": f"{side}{seed}"}

    results = common.run_seeded_rounds(results_path, ("a", "b"), [0, 1], "side", run_one, lambda msg: None)
    assert order == [("a", 0), ("b", 0), ("b", 1), ("a", 1)]  # who goes first swaps every seed
    assert on_disk == [2, 3, 4, 5]  # a: the old (a, 1) is replaced only when its rerun comes
    assert sorted((r["side"], r["seed"], r.get("v")) for r in results["runs"]) == [
        ("a", 0, "a0"), ("a", 1, "a1"), ("b", 0, "b0"), ("b", 1, "b1"), ("b", 9, None)]
    assert common.read_json(results_path) == results and "machine" in results
    assert {r.get("cpu") for r in results["runs"] if r["seed"] != 9} == {results["machine"]["cpu"]}  # each run's CPU


def _benchmark(name: str):
    """benchmarks/<name>.py as a module; it imports `common` (and its siblings) as a benchmark run does."""
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(BENCH))


def test_the_suite_time_report_sums_each_file_from_a_junit_report(tmp_path):
    suite_time = _benchmark("suite_time")
    report = tmp_path / "report.xml"
    report.write_text(
        '<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="1" failures="1" '
        'skipped="0" tests="4" time="100.5">'
        '<testcase classname="tests.test_a" name="test_one" time="10.0"/>'
        '<testcase classname="tests.test_a" name="test_two[x]" time="2.5"><failure message="m"/></testcase>'
        '<testcase classname="tests.evals.test_b.TestGroup" name="test_three" time="40.0"/>'
        '<testcase classname="tests.evals.test_b" name="test_four" time="0.25"><error message="e"/></testcase>'
        '</testsuite></testsuites>')
    got = suite_time.read_report(report)
    assert (got["wall_s"], got["tests"], got["failures"]) == (100.5, 4, 2)
    assert got["files"] == {"tests/evals/test_b.py": 40.25, "tests/test_a.py": 12.5}  # costliest first
    assert list(got["files"]) == ["tests/evals/test_b.py", "tests/test_a.py"]
    assert list(got["slowest"].items())[0] == ("tests/evals/test_b.py::test_three", 40.0)
    assert suite_time.read_cpu_share(tmp_path / "test-cpu.json") == {}  # a run from before the file existed
    (tmp_path / "test-cpu.json").write_text('{"wall_s": 100.0, "cpu_share": 1.62, "cores": 2, "workers": 2}')
    assert suite_time.read_cpu_share(tmp_path / "test-cpu.json") == {"cpu_share": 1.62, "workers": 2}


def test_the_real_model_comparison_reads_the_first_step_at_the_target_and_the_seconds_until_it():
    real_model_trl = _benchmark("real_model_trl")
    step_seconds = {1: 10.0, 2: 12.0, 3: 11.0, 4: 9.0, 5: 30.0}
    curve = {0: 0.2, 2: 0.25, 4: 0.3, 6: 0.9}
    got = real_model_trl.gain(curve, step_seconds, 0.10)  # 0.3 == 0.2 + 0.10 up to rounding
    assert (got["gain_step"], got["step_s_to_gain"]) == (4, 42.0)  # 10 + 12 + 11 + 9
    assert got["step_s_median"] == 11.0 and got["steps_run"] == 5
    assert got["heldout"] == {"0": 0.2, "2": 0.25, "4": 0.3, "6": 0.9}
    never = real_model_trl.gain({0: 0.2, 2: 0.29}, step_seconds, 0.10)
    assert never["gain_step"] is None and never["step_s_to_gain"] is None
    # a recorded run (str keys, as read back from JSON) timed at another target: +50 points first at step 6
    recorded = {**got, "heldout": {"0": 0.2, "2": 0.25, "4": 0.3, "6": 0.9},
                "step_seconds": {"1": 10.0, "2": 12.0, "3": 11.0, "4": 9.0, "5": 30.0, "6": 8.0}}
    plus50 = real_model_trl.at_target(recorded, 0.50)
    assert (plus50["gain_step"], plus50["step_s_to_gain"], plus50["target_delta"]) == (6, 80.0, 0.50)
