"""Resume edge cases other stacks have got wrong, each with `posttrain train` as a real subprocess:

- a resume exactly at the end of a pass over the training data: the data cursor wraps into the second pass and the
  resumed steps train (not a resume that silently trains 0 steps), on the prompts and sample ids of a straight run;
- a resume after the dataset file changed: refused with one message naming both fingerprints, the file and the row
  counts, unless `--allow-data-change`, which resumes and records the change;
- a resume with another `rollout.num_workers`: the same samples as the straight run. The engine is hf: a sample
  depends on its seed alone, whichever worker draws it (vLLM may round differently when its batch differs,
  docs/reliability.md), so the check is equality.

The end-of-pass and worker-count runs are the straight run's first checkpoint copied into a run dir of their own (the
state a run killed right after that checkpoint leaves), then resumed. The model is the untrained tiny one, rewarded
for the share of digits it writes (a signal in every group from the first step, without the SFT warm start's
minutes on a loaded machine)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from posttrain.config import load_config
from posttrain.rollout.sampler import Cursor, PromptSampler, data_fingerprint
from posttrain.tasks import load_task
from posttrain.tracking import read_metrics

from test_reliability_driver import _write_config as write_reliability_config  # noqa: E402

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
PROMPTS_PER_STEP = 4
PASS_STEPS = 2  # the training split is exactly this many steps' worth of prompts
STEPS = PASS_STEPS + 2


DIGIT_SHARE = ("def digit_share(prompt, completion):\n"
               "    return sum(c.isdigit() for c in completion) / max(len(completion), 1)\n")


def _write_config(tmp: Path, model_dir: str, name: str, sections: dict | None = None) -> Path:
    """The reliability tests' config (test_reliability_driver._write_config), with a training split of exactly
    PASS_STEPS steps' worth of prompts and a reward that varies within groups."""
    (tmp / "reward.py").write_text(DIGIT_SHARE)
    ours = {
        "task": {"train_size": PASS_STEPS * PROMPTS_PER_STEP, "heldout_size": 8},
        "algorithm": {"prompts_per_step": PROMPTS_PER_STEP},
        "rollout": {"max_new_tokens": 8},
        "reward": {"functions": [{"name": "digit_share", "fn": f"{tmp / 'reward.py'}:digit_share"}]},
        "train": {"steps": STEPS},
        "eval": {"max_new_tokens": 8},
        "checkpoint": {"every": PASS_STEPS},
    }
    extra = {k: {**ours.get(k, {}), **v} if isinstance(v, dict) else v for k, v in (sections or {}).items()}
    return write_reliability_config(tmp, model_dir, name, {**ours, **extra})


def _train(config: Path, *args: str, timeout: int = 300) -> tuple[int, str]:
    r = subprocess.run([str(BIN / "posttrain"), "train", str(config), "--quiet", *args], capture_output=True,
                       text=True, timeout=timeout)
    return r.returncode, r.stdout + r.stderr


def _samples(run_dir: Path) -> dict[int, list]:
    """step -> its [sample id, completion, reward] rows from samples.jsonl (ids are step/prompt_id/sample_index)."""
    lines = (run_dir / "samples.jsonl").read_text().splitlines()
    return {rec["step"]: rec["samples"] for rec in map(json.loads, lines)}


def _prompt_ids(rows: list) -> list[str]:
    """The prompt ids of a step's samples, in the order the step drew them."""
    return list(dict.fromkeys(sid.split("/", 1)[1].rsplit("/", 1)[0] for sid, _, _ in rows))


def _weights(run_dir: Path, step: int) -> dict:
    return load_file(str(run_dir / "checkpoints" / f"step_{step:06d}" / "model" / "model.safetensors"))


def _copy_until(src: Path, dst: Path, step: int) -> None:
    """dst as a run killed right after checkpoint `step` leaves it: that checkpoint, and the metrics and samples
    of steps up to it."""
    name = f"step_{step:06d}"
    shutil.copytree(src / "checkpoints" / name, dst / "checkpoints" / name)
    for log in ("metrics.jsonl", "samples.jsonl"):
        kept = [l for l in (src / log).read_text().splitlines() if json.loads(l).get("step", 0) <= step]
        (dst / log).write_text("".join(l + "\n" for l in kept))


@pytest.fixture(scope="module")
def straight(tmp_path_factory, tiny_model_dir):
    tmp = tmp_path_factory.mktemp("resume-edges")
    code, log = _train(_write_config(tmp, tiny_model_dir, "straight"))
    assert code == 0, log[-3000:]
    return tmp, tmp / "straight"


def _resume_from_end_of_pass(straight, tiny_model_dir, name: str, sections: dict | None = None) -> Path:
    tmp, straight_dir = straight
    _copy_until(straight_dir, tmp / name, PASS_STEPS)
    code, log = _train(_write_config(tmp, tiny_model_dir, name, sections), "--resume")
    assert code == 0, log[-3000:]
    return tmp / name


