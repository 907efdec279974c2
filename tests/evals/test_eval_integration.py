"""`posttrain eval` / `posttrain compare` on real checkpoints with one shared in-process vLLM engine.

Checkpoints: the SFT-warm model (A); A with small weight noise (a "seed-noise" twin: 20% of each tensor's std,
which changes ~15 of 200 greedy answers in both directions); A with heavy weight noise (a degraded checkpoint:
200% of each tensor's std, which leaves at most half of A's held-out accuracy on any CPU: degraded by
construction, checked before the verdict is, rather than by the luck of one trajectory; 100% was not enough on an
AMD EPYC, where it left the gate at "no significant change"). The in-process evaluator fills a
results cache; the CLI subprocess runs then read it, so they test the real command and the cache without
starting a second engine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from posttrain.evals.runner import EngineSettings, ModelEvaluator
from posttrain.models.loading import model_content_hash

pytestmark = pytest.mark.integration

SUITES = ["addition"]  # built-in: addition-heldout (greedy, 200), addition-sampled (T=1, 100), addition-format (3)


def noisy_copy(src: str, dst: Path, rel_std: float, seed: int) -> str:
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    g = torch.Generator().manual_seed(seed)
    noisy = {k: (t + rel_std * t.float().std().nan_to_num(0) * torch.randn(t.shape, generator=g)).to(t.dtype)
             for k, t in tensors.items()}
    save_file(noisy, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return str(dst)


@pytest.fixture(scope="module")
def models(tmp_path_factory, warm_model_dir):
    root = tmp_path_factory.mktemp("eval-models")
    return {"warm": warm_model_dir, "twin": noisy_copy(warm_model_dir, root / "twin", 0.2, seed=1),
            "degraded": noisy_copy(warm_model_dir, root / "degraded", 2.0, seed=2)}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("eval-cache")


@pytest.fixture(scope="module")
def evaluator(cache_dir):
    return ModelEvaluator(EngineSettings(kind="vllm"), cache_dir)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "posttrain.cli", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ})


def test_fixed_seeds_give_identical_results_and_rerun_is_cached(evaluator, models, tmp_path, cache_dir):
    from posttrain.cli.eval import run_eval

    first = run_eval(models["warm"], SUITES, tmp_path / "a", evaluator)  # fills the cache (starts the engine)
    assert not any(s["cached"] for s in first["suites"])
    evaluator.cache_dir = None  # generate again on the same engine, same seeds
    try:
        again = run_eval(models["warm"], SUITES, tmp_path / "b", evaluator)
    finally:
        evaluator.cache_dir = cache_dir
    for s1, s2 in zip(first["suites"], again["suites"]):
        assert s1["records"] == s2["records"], f"{s1['suite']}: fixed seeds must reproduce every output"
    assert 0.02 < first["suites"][0]["summary"]["mean"] < 1
    rec = first["suites"][1]["records"][0]
    assert set(rec) == {"id", "prompt", "output", "score", "tokens"} and rec["tokens"] >= 1
    print(f"\neval throughput (vLLM, addition suites, {sum(len(s['records']) for s in first['suites'])} samples): "
          f"{first['throughput_samples_per_s']:.1f} samples/s")

    start = time.perf_counter()
    cached = run_eval(models["warm"], SUITES, tmp_path / "c", evaluator)
    assert time.perf_counter() - start < 2.0 and all(s["cached"] for s in cached["suites"])
    assert [s["records"] for s in cached["suites"]] == [s["records"] for s in first["suites"]]
    html = (tmp_path / "c" / "report.html").read_text()
    assert html.count("<svg") >= 4 and "addition-heldout" in html and "<script" not in html
    results = json.loads((tmp_path / "c" / "results.json").read_text())
    assert results["model_hash"] == model_content_hash(models["warm"])
    assert results["suites"][0]["summary"]["se"] > 0


def compare_verdicts(evaluator, models, b: str, out: Path):
    from posttrain.cli.eval import run_compare

    rows, md = run_compare(models["warm"], models[b], SUITES, out, evaluator, margin=0.02, alpha=0.05, seed=0)
    print(f"\ncompare warm -> {b}:\n{md}")
    return {r.suite: r for r in rows}


def test_compare_flags_a_degraded_checkpoint(evaluator, models, tmp_path, cache_dir):
    rows = compare_verdicts(evaluator, models, "degraded", tmp_path)
    heldout = rows["addition-heldout"]
    assert heldout.mean_b <= heldout.mean_a / 2, f"the degraded checkpoint is not degraded enough: {heldout}"
    assert heldout.verdict == "regressed" and heldout.ci_high < 0 and heldout.test.startswith("mcnemar")
    assert heldout.losses > heldout.wins
    # The real CLI, reading the cache the run above filled: exit 1, the markdown table on stdout.
    done = cli("compare", models["warm"], models["degraded"], "--suite", "addition", "--margin", "0.02",
               "--out", str(tmp_path / "cli"), "--cache-dir", str(cache_dir))
    assert done.returncode == 1, done.stderr
    assert "| addition-heldout |" in done.stdout and "FAIL" in done.stdout
    assert (tmp_path / "cli" / "report.html").read_text().count("biggest losses of B") >= 1


def test_compare_passes_a_seed_noise_twin(evaluator, models, tmp_path, cache_dir):
    rows = compare_verdicts(evaluator, models, "twin", tmp_path)
    assert all(r.verdict != "regressed" for r in rows.values())
    heldout = rows["addition-heldout"]
    assert heldout.wins + heldout.losses > 0, "the twin should differ from A on some samples"
    assert heldout.ci_low < 0.02 and heldout.ci_high > -0.02  # the CI reaches inside the +-margin band
    done = cli("compare", models["warm"], models["twin"], "--suite", "addition", "--margin", "0.02",
               "--out", str(tmp_path / "cli"), "--cache-dir", str(cache_dir))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS" in done.stdout
    summary = json.loads((tmp_path / "cli" / "comparison.json").read_text())
    assert {s["suite"] for s in summary["suites"]} == {"addition-heldout", "addition-sampled", "addition-format"}


def test_eval_cli_user_errors_exit_2(tmp_path, models):
    bad = tmp_path / "bad.yaml"
    bad.write_text("suites:\n  - {name: s, kind: generation, scorer: {type: reward_model}, samples: [{prompt: a}]}\n")
    done = cli("eval", "--model", models["warm"], "--suite", str(bad), "--out", str(tmp_path / "o"))
    assert done.returncode == 2
    assert "suite s, field scorer: bad options for scorer 'reward_model'" in done.stderr
    assert "Traceback" not in done.stderr
