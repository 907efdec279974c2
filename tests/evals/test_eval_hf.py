"""The eval runner on the transformers engine (the --engine hf fallback): fast, no vLLM."""

from __future__ import annotations

import json
import shutil

import pytest

from posttrain.errors import PosttrainError
from posttrain.evals.runner import EngineSettings, ModelEvaluator
from posttrain.models.loading import model_content_hash

SUITE = """
suites:
  - name: echo
    kind: generation
    samples: [{id: a, prompt: "12+34=", answer: "46"}, {id: b, prompt: "sort:321=", answer: "123"}]
    scorer: {type: regex, pattern: ".*"}
    sampling: {temperature: 1.0, max_new_tokens: 6, n: 2, seed: 3}
  - name: fmt
    kind: regression
    cases: [{id: c, prompt: "1+1=", max_chars: 100}, {id: d, prompt: "2+2=", must_contain: ["zzz"]}]
"""


@pytest.fixture()
def suite_file(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(SUITE)
    return str(p)


def test_hf_eval_records_and_identical_models_compare_clean(tiny_model_dir, suite_file, tmp_path):
    from posttrain.cli.eval import run_compare, run_eval

    evaluator = ModelEvaluator(EngineSettings(kind="hf"), tmp_path / "cache")
    doc = run_eval(tiny_model_dir, [suite_file], tmp_path / "out", evaluator)
    echo, fmt = doc["suites"]
    assert [r["id"] for r in echo["records"]] == ["a#0", "a#1", "b#0", "b#1"]  # n=2: each completion a sample
    assert all(1 <= r["tokens"] <= 6 for r in echo["records"]) and echo["summary"]["mean"] == 1.0
    assert [r["failed"] for r in fmt["records"]] == [[], ["must_contain 'zzz'"]]
    assert fmt["summary"] == pytest.approx({"mean": 0.5, "se": 0.5, "n": 2, "mean_tokens": fmt["summary"]["mean_tokens"],
                                            "ci_low": 0.5 - 1.96 * 0.5, "ci_high": 0.5 + 1.96 * 0.5}, abs=1e-4)
    assert json.loads((tmp_path / "out" / "results.json").read_text())["suites"][1]["records"][1]["score"] == 0.0

    copy = tmp_path / "copy"
    shutil.copytree(tiny_model_dir, copy)
    assert model_content_hash(copy) == model_content_hash(tiny_model_dir)
    rows, md = run_compare(tiny_model_dir, str(copy), [suite_file], tmp_path / "cmp", evaluator,
                           margin=0.0, alpha=0.05, seed=0)
    assert all(r.verdict == "no significant change" and r.wins == r.losses == 0 for r in rows)
    assert "PASS" in md


def test_content_hash_follows_the_weights(tiny_model_dir, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(tiny_model_dir, copy)
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # one bit of one weight
    weights.write_bytes(bytes(data))
    assert model_content_hash(copy) != model_content_hash(tiny_model_dir)
    (tmp_path / "empty").mkdir()
    with pytest.raises(PosttrainError, match="no weight files"):
        model_content_hash(tmp_path / "empty")


def test_compare_refuses_models_of_different_architectures(tiny_model_dir, suite_file, tmp_path):
    from posttrain.cli.eval import run_compare
    from posttrain.models.tiny import build_tiny_model

    other = build_tiny_model(tmp_path / "tiny-4m", "4m", seed=0)
    evaluator = ModelEvaluator(EngineSettings(kind="hf"), None)
    with pytest.raises(PosttrainError, match="not one model family"):
        run_compare(tiny_model_dir, str(other), [suite_file], tmp_path / "cmp", evaluator, margin=0, alpha=0.05, seed=0)