def test_resume_at_the_end_of_a_pass_wraps_the_cursor_and_trains(straight, tiny_model_dir):
    tmp, straight_dir = straight
    run_dir = _resume_from_end_of_pass(straight, tiny_model_dir, "wrap")
    saved = json.loads((run_dir / "checkpoints" / f"step_{PASS_STEPS:06d}" / "state.json").read_text())
    assert saved["cursor"] == {"epoch": 0, "offset": PASS_STEPS * PROMPTS_PER_STEP}, "not at the end of the pass"

    steps = [m["step"] for m in read_metrics(run_dir) if "time/step" in m]
    assert steps == list(range(1, STEPS + 1)), "the resumed steps must train"
    assert any((_weights(run_dir, PASS_STEPS)[k] != w).any() for k, w in _weights(run_dir, STEPS).items())
    final = json.loads((run_dir / "checkpoints" / f"step_{STEPS:06d}" / "state.json").read_text())
    assert final["step"] == STEPS and final["cursor"] == {"epoch": 1, "offset": (STEPS - PASS_STEPS) * PROMPTS_PER_STEP}

    # step PASS_STEPS + 1 trains on the first prompts of the second pass, as the sampler orders them
    cfg = load_config(str(tmp / "wrap.yaml"))
    second_pass = PromptSampler(load_task(cfg.task, cfg.seed).train, cfg.seed, Cursor(epoch=1, offset=0))
    got, straight_samples = _samples(run_dir), _samples(straight_dir)
    for step in range(PASS_STEPS + 1, STEPS + 1):
        assert _prompt_ids(got[step]) == [p.id for p in second_pass.next_batch(PROMPTS_PER_STEP)], step
    assert {s: [r[0] for r in rows] for s, rows in got.items()} == \
        {s: [r[0] for r in rows] for s, rows in straight_samples.items()}, "sample ids differ from the straight run's"


def test_resume_with_another_worker_count_draws_the_same_samples(straight, tiny_model_dir):
    """1 worker straight, 2 workers after the resume: num_workers changes who generates, not what (it is not in
    the config fingerprint that a resume checks)."""
    _, straight_dir = straight
    run_dir = _resume_from_end_of_pass(straight, tiny_model_dir, "two-workers", {"rollout": {"num_workers": 2}})
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["rollout"]["num_workers"] == 2
    got, want = _samples(run_dir), _samples(straight_dir)
    assert sorted(got) == list(range(1, STEPS + 1))
    for step in range(PASS_STEPS + 1, STEPS + 1):
        assert [r[:2] for r in got[step]] == [r[:2] for r in want[step]], f"step {step}: ids or completions differ"


def _rows(n: int) -> str:
    return "".join(json.dumps({"prompt": f"{i}+{i + 1}=", "answer": str(2 * i + 1)}) + "\n" for i in range(n))


def test_resume_after_the_dataset_changed_is_refused_unless_allowed(tmp_path, tiny_model_dir):
    data = tmp_path / "data.jsonl"
    data.write_text(_rows(12))
    config = _write_config(tmp_path, tiny_model_dir, "data", {
        "task": {"name": "jsonl", "path": str(data), "heldout_size": 4}, "train": {"steps": 1},
        "checkpoint": {"every": 1}})
    code, log = _train(config)
    assert code == 0, log[-3000:]
    cfg = load_config(str(config))
    old = data_fingerprint(load_task(cfg.task, cfg.seed).train)
    data.write_text(_rows(16))
    new = data_fingerprint(load_task(cfg.task, cfg.seed).train)

    code, log = _train(config, "train.steps=2", "--resume")
    message = " ".join(log.split())
    assert code == 2 and log.count("error:") == 1 and "Traceback" not in log, log[-3000:]
    assert f"task.path {data}" in message and f"fingerprint {old} -> {new}; training rows 8 -> 12" in message, message

    code, log = _train(config, "train.steps=2", "--resume", "--allow-data-change")
    assert code == 0, log[-3000:]
    assert log.count("--allow-data-change:") == 1, log[-3000:]
    run_dir = tmp_path / "data"
    assert [m["step"] for m in read_metrics(run_dir) if "time/step" in m] == [1, 2]
    change = {"step": 1, "checkpoint": str(run_dir / "checkpoints" / "step_000001"), "data": f"task.path {data}",
              "old_fingerprint": old, "new_fingerprint": new, "old_rows": 8, "new_rows": 12}
    assert json.loads((run_dir / "summary.json").read_text())["data_changes"] == [change]
    state = json.loads((run_dir / "checkpoints" / "step_000002" / "state.json").read_text())
    assert state["data_changes"] == [change] and state["data_fingerprint"] == new and state["data_rows"] == 12
