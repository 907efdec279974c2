"""`posttrain probe`: the statistics worked out by hand, and the verdict of real probes (the tiny model on the real
engine and reward worker, through the CLI): no signal (exit 77 with next steps), a signal (exit 0), and a reward
that fails on every sample (exit 2, the failures shown, no traceback)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.probe_stats import expected_signal_share, pass_at, signal_share, source_stats, verdict

BIN = Path(sys.executable).parent


def test_signal_and_pass_at_k_by_hand():
    # 3 prompts x K=4: all fail; one of four passes; all pass.
    rewards = [0, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1]
    assert signal_share(rewards, 4) == pytest.approx(1 / 3)          # only the middle group differs
    assert pass_at([r == 1 for r in rewards], 4) == pytest.approx(((0 + 0.25 + 1) / 3, 2 / 3))
    # group size 2 from rates 0, 1/4, 1: only the middle prompt can differ, with 1 - (1/4)^2 - (3/4)^2 = 6/16.
    assert expected_signal_share([r == 1 for r in rewards], 4, 2) == pytest.approx((6 / 16) / 3)
    s = source_stats([1.0, None, 0.0, 0.0])                         # None: the function did not apply
    assert (s.mean, s.scored, s.nonzero, s.maximum) == pytest.approx((1 / 3, 3, 1 / 3, 1.0))
    assert s.std == pytest.approx((((1 - 1 / 3) ** 2 + 2 * (1 / 3) ** 2) / 3) ** 0.5)


def test_the_verdict_rules():
    assert verdict(0.0, 0.0, 0.0, 1.0, 8).name == "reward-fails"
    none = verdict(0.0, 0.0, 0.5, 0.0, 8)
    assert none.name == "no-signal" and "max_new_tokens: 50%" in none.next_steps[0]
    assert any("SFT" in s for s in none.next_steps) and any("partial credit" in s for s in none.next_steps)
    assert verdict(0.1, 0.1, 0.0, 0.0, 8).name == "weak-signal"
    assert verdict(0.5, 0.95, 0.0, 0.0, 8).name == "too-easy"
    assert verdict(0.5, 0.4, 0.0, 0.0, 8).next_steps == [] and verdict(0.5, 0.4, 0.0, 0.0, 8).name == "ok"


FAILING = '''
def always_raises(prompts, completions, **kwargs):
    raise KeyError("score")
'''


def _probe(tmp: Path, model: str, name: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "posttrain"), "probe", f"name={name}", f"runs_dir={tmp}", f"model.path={model}",
                           "rollout.engine=hf", "task.heldout_size=8", "--prompts", "6", "--k", "4", *extra],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.integration
def test_real_probes_give_their_verdicts(tmp_path, tiny_model_dir):
    # The random tiny model never answers an addition: the verifier alone gives no group any signal.
    none = _probe(tmp_path, tiny_model_dir, "none")
    assert none.returncode == 77, none.stdout + none.stderr
    assert "verdict: no-signal" in none.stdout and "warm-start with SFT" in none.stdout
    assert "pass@1 0.0%   pass@4 0.0%" in none.stdout
    saved = json.loads((tmp_path / "none" / "probe.json").read_text())
    assert saved["signal_share"] == 0.0 and saved["k"] == 4 and saved["prompts"] == 6
    assert "no-signal" in (tmp_path / "none" / "probe.html").read_text()
    # The length source varies within groups (EOS comes at different points): a signal.
    some = _probe(tmp_path, tiny_model_dir, "some", "reward.weights={length: 1.0}")
    assert some.returncode == 0, some.stdout + some.stderr
    assert "verdict: ok" in some.stdout or "verdict: weak-signal" in some.stdout
    assert json.loads((tmp_path / "some" / "probe.json").read_text())["signal_share"] > 0
    # A reward function that raises on every sample: exit 2, the failure named, no traceback.
    (tmp_path / "bad.py").write_text(FAILING)
    bad = _probe(tmp_path, tiny_model_dir, "bad", "reward.weights={verifier: 0.0}",
                 f"reward.functions=[{{name: bad, fn: {tmp_path / 'bad.py'}:always_raises}}]")
    assert bad.returncode == 2, bad.stdout + bad.stderr
    assert "the reward failed on every one of the 24 samples" in " ".join(bad.stderr.split())
    assert "raised KeyError: 'score'" in bad.stdout + bad.stderr
    assert "Traceback" not in bad.stdout + bad.stderr
