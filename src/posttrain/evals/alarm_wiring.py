"""The reward-hacking alarms in the training loop: `LoopAlarms` turns the config's `alarms.rules` into an
`AlarmMonitor`, feeds it each step's metrics record (plus the n-gram repetition rate of the step's completions),
and returns the `alarm/<kind>` metrics of the alarms that fired, each with its evidence. What an alarm's action
means for the run (stop, roll back) is decided by the loop; this module only says which action is due.

What the loop's records offer the detectors (metrics.jsonl keys):
    proxy_gold        heldout/proxy against heldout/gold: the reward and the gold score of greedy completions of
                      alarms.heldout_problems fixed held-out problems, measured after each step (needs
                      reward.log_gold); with heldout_problems 0, the training samples' reward_mean and reward/gold.
                      Evidence adds the gold-vs-sqrt(KL) fit on `kl`
    length_corr       response_length against reward_mean
    length_bucket     each completion's token length and reward (handed to `observe`, kept in the monitor's
                      history, not logged): the first `window` steps against the last `window` steps
    kl_accel          kl
    entropy_collapse  entropy
    repetition        repetition_rate (computed here from the completions' tokens)
    rm_disagreement   reward/rm_disagreement (needs reward.rm_ensemble: two or more reward models)
"""

from __future__ import annotations

import math

from posttrain.errors import PosttrainError
from posttrain.evals.alarms import AlarmMonitor, AlarmSpec, FiredAlarm, ngram_repetition_rate
from posttrain.checkpoint import step_dir_name

# Defaults when a rule's threshold is None (units: proxy slope per step; Pearson r; slope ratio; share of the
# first entropy; share of repeated n-grams).
DEFAULT_THRESHOLDS = {"proxy_gold": 0.0, "length_corr": 0.8, "length_bucket": 0.5, "kl_accel": 3.0,
                      "entropy_collapse": 0.1, "repetition": 0.5, "rm_disagreement": 1.5}
# The loop's metric names where they differ from AlarmMonitor's defaults.
LOOP_KEYS = {"proxy_gold": {"gold": "reward/gold"}, "length_corr": {"length": "response_length"},
             "rm_disagreement": {"disagreement": "reward/rm_disagreement"}}
SAMPLES_KEY = "sample_lengths_rewards"  # the monitor's per-step (lengths, rewards); never written to metrics
SEVERITY = {"warn": 0, "rollback": 1, "stop": 2}


def _finite(evidence: dict) -> dict:
    """Evidence with non-finite floats as None (metrics.jsonl is JSON) and tuples as lists."""
    out = {}
    for k, v in evidence.items():
        if isinstance(v, float) and not math.isfinite(v):
            v = None
        elif isinstance(v, tuple):
            v = list(v)
        out[k] = v
    return out


