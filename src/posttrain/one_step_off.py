"""Asynchronous rollout (`rollout.max_staleness: k`, k >= 1; `rollout.async_one_step_off: true` is k = 1): a
rollout thread generates the next steps' batches while the trainer trains, at most k batches in flight, so
generation hides behind training instead of following it.

    step t:   take batch t (oldest first) -> launch batch t+k -> reference, advantages, train on batch t
              -> trainer holds v_(t+1) and exports it; the rollout thread loads it before its next batch

The rollout thread runs one batch at a time; before each, it loads the newest weights the trainer exported into
the (then idle) engines, so which weights generated which batch is decided by program order, not by a race, and
the batch records that version. A batch launched at step t starts with weights at least v_t and is trained at
step t+k at the latest, so every trained sample is at most k updates old (checked each step, logged as
`rollout/staleness`; the samples log records each step's `policy_version`). Admission is the bound itself: a
batch is launched only when one is taken, so generation waits rather than running further ahead; nothing is
dropped (a batch still in flight when the run stops is regenerated from the checkpoint's data cursor on resume).
The loss takes its ratio against the engine's logprobs of the behaviour policy, or, with
`algorithm.rollout_correction`, against the trainer's own and corrects with importance weights
(algorithms/rollout_correction.py). The last step syncs right after training, so the final eval and checkpoint see
the trained weights.

With `rollout.partial_rollouts`, the main thread also interrupts the engines as soon as it publishes new weights:
the rollout thread loads them and the cut samples resume under them (rollout/partial.py), so each token records
the version that sampled it, and the batch's version (for the staleness check) is its oldest token's.

The rollout thread uses the rollout and reward actors; the main thread meanwhile the reference and trainer actors.
Held-out evals every k steps queue behind the batch in flight and see the engines' weights, a few updates behind.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from posttrain.algorithms.off_policy import staleness
from posttrain.config import RunConfig
from posttrain.errors import PosttrainError
from posttrain.rollout.fleet import sync_weights
from posttrain.rollout.partial import PartialRollout, version_range
from posttrain.rollout.sampler import Cursor, PromptSampler
from posttrain.rollout.single_turn import rollout_single_turn
from posttrain.step import TIME_KEYS, finish_step, rollout_and_score, signal_groups


def check_one_step_off_config(cfg: RunConfig) -> None:
    """The settings asynchronous rollout cannot honour, named with what to change."""
    a, k = cfg.algorithm, cfg.rollout.max_staleness
    if a.dynamic_sampling_rounds:
        raise PosttrainError(
            f"rollout.max_staleness={k} (asynchronous rollout) does not combine with algorithm.dynamic_sampling_rounds="
            f"{a.dynamic_sampling_rounds} (refill rounds depend on the batch being trained)",
            hint="set algorithm.dynamic_sampling_rounds=0 or rollout.max_staleness=0",
        )
    if any(rule.action == "rollback" for rule in cfg.alarms.rules):
        raise PosttrainError(
            f"rollout.max_staleness={k} (asynchronous rollout) does not combine with an alarm whose action is "
            "rollback: the rollouts in flight were sampled from the weights being rolled back",
            hint="use action stop or warn for those alarms, or rollout.max_staleness=0",
        )
    if cfg.topology.trainer_ranks > 1:
        raise PosttrainError(
            f"rollout.max_staleness={k} (asynchronous rollout) does not combine with topology.trainer_ranks="
            f"{cfg.topology.trainer_ranks} yet: the sharded trainer's weight export to a rollout thread is untested",
            hint="set topology.trainer_ranks=1 or rollout.max_staleness=0",
        )


@dataclass
class _InFlight:
    step: int
    future: Future      # -> (StepSamples, the policy version that generated them)
    cursor: Cursor      # the data cursor after this step's prompts
    times: dict         # the rollout thread's own generate/reward/sync seconds
    launched_at: float


class OneStepOffRollout:
    """Drives steps with up to `rollout.max_staleness` batches in flight. `run_step(step, roles)` returns what
    loop.run_step does (metrics, samples); `cursor` is the data cursor after the last *trained* step (what a
    checkpoint saves)."""

    def __init__(self, cfg: RunConfig, sampler: PromptSampler, encoder):
        check_one_step_off_config(cfg)
        self.cfg, self.sampler, self.encoder = cfg, sampler, encoder
        self.depth = cfg.rollout.max_staleness
        self.cursor = sampler.cursor
        self.trainer_version = 0  # optimizer steps the trainer has taken in this process
        self._engine_version = 0  # ... and the number whose weights the engines hold (the rollout thread's)
        self._newest = (0, None)  # (version, export ObjectRef): what the rollout thread loads before its next batch
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollout-ahead")
        self._queue: deque[_InFlight] = deque()

    def _launch(self, step: int, roles) -> None:
        problems = self.sampler.next_batch(self.cfg.algorithm.prompts_per_step)
        times = dict.fromkeys(TIME_KEYS, 0.0)
        future = self._pool.submit(self._sync_then_rollout, step, roles, problems, times)
        self._queue.append(_InFlight(step, future, self.sampler.cursor, times, time.perf_counter()))

    def _sync_then_rollout(self, step: int, roles, problems, times: dict):
        """In the rollout thread: the newest exported weights into the idle engines, then one batch. Returns it with
        the policy version that generated it (with partial rollouts, that of its oldest token)."""
        start = self._load_newest(roles, times)
        if not self.cfg.rollout.partial_rollouts:
            return rollout_and_score(self.cfg, step, roles, self.encoder, problems, 0, times), start

        def before_resume() -> int:
            t = time.perf_counter()
            version = self._load_newest(roles, times)
            times["generate"] -= time.perf_counter() - t  # counted as sync, not as generation
            return version

        generated = rollout_single_turn(self.cfg, step, roles, self.encoder, problems, 0, times,
                                        PartialRollout(start, before_resume))
        return generated, version_range(generated.token_versions, start)[0]

    def _load_newest(self, roles, times: dict) -> int:
        """In the rollout thread, with the engines idle: the newest exported weights into them if they hold older
        ones; returns the version they hold."""
        with self._lock:
            version, exported = self._newest
        if version > self._engine_version:
            t = time.perf_counter()
            sync_weights(roles, exported)
            times["sync"] += time.perf_counter() - t
            self._engine_version = version
        return self._engine_version

    def run_step(self, step: int, roles) -> tuple[dict, dict]:
        t_start = time.perf_counter()
        steps = self.cfg.train.steps
        if not self._queue:  # the first step of this process: nothing was launched ahead
            for s in range(step, min(step + self.depth, steps)):
                self._launch(s, roles)
        batch = self._queue.popleft()
        if batch.step != step:
            raise RuntimeError(f"asynchronous rollout: step {step} asked for, but step {batch.step} is next")
        generated, version = batch.future.result()
        exposed = time.perf_counter() - t_start
        self.cursor = batch.cursor
        if step + self.depth < steps:
            self._launch(step + self.depth, roles)  # generated while this step (and the ones before it) train
        last = step + 1 >= steps

        lag = staleness(self.trainer_version, version, bound=self.depth)
        train_set = generated.select_groups(signal_groups(self.cfg, generated), self.cfg.algorithm.group_size)
        times = dict.fromkeys(TIME_KEYS, 0.0)
        times["generate"] = exposed  # the part of rollout + scoring that training did not hide
        record, samples = finish_step(self.cfg, step, roles, generated, train_set, 1, times, t_start,
                                      sync=sync_weights if last else _no_sync)
        trained_at = self.trainer_version
        if len(train_set):
            self.trainer_version += 1
            if not last:  # the trainer exports now, while the engines generate; the rollout thread loads it next
                with self._lock:
                    self._newest = (self.trainer_version, roles.trainer.export_arrays.remote())
                if self.cfg.rollout.partial_rollouts:  # cut the batch in flight: it resumes under these weights
                    for worker in roles.rollout:
                        worker.interrupt.remote()
        return self._metrics(record, batch, generated, lag, version, len(self._queue)), \
            {**samples, "policy_version": version, "trained_at_version": trained_at, **_token_versions(generated)}

    @staticmethod
    def _metrics(record: dict, batch: _InFlight, generated, lag: int, version: int, in_flight: int) -> dict:
        gen_tokens = sum(len(c) for c in generated.completions)
        record["time/other"] = max(0.0, record["time/step"] - sum(record[f"time/{k}"] for k in TIME_KEYS))
        record["tokens_per_s"] = gen_tokens / max(batch.times["generate"], 1e-9)
        record["rollout/staleness"] = lag
        record["rollout/behaviour_version"] = version  # with partial rollouts, the oldest token's
        if generated.token_versions:
            newest = version_range(generated.token_versions, version)[1]
            record["rollout/behaviour_version_spread"] = newest - version
            record["rollout/resumed_share"] = sum(len(set(v)) > 1 for v in generated.token_versions) / len(generated)
        record["rollout/in_flight"] = in_flight
        record["time/rollout_generate"] = batch.times["generate"]  # in the background thread
        record["time/rollout_reward"] = batch.times["reward"]
        record["time/rollout_sync"] = batch.times["sync"]  # weights loaded by the rollout thread, hidden too
        return record

    def close(self) -> None:
        """Waits for the batches still in flight (their errors no longer matter) and stops the thread."""
        while self._queue:
            try:
                self._queue.popleft().future.result()
            except Exception:  # noqa: BLE001 - the run is ending (or failing) for another reason already
                pass
        self._pool.shutdown(wait=True)


def _token_versions(generated) -> dict:
    """For the samples log, with partial rollouts: each sample's [oldest, newest] token policy version."""
    if not generated.token_versions:
        return {}
    return {"token_versions": [[min(v), max(v)] if v else [] for v in generated.token_versions]}


def _no_sync(roles) -> None:
    """Weights reach the engines through the rollout thread, before its next batch."""
