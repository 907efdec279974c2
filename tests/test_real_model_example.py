"""examples/real-model on the real SmolLM2-135M-Instruct file: the example's data are what its docstring says, and
`posttrain probe` on the example's own config (vLLM, its reward function in TRL's conversational form) says RL will
work (exit 0, a learning signal), while the task as the issue's user first wrote it (answer inside <answer> tags)
with too few tokens to ever close the tag has none (exit 77, with next steps)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
EXAMPLE = ROOT / "examples" / "real-model"

TAGGED = '''
def tagged(prompts, completions, answer, **kwargs):
    return [1.0 if f"<answer>{gold}</answer>" in c[0]["content"] else 0.0 for c, gold in zip(completions, answer)]
'''


def _make_data(out: Path) -> tuple[list[dict], list[dict]]:
    subprocess.run([sys.executable, str(EXAMPLE / "make_data.py"), str(out)], check=True, capture_output=True)
    read = lambda name: [json.loads(line) for line in (out / name).read_text().splitlines()]  # noqa: E731
    return read("train.jsonl"), read("test.jsonl")


def test_the_example_data_hold_out_pairs_never_trained_on(tmp_path):
    train, heldout = _make_data(tmp_path)
    assert (len(train), len(heldout)) == (276, 124)
    pair = lambda row: tuple(sorted(int(n) for n in __import__("re").findall(r"\d", row["prompt"][0]["content"])))  # noqa: E731
    assert not {pair(r) for r in train} & {pair(r) for r in heldout}
    assert all(int(r["answer"]) == sum(pair(r)) for r in train + heldout)


def _probe(tmp: Path, model: str, name: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "posttrain"), "probe", str(EXAMPLE / "config.yaml"), f"name={name}",
                           f"runs_dir={tmp}", f"model.path={model}", f"task.path={tmp / 'data' / 'train.jsonl'}",
                           f"task.heldout_path={tmp / 'data' / 'test.jsonl'}", "--prompts", "8", "--k", "8",
                           "--no-train-step", *extra], capture_output=True, text=True, timeout=600, cwd=ROOT)


@pytest.mark.integration
def test_probe_says_rl_works_on_the_example_and_not_on_the_tagged_task(tmp_path, smollm2_dir):
    _make_data(tmp_path / "data")
    model = smollm2_dir[0]
    ok = _probe(tmp_path, model, "example")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "verdict: ok" in ok.stdout or "verdict: weak-signal" in ok.stdout
    report = json.loads((tmp_path / "example" / "probe.json").read_text())
    assert report["signal_share"] >= 0.25 and 0.05 <= report["pass1"] <= 0.5, report
    (tmp_path / "tagged.py").write_text(TAGGED)
    none = _probe(tmp_path, model, "tagged", "rollout.max_new_tokens=4",
                  "task.system_prompt=Think step by step, then give the number inside <answer></answer> tags.",
                  f"reward.functions=[{{name: tagged, fn: {tmp_path / 'tagged.py'}:tagged}}]")
    assert none.returncode == 77, none.stdout + none.stderr
    assert "verdict: no-signal" in none.stdout and "max_new_tokens" in none.stdout
    assert json.loads((tmp_path / "tagged" / "probe.json").read_text())["signal_share"] == 0.0
