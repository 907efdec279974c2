"""Elastic rollout capacity (`rollout.num_workers: MIN..MAX`, rollout/elastic.py):

- the share bookkeeping, by hand: which prompts a departed worker leaves behind, and how their redone results
  slot back in prompt order;
- a real run on embedded Ray (hf engine, MIN 1, MAX 2, room for both): the extra worker joins at a step boundary,
  is SIGKILLed inside generate (a weight-0 reward function slows the steps until the extra has started, so the
  join never depends on how fast the machine is), the step completes on the worker left, the fleet shrinks
  (fleet/left, a worker_lost record) and may grow again; every sample id of every step exactly once, and the same prompts and
  samples as a run with the fleet fixed at one worker."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from collections import Counter

import psutil
import pytest

from posttrain.config import load_config
from posttrain.loop import train
from posttrain.remote.redo import LEFT
from posttrain.rollout.fleet import fill_left, left_prompts, split_evenly
from posttrain.rollout.sampler import PromptSampler
from posttrain.tasks import load_task
from posttrain.tracking import read_metrics
from posttrain.tracking.interruptions import read_interruptions
from pace_reward import install as install_pace  # a weight-0 reward function that slows the steps while held
from test_reliability_workers import _rollout_processes, _safe_metrics  # this test's Ray rollout processes

STEPS, PROMPTS, GROUP = 24, 8, 8  # the extra joins before step ~5-15 (ExtraKiller holds the steps until it started)


def test_a_departed_workers_prompts_are_redone_in_prompt_order():
    chunks = split_evenly(7, 3)
    assert chunks == [(0, 3), (3, 5), (5, 7)]
    parts = [["a", "b", "c"], LEFT, ["f", "g"]]
    assert left_prompts(chunks, parts) == [3, 4]
    assert fill_left(chunks, parts, ["d", "e"]) == [["a", "b", "c"], ["d", "e"], ["f", "g"]]
    # two shares lost: their prompts are redone together, in order, and handed back share by share
    parts = [LEFT, ["d", "e"], LEFT]
    assert left_prompts(chunks, parts) == [0, 1, 2, 5, 6]
    assert fill_left(chunks, parts, ["a", "b", "c", "f", "g"]) == [["a", "b", "c"], ["d", "e"], ["f", "g"]]
    assert left_prompts(chunks, [["a", "b", "c"], ["d", "e"], ["f", "g"]]) == []


class ExtraKiller(threading.Thread):
    """Holds the run's steps slow (a weight-0 reward function sleeps 1 s while `hold` exists) until the extra rollout
    worker has finished starting, so it joins with steps to spare however long its start takes on a loaded machine
    (4-14 s, while a step takes ~0.3 s); then, once a step ran on two workers, SIGKILLs the extra inside generate()."""

    def __init__(self, run_dir, hold):
        super().__init__(daemon=True)
        self.run_dir, self.hold = run_dir, hold
        self.killed: int | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            self._wait_for_the_extra_to_start()
        finally:
            self.hold.unlink(missing_ok=True)
        while not self.stop.is_set():
            if any(m.get("fleet/workers") == 2 for m in _safe_metrics(self.run_dir)):
                break
            time.sleep(0.01)
        procs = _rollout_processes()
        if len(procs) != 2:
            return
        extra = max(procs, key=lambda p: p.create_time())
        while not self.stop.is_set():  # its generate calls last ~20 ms: watch its title closely
            try:
                if "generate" in " ".join(extra.cmdline()):
                    os.kill(extra.pid, signal.SIGKILL)
                    self.killed = extra.pid
                    return
            except psutil.Error:
                return
            time.sleep(0.0005)

    def _wait_for_the_extra_to_start(self) -> None:
        """Until a second rollout worker process is past its constructor (its title is ray::RolloutWorker...)."""
        while not self.stop.is_set():
            procs = _rollout_processes()
            try:
                if len(procs) == 2 and "__init__" not in " ".join(max(procs, key=lambda p: p.create_time()).cmdline()):
                    return
            except psutil.Error:
                pass
            time.sleep(0.05)


def _config(tmp_path, name: str, *extra: str):
    pace, _ = install_pace(tmp_path / "pace")
    return load_config(None, [pace,
        f"name={name}", f"runs_dir={tmp_path}", f"model.path={extra[0]}", "rollout.engine=hf", "model.dtype=float64",
        f"algorithm.prompts_per_step={PROMPTS}", f"algorithm.group_size={GROUP}", "algorithm.kl_coef=0",
        "task.heldout_size=16", "eval.every=0", "checkpoint.every=0", f"train.steps={STEPS}", "logging.progress=false",
        *extra[1:],
    ])


def _samples(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]


@pytest.mark.integration
def test_an_extra_worker_joins_and_leaves_without_losing_a_sample(tmp_path, warm_model_dir, capsys, train_beside):
    cfg = _config(tmp_path, "elastic", warm_model_dir, "rollout.num_workers=1..2", "ray.num_cpus=4")
    _, hold = install_pace(tmp_path / "pace")
    hold.touch()
    killer = ExtraKiller(cfg.run_dir, hold)
    summary, elastic_s = train_beside(cfg, killer)
    err = capsys.readouterr().err
    assert summary["steps"] == STEPS
    assert killer.killed is not None, "the test never caught the extra worker inside generate()"

    steps = [m for m in read_metrics(cfg.run_dir) if "time/step" in m]
    workers = [m["fleet/workers"] for m in steps]
    joins = [m["step"] for m in steps if m["fleet/joined"]]
    leaves = [m["step"] for m in steps if m["fleet/left"]]
    print(f"fleet/workers per step {workers}; joined before steps {joins}; left during steps {leaves}; "
          f"killed pid {killer.killed}; {elastic_s:.0f} s")
    assert workers[0] == 1 and 2 in workers
    # a join happens at a step boundary: the step it is counted in ran on the grown fleet
    assert all(m["fleet/workers"] == 2 for m in steps if m["fleet/joined"])
    logged = [int(s) for s in re.findall(r"joined the fleet before step (\d+)", err)]
    assert logged == joins, err[-3000:]
    assert f"(pid {killer.killed}) joined the fleet" in err, err[-3000:]
    assert len(leaves) == 1 and "left the fleet" in err, err[-3000:]
    left_step = next(m for m in steps if m["fleet/left"])
    assert left_step["fleet/workers"] == 1  # the step completed on the worker left
    lost = [r for r in read_interruptions(cfg.run_dir) if r["kind"] == "worker_lost"]
    assert [(r["step"], r["role"]) for r in lost] == [(left_step["step"], "rollout1")]

    # Every sample id of every step exactly once, replayed independently from the data cursor.
    task = load_task(cfg.task, cfg.seed)
    sampler = PromptSampler(task.train, cfg.seed)
    elastic = _samples(cfg.run_dir)
    assert [rec["step"] for rec in elastic] == list(range(1, STEPS + 1))
    for rec in elastic:
        expected = [f"{rec['step'] - 1}/{p.id}/{j}" for p in sampler.next_batch(PROMPTS) for j in range(GROUP)]
        got = Counter(sid for sid, _, _ in rec["samples"])
        assert set(got) == set(expected) and max(got.values()) == 1, rec["step"]

    # The same seed with the fleet fixed at one worker: the same sample ids, step by step (same prompts, same
    # per-prompt seeds whatever the fleet's size); and, on the hf engine in float64 (both runs: a sampled token flips
    # with another batching only if two cumulative probabilities are within ~1e-16, on any CPU), the same completions.
    fixed_cfg = _config(tmp_path, "fixed", warm_model_dir, "rollout.num_workers=1")
    train(fixed_cfg, progress=False)
    fixed = _samples(fixed_cfg.run_dir)
    assert [[s[0] for s in rec["samples"]] for rec in fixed] == [[s[0] for s in rec["samples"]] for rec in elastic]
    differ = [(rec_e["step"], s_e[0]) for rec_e, rec_f in zip(elastic, fixed)
              for s_e, s_f in zip(rec_e["samples"], rec_f["samples"]) if s_e[1] != s_f[1]]
    print(f"completions differing from the fixed fleet's: {len(differ)} of {STEPS * PROMPTS * GROUP} {differ[:5]}")
    assert differ == []
