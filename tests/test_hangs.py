"""Hang detection on real Ray, with calls wedged on purpose (remote/faults.py):

- the watchdog alone, on two small actors: a hung reward-like actor is restarted and its call retried by Ray (the
  stacks on disk name the wedged frame; one interruption record; hang_detected then hang_recovered), a hung trainer
  is killed and RolesLost raised; with no watchdog, `watched_get` is ray.get;
- a real run (vLLM engine): a generate call and a reward call wedge mid-run; both are detected, every actor's
  stacks are written, the actors restarted, their work redone, the run completes with every sample id of every
  step exactly once, and the events reach a real webhook on 127.0.0.1."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from types import SimpleNamespace

import pytest

from posttrain.config import load_config
from posttrain.orchestration.roles import role_actors
from posttrain.remote import faults
from posttrain.remote.watchdog import RolesLost, Watchdog, watched_get
from posttrain.tracking import read_metrics
from posttrain.tracking.interruptions import read_interruptions

pytestmark = pytest.mark.integration


def _worker_class():
    """Defined in a function so Ray ships the class by value (the tests directory is not importable in actors)."""
    import os

    from posttrain.remote.faults import maybe_wedge
    from posttrain.remote.stacks import ActorProcess

    class Worker(ActorProcess):
        def work(self, point: str, seconds: float = 0.02) -> int:
            maybe_wedge(point)
            time.sleep(seconds)
            return os.getpid()

    return Worker


@pytest.fixture
def faults_dir(tmp_path, monkeypatch):
    """POSTTRAIN_FAULTS_DIR for the driver and, through ray.init (runtime.py), for every actor."""
    d = tmp_path / "faults"
    d.mkdir()
    monkeypatch.setenv(faults.ENV, str(d))
    return d


@pytest.mark.timeout(120)  # ~12 s
def test_watchdog_restarts_a_hung_actor_and_gives_up_a_hung_trainer(tmp_path, faults_dir):
    import ray

    from posttrain.orchestration.runtime import start_ray, stop_ray

    cfg = load_config(None, ["name=wd", f"runs_dir={tmp_path}", "ops.hang_factor=2", "ops.hang_min_seconds=2",
                             "ops.hang_cold_seconds=60"])
    cfg.run_dir.mkdir(parents=True)
    started = not ray.is_initialized()
    start_ray(cfg.ray, 2)
    try:
        # the fault dir explicitly too: a Ray started before this test did not inherit it
        worker, env = ray.remote(_worker_class()), {"env_vars": {faults.ENV: str(faults_dir)}}
        reward = worker.options(num_cpus=0, runtime_env=env, max_restarts=3, max_task_retries=3).remote()  # as roles.py
        trainer = worker.options(num_cpus=0, runtime_env=env).remote()
        roles = SimpleNamespace(trainer=trainer, rollout=[], reward=reward, reference=None, critic=None,
                                reward_model=None, evaluator=None)
        events = []
        wd = Watchdog(cfg, lambda: role_actors(roles), notify=lambda event, **fields: events.append((event, fields)),
                      log=lambda m: None)
        first = dict(wd.processes["reward"])
        assert wd.bound("reward", "reward") == (60.0, None)  # cold: fewer than 3 measured calls
        for _ in range(3):
            watched_get(wd, [(reward.work.remote("reward"), "reward", "reward"),
                             (trainer.work.remote("train"), "train", "trainer")])
        bound, median = wd.bound("reward", "reward")
        assert bound == 2.0 and median < 1.0  # the floor: 2 x a ~0.02 s median is less

        # not done yet and not overdue: block=False says so at once, with and without the watchdog
        slow = reward.work.remote("reward", 1.0)
        assert watched_get(wd, [(slow, "reward", "reward")], block=False) is None
        assert watched_get(None, [(slow, "reward", "reward")], block=False) is None
        assert watched_get(None, [(slow, "reward", "reward")]) == [first["pid"]]  # plain ray.get
        watched_get(wd, [(slow, "reward", "reward")])

        wd.step = 4
        faults.arm(faults_dir, "reward")
        t = time.monotonic()
        (pid,) = watched_get(wd, [(reward.work.remote("reward"), "reward", "reward")])
        took = time.monotonic() - t
        assert pid != first["pid"]  # Ray retried the call on the restarted process
        assert wd.hangs == 1 and wd.processes["reward"]["pid"] == pid
        (record,) = read_interruptions(cfg.run_dir)
        assert (record["kind"], record["role"], record["call"], record["step"]) == ("hang", "reward", "reward", 4)
        assert 0 < record["recovery_s"] < took and record["bound_s"] == 2.0 and record["elapsed_s"] >= 2.0
        stacks = cfg.run_dir / "hangs" / "4"
        index = json.loads((stacks / "index.json").read_text())
        assert (index["kind"], index["role"], index["step"], index["bound_s"]) == ("reward", "reward", 4, 2.0)
        assert set(index["files"]) == {"reward", "trainer"} and index["driver"].startswith("driver-")
        assert "maybe_wedge" in (stacks / f"reward-{first['pid']}.txt").read_text()  # the wedged frame, by py-spy
        assert "Worker.work" not in (stacks / index["files"]["trainer"]).read_text()  # idle
        assert "watched_get" in (stacks / index["driver"]).read_text()  # the driver's thread that waited
        assert [e for e, _ in events] == ["hang_detected", "hang_recovered"]
        detected, recovered = (f for _, f in events)
        assert detected["kind"] == "reward" and detected["role"] == "reward" and detected["step"] == 4
        assert detected["bound_s"] == 2.0 and detected["elapsed_s"] >= 2.0 and detected["stacks"] == str(stacks)
        assert detected["median_s"] == index["median_s"] < 1.0
        assert recovered["role"] == "reward" and recovered["recovery_s"] == record["recovery_s"]

        faults.arm(faults_dir, "train")  # a trainer's state cannot be redone by a restart: RolesLost
        trainer_pid = wd.processes["trainer"]["pid"]
        with pytest.raises(RolesLost, match=r"trainer: hung: its train call ran \d+ s, past its bound of 2 s"):
            watched_get(wd, [(trainer.work.remote("train"), "train", "trainer")])
        assert "maybe_wedge" in (cfg.run_dir / "hangs" / "4-2" / f"trainer-{trainer_pid}.txt").read_text()
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(trainer.work.remote("train"), timeout=30)  # killed, not restarted
        assert wd.hangs == 2 and len(read_interruptions(cfg.run_dir)) == 1  # the run's re-forming records that one
        assert [e for e, _ in events][2:] == ["hang_detected"]
    finally:
        if started:
            stop_ray()


# ---------------------------------------------------------------------------------------------- a real run

STEPS, PROMPTS, GROUP = 8, 4, 4


def _steps_done(run_dir) -> int:
    try:
        return max((m["step"] for m in read_metrics(run_dir) if "time/step" in m), default=0)
    except (json.JSONDecodeError, OSError):
        return 0


class Wedger(threading.Thread):
    """Arms each fault point once step `after` is in metrics.jsonl (the watchdog's bound is warm by then)."""

    def __init__(self, run_dir, faults_dir, plan: list[tuple[int, str]]):
        super().__init__(daemon=True)
        self.run_dir, self.faults_dir, self.plan = run_dir, faults_dir, plan
        self.armed: list[tuple[str, int]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        for after, point in self.plan:
            while not self.stop.is_set() and _steps_done(self.run_dir) < after:
                time.sleep(0.01)
            if self.stop.is_set():
                return
            faults.arm(self.faults_dir, point)
            self.armed.append((point, _steps_done(self.run_dir)))


@pytest.mark.timeout(300)  # ~50 s; without a watchdog the wedged call would block for ever
def test_wedged_engine_and_reward_call_are_detected_dumped_restarted_and_redone(tmp_path, tiny_model_dir,
                                                                                 faults_dir, webhook, capsys,
                                                                                 train_beside):
    from posttrain.rollout.sampler import PromptSampler
    from posttrain.tasks import load_task

    cfg = load_config(None, [
        "name=hangs", f"runs_dir={tmp_path}", f"model.path={tiny_model_dir}", f"algorithm.prompts_per_step={PROMPTS}",
        "reward.weights={verifier: 1.0, length: -0.1}",  # the random model solves nothing: lengths make groups differ
        f"algorithm.group_size={GROUP}", "algorithm.kl_coef=0", "rollout.num_workers=1", "task.heldout_size=16",
        "eval.every=0", "checkpoint.every=0", f"train.steps={STEPS}", "logging.progress=false",
        "ops.hang_factor=3", "ops.hang_min_seconds=4", "ops.hang_cold_seconds=120",
        f"ops.notify=[{{url: '{webhook.url}/hooks', events: [hang_detected, hang_recovered]}}]",
    ])
    wedger = Wedger(cfg.run_dir, faults_dir, [(3, "generate"), (5, "reward")])
    summary, wall = train_beside(cfg, wedger)
    err = capsys.readouterr().err
    assert [p for p, _ in wedger.armed] == ["generate", "reward"], wedger.armed
    assert summary["steps"] == STEPS, err[-3000:]
    assert not [p for p in ("generate", "reward") if (faults_dir / f"wedge-{p}").exists()], "an armed fault was not hit"

    hangs = [r for r in read_interruptions(cfg.run_dir) if r["kind"] == "hang"]
    assert [(r["call"], r["role"]) for r in hangs] == [("generate", "rollout0"), ("reward", "reward")], hangs
    for r, (_, armed_at) in zip(hangs, wedger.armed):
        assert r["step"] > armed_at and r["recovery_s"] > 0 and r["automatic"], r
        stacks = cfg.run_dir / "hangs" / str(r["step"])
        assert r["stacks"] == str(stacks)
        index = json.loads((stacks / "index.json").read_text())
        assert {"trainer", "reward", "rollout0"} <= set(index["files"]) and (stacks / index["driver"]).is_file()
        hung = index["files"][r["role"]]
        assert "maybe_wedge" in (stacks / hung).read_text(), (stacks / hung).read_text()[-2000:]
        others = [f for role, f in index["files"].items() if role != r["role"]]
        assert all("maybe_wedge" not in (stacks / f).read_text() for f in others)
    assert "hang at step" in err and "recovered" in err
    assert max(m.get("hangs", 0) for m in read_metrics(cfg.run_dir)) == 2

    # Every sample id of every step exactly once (replayed from the data cursor): redone work is not doubled.
    task = load_task(cfg.task, cfg.seed)
    sampler = PromptSampler(task.train, cfg.seed)
    lines = [json.loads(line) for line in (cfg.run_dir / "samples.jsonl").read_text().splitlines()]
    assert [rec["step"] for rec in lines] == list(range(1, STEPS + 1))
    for rec in lines:
        expected = {f"{rec['step'] - 1}/{p.id}/{j}" for p in sampler.next_batch(PROMPTS) for j in range(GROUP)}
        got = Counter(sid for sid, _, _ in rec["samples"])
        assert set(got) == expected and set(got.values()) == {1}, rec["step"]

    posted = [body for path, body in webhook.received if path == "/hooks"]
    assert [b["event"] for b in posted] == ["hang_detected", "hang_recovered"] * 2, posted
    for body, r in zip(posted[::2], hangs):
        assert body["fields"]["kind"] == r["call"] and body["fields"]["role"] == r["role"]
        assert body["fields"]["elapsed_s"] >= body["fields"]["bound_s"] >= 4
    print(f"hangs: {[(r['call'], r['step'], r['recovery_s']) for r in hangs]}; run wall {wall:.1f} s")


def test_interrupted_generate_calls_teach_the_watchdog_no_bound():
    # Partial rollouts cut generate calls short whenever new weights arrive: were their durations kept, a full generate
    # later (the trainer waiting on it) would look like 5x the median of cut calls and be killed as hung. They are
    # kept for every other kind: three 1 s generate calls make generate's bound max(min, 5 x 1 s).
    cfg = load_config(None, ["ops.hang_min_seconds=2", "ops.hang_factor=5", "ops.hang_cold_seconds=120"])
    wd = Watchdog(cfg, lambda: {})
    for _ in range(3):
        wd._returned("generate", "rollout0", 1.0)
        wd._returned("generate_interruptible", "rollout0", 1.0)
    assert wd.bound("generate", "rollout0") == (5.0, 1.0)
    assert wd.bound("generate_interruptible", "rollout0") == (120.0, None)  # always the cold bound