class LoopAlarms:
    def __init__(self, cfg, tokenizer=None, notify=None):
        a = cfg.alarms
        if any(r.kind == "proxy_gold" for r in a.rules) and not cfg.reward.log_gold:
            raise PosttrainError("alarms.rules: proxy_gold compares the reward with reward/gold, which is logged "
                                 "only with reward.log_gold=true", hint="set reward.log_gold=true (task addition)")
        if any(r.action == "rollback" for r in a.rules) and not cfg.eval.suites:
            raise PosttrainError("alarms.rules: action rollback goes back to the best checkpoint, which only the "
                                 "in-loop eval finds", hint="set eval.suites (e.g. [addition]) or use stop")
        if any(r.kind == "rm_disagreement" for r in a.rules) and not cfg.reward.rm_ensemble:
            raise PosttrainError("alarms.rules: rm_disagreement needs two or more reward models, and the run scores "
                                 "with one (reward.rm_path)", hint="list more reward-model directories in "
                                 "reward.rm_ensemble, or drop the rule")
        self.rules = list(a.rules)
        self.after = {(r.kind, r.action): r.after_step for r in a.rules}
        def keys(r) -> dict:
            if r.kind != "proxy_gold":
                return dict(LOOP_KEYS.get(r.kind, {}))
            if not a.heldout_problems:
                return {"gold": "reward/gold"}
            return {"proxy": "heldout/proxy" if r.proxy == "heldout" else "reward_mean", "gold": "heldout/gold"}

        self.monitor = AlarmMonitor([
            AlarmSpec(r.kind, r.action, DEFAULT_THRESHOLDS[r.kind] if r.threshold is None else r.threshold,
                      r.window, keys(r), r.drop)
            for r in a.rules])
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.n = a.repetition_n
        self.fired: list[FiredAlarm] = []
        self.heldout = None  # (cfg, roles, encoder, problems) once `attach`ed, for proxy_gold's held-out series
        self.rollbacks: list[dict] = []
        self.notify = notify or (lambda event, **fields: None)  # ops.notify's Notifier.emit (alarm_fired)
        self.firing: set[str] = set()  # kinds that fired on the last step: notified once, not on every step

    @property
    def enabled(self) -> bool:
        return bool(self.rules)

    def attach(self, roles, encoder, heldout: list) -> None:
        """Gives proxy_gold its held-out problems and the run's engines and reward roles (after create_roles)."""
        n = self.cfg.alarms.heldout_problems
        if n and any(r.kind == "proxy_gold" for r in self.rules):
            self.heldout = (roles, encoder, heldout[:n])

    def heldout_proxy_and_gold(self) -> dict:
        """Greedy completions of the fixed held-out problems by the current policy, scored with the run's reward
        (the proxy) and the gold function: {"heldout/proxy": mean, "heldout/gold": mean}."""
        from posttrain.rollout.fleet import generate_on_workers, rollout_resync
        from posttrain.rewards.scoring import score_batch
        from posttrain.rollout.engine import SamplingSpec

        roles, encoder, problems = self.heldout
        prompts = [encoder.encode(p.prompt) for p in problems]
        spec = SamplingSpec(n=1, max_new_tokens=self.cfg.rollout.max_new_tokens, temperature=0.0)
        outs = [o[0] for o in generate_on_workers(roles.rollout, prompts, spec, [0] * len(prompts),
                                                  rollout_resync(roles), watchdog=roles.watchdog, kind="alarm_probe")]
        items = [(p.id, p.prompt, p.answer, encoder.decode_completion(o.token_ids)) for p, o in zip(problems, outs)]
        scored = score_batch(self.cfg, roles, items, [len(o.token_ids) for o in outs], roles.judge,
                             completion_ids=[list(o.token_ids) for o in outs], step="heldout",
                             columns=[p.columns for p in problems])
        gold = scored.components["gold"]
        return {"heldout/proxy": sum(scored.rewards) / len(items), "heldout/gold": sum(gold) / len(gold)}

    def repetition_rate(self, texts: list[str]) -> float:
        """Share of repeated token n-grams within each completion, pooled over the step's completions."""
        if self.tokenizer is None:
            return ngram_repetition_rate([list(t) for t in texts], self.n)
        return ngram_repetition_rate([self.tokenizer.encode(t, add_special_tokens=False) for t in texts], self.n)

    def token_lengths(self, texts: list[str]) -> list[int]:
        if self.tokenizer is None:
            return [len(t) for t in texts]
        return [len(self.tokenizer.encode(t, add_special_tokens=False)) for t in texts]

    def observe(self, record: dict, texts: list[str], rewards: list[float] | None = None) -> dict:
        """Feeds one step's record (and its completion texts, and their rewards for length_bucket); returns the
        metrics to add to the record: repetition_rate always, and alarm/<kind> = evidence (a dict with the action)
        for each alarm that fired."""
        if not self.enabled:
            return {}
        extra = {"repetition_rate": self.repetition_rate(texts)}
        if self.heldout is not None:
            extra.update(self.heldout_proxy_and_gold())
        fed = {k: v for k, v in {**record, **extra}.items() if v is not None}  # entropy is None on a step that
        if rewards is not None and any(r.kind == "length_bucket" for r in self.rules):
            fed[SAMPLES_KEY] = (self.token_lengths(texts), list(rewards))
        fired = [f for f in self.monitor.update(fed) if f.step > self.after.get((f.kind, f.action), 0)]  # trained nothing
        self.fired.extend(fired)
        for f in fired:
            extra[f"alarm/{f.kind}"] = {"action": f.action, **_finite(f.evidence)}
            if f.kind not in self.firing:
                self.notify("alarm_fired", step=f.step, kind=f.kind, action=f.action, evidence=_finite(f.evidence))
        self.firing = {f.kind for f in fired}
        return extra

    def due_action(self, step: int) -> FiredAlarm | None:
        """The most severe alarm that fired at `step` whose action is not just a warning (stop over rollback)."""
        acting = [f for f in self.fired if f.step == step and f.action != "warn"]
        return max(acting, key=lambda f: SEVERITY[f.action]) if acting else None

    def reset(self) -> None:
        """Forget the history (after a rollback the series restart from the restored policy)."""
        self.monitor.history.clear()

    def summary(self) -> dict:
        return {"alarm_count": len(self.fired), "rollbacks": self.rollbacks,
                "alarms": [{"kind": f.kind, "step": f.step, "action": f.action} for f in self.fired]}


def after_step_evals_and_alarms(cfg, roles, step: int, last_ckpt_step: int, in_loop, alarms: LoopAlarms, writer,
                                log) -> str | None:
    """The loop's work after step `step` is logged: hand a checkpoint saved at this step to the evaluator, write
    the eval results that came back, then act on this step's alarms. Returns why the run must stop (None: go on).

    stop: the run ends cleanly (the loop writes its final eval and checkpoint). rollback: the best checkpoint's
    weights (and optimizer state) go into the trainer, then to every engine; the data cursor and step go on, and
    the alarm history restarts. Without a best checkpoint yet, rollback stops the run instead."""
    import ray

    from posttrain.rollout.fleet import sync_weights

    if in_loop is not None:
        if last_ckpt_step == step:
            in_loop.submit(step, cfg.run_dir / "checkpoints" / step_dir_name(step))
        for r in in_loop.poll():
            writer.write(r)
    fired = alarms.due_action(step)
    if fired is None:
        return None
    what = f"alarm {fired.kind} at step {step} ({fired.evidence})"
    if fired.action == "stop":
        log(f"{what}: stopping the run (alarms.rules action stop)")
        return f"{fired.kind} at step {step}"
    if in_loop is not None:  # the gate's verdicts on the checkpoints saved so far decide where to go back to
        for r in in_loop.finish():
            writer.write(r)
    best = in_loop.best_checkpoint() if in_loop is not None else None
    if best is None:
        log(f"{what}: no best checkpoint to roll back to yet, stopping the run")
        return f"{fired.kind} at step {step} (rollback without a best checkpoint)"
    ray.get(roles.trainer.load.remote(str(best)))
    sync_weights(roles)
    alarms.reset()
    alarms.rollbacks.append({"step": step, "to": best.name})
    writer.write({"step": step, "alarm/rollback_to": best.name})
    log(f"{what}: rolled back trainer and engines to {best}")
    return None


