"""Eval inside the training loop: an evaluator actor runs `eval.suites` on each saved checkpoint while the
trainer goes on; the driver collects the result on a later step (`poll`, never blocking) or at the end
(`finish`), gates it against the previous and the best evaluated checkpoint with the paired statistics of
evals/compare.py, logs `eval/*` metrics, and keeps runs/<name>/best.json pointing at the best checkpoint.

With `run_reward` among the suites (evals/run_suite.py), the gate and best.json follow the run's own reward on
its held-out split.

A fresh run evaluates its starting model too, as step 0 (`submit_start`; model.path, the base model of a LoRA
run): the suite curve starts from the base, the first checkpoint's vs_previous gate pairs with it, and every
checkpoint's record carries its gain over the start with a paired 95% CI (`eval/vs_start/<suite>/diff`, `ci_low`,
`ci_high`), so a run's gain needs no second command. The start is never the best: best.json names a checkpoint
(something to roll back to and to keep), as before.

Best: the first evaluated checkpoint, then any checkpoint whose mean suite score is higher than the best's and that
does not significantly regress against it on any suite. Each evaluation is also kept as
runs/<name>/evals/step_NNNNNN/{results.json, report.html} (the records a later gate pairs with).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from posttrain.evals.compare import compare_suites
from posttrain.remote.stacks import ActorProcess
from posttrain.remote.watchdog import watched_get
from posttrain import checkpoint as ckpt


class CheckpointEvaluator(ActorProcess):
    """The evaluator role (a Ray actor): one engine, reused for every checkpoint by loading its weights in place."""

    def __init__(self, suites: list[str], engine: dict, cache_dir: str | None = None, run_dir: str | None = None):
        from posttrain.evals.runner import EngineSettings, ModelEvaluator
        from posttrain.evals.catalog import load_suites

        self.suites = load_suites(suites, run_dir)  # run_dir: for `run_reward`, the run's own reward
        self.evaluator = ModelEvaluator(EngineSettings(**engine), Path(cache_dir) if cache_dir else None)

    def evaluate(self, step: int, model_dir: str) -> dict:
        """{"step", "model_dir", "seconds", "samples", "suites": [SuiteResult.to_json() ...]}."""
        from posttrain.evals.runner import evaluate

        start = time.perf_counter()
        results = evaluate(model_dir, self.suites, self.evaluator)
        return {"step": step, "model_dir": model_dir, "seconds": time.perf_counter() - start,
                "samples": sum(len(r.records) for r in results if r.kind != "preference"),
                "suites": [r.to_json() for r in results]}

    def ping(self) -> int:
        import os

        return os.getpid()


def suite_score(result: dict) -> float:
    """One number per evaluated checkpoint: the mean of its suites' mean scores."""
    means = [s["summary"]["mean"] for s in result["suites"]]
    return sum(means) / len(means)


def gate_metrics(prefix: str, rows) -> dict:
    """eval/<prefix>/<suite>/{diff,ci_low,ci_high,p_holm} and eval/<prefix>/regressed (0/1) from compare rows."""
    out = {}
    for r in rows:
        for k in ("diff", "ci_low", "ci_high", "p_holm"):
            out[f"eval/{prefix}/{r.suite}/{k}"] = getattr(r, k)
    out[f"eval/{prefix}/regressed"] = int(any(r.verdict == "regressed" for r in rows))
    return out


def write_gate_file(checkpoint_dir: Path, record: dict) -> None:
    """checkpoints/step_N/gate.json (what `posttrain view` shows per checkpoint): fail when the checkpoint
    significantly regresses against the previous or the best one. Not in the manifest: the gate comes later."""
    if not checkpoint_dir.is_dir():
        return
    failed = record.get("eval/vs_previous/regressed") or record.get("eval/vs_best/regressed")
    parts = [f"score {record['eval/score']:.3f}"]
    for ref in ("vs_start", "vs_previous", "vs_best"):
        diffs = [f"{k.split('/')[2]} {v:+.3f}" for k, v in record.items() if k.startswith(f"eval/{ref}/") and k.endswith("/diff")]
        if diffs:
            parts.append(f"{ref.replace('_', ' ')}: {', '.join(diffs)}" + (" REGRESSED" if record[f"eval/{ref}/regressed"] else ""))
    if record["eval/is_best"]:
        parts.append("new best")
    (checkpoint_dir / "gate.json").write_text(json.dumps({"verdict": "fail" if failed else "pass",
                                                          "reason": "; ".join(parts), "metrics": record}))


class InLoopEval:
    """The driver's half. `submit_start(model_dir)` once when a run starts fresh (step 0, the starting model);
    `submit(step, checkpoint_dir)` after each checkpoint; `poll()` every step returns the
    metrics records of evaluations that finished; `finish()` waits for what is still running. With a `watchdog`
    (remote/watchdog.py), an evaluation running past its bound is a hang (the evaluator is killed and
    RolesLost raised)."""

    def __init__(self, cfg, actor, log=print, notify=None, watchdog=None):
        self.cfg = cfg
        self.actor = actor
        self.watchdog = watchdog
        self.log = log
        self.notify = notify or (lambda event, **fields: None)  # ops.notify's Notifier.emit (gate_regressed)
        self.run_dir = cfg.run_dir
        self.pending = None  # (step, checkpoint dir (None: the starting model), ObjectRef, submitted: monotonic s)
        self.queued: tuple[int, Path] | None = None  # the newest checkpoint waiting for the actor
        for stale in (self.run_dir / "checkpoints").glob(f"*/{ckpt.HOLD}"):  # left by a run that died
            stale.unlink()
        self.previous = self._load(self._latest_step())
        best = ckpt.read_best_pointer(self.run_dir)
        self.best = self._load(best["step"]) if best else None
        self.start = self._load(0)  # the starting model's result, on a resumed run too

    # ------------------------------------------------------------------ results on disk

    def _dir(self, step: int) -> Path:
        return self.run_dir / "evals" / ckpt.step_dir_name(step)

    def _latest_step(self) -> int | None:
        steps = eval_steps(self.run_dir)
        return steps[-1] if steps else None

    def _load(self, step: int | None) -> dict | None:
        p = self._dir(step) / "results.json" if step is not None else None
        return json.loads(p.read_text()) if p is not None and p.is_file() else None

    def _save(self, result: dict) -> None:
        from posttrain.evals.report import eval_report

        d = self._dir(result["step"])
        d.mkdir(parents=True, exist_ok=True)
        (d / "results.json").write_text(json.dumps(result))
        (d / "report.html").write_text(eval_report(f"{self.cfg.name} step {result['step']}", result["suites"]))

    # ------------------------------------------------------------------ scheduling

    def submit_start(self, model_dir: str | Path) -> None:
        """The starting model, as step 0 of a fresh run (call it before any checkpoint is submitted). Results under
        evals/ from before are from an attempt that never reached a checkpoint: not this run's previous or best."""
        self.previous = self.best = self.start = None
        self._send(0, Path(model_dir), None)

    def _send(self, step: int, model_dir: Path, checkpoint_dir: Path | None) -> None:
        ref = self.actor.evaluate.remote(step, str(model_dir))
        self.pending = (step, checkpoint_dir, ref, time.monotonic())

    def submit(self, step: int, checkpoint_dir: Path) -> None:
        (Path(checkpoint_dir) / ckpt.HOLD).touch()  # retention keeps it until the result is in
        if self.pending is None:
            self._send(step, Path(checkpoint_dir) / "model", Path(checkpoint_dir))
        else:  # one evaluation at a time; of the checkpoints saved meanwhile only the newest is evaluated
            if self.queued is not None:
                release(self.queued[1])
            self.queued = (step, Path(checkpoint_dir))

    def poll(self, block: bool = False) -> list[dict]:
        records = []
        while self.pending is not None:
            step, path, ref, submitted = self.pending
            try:
                got = watched_get(self.watchdog, [(ref, "eval", "evaluator")], submitted, block)
            except BaseException:  # as when the result arrives: the checkpoint is no longer held for it
                self.pending = None
                release(path)
                raise
            if got is None:
                break
            self.pending = None
            try:
                records.append(self._gate(got[0], path))
            finally:
                release(path)
            if self.queued is not None:
                queued, self.queued = self.queued, None
                self.submit(*queued)
        return records

    def finish(self) -> list[dict]:
        return self.poll(block=True)

    # ------------------------------------------------------------------ the gate

    def _compare(self, base: dict, new: dict):
        a = {s["suite"]: s["records"] for s in base["suites"]}
        per_suite = {s["suite"]: (a[s["suite"]], s["records"]) for s in new["suites"] if s["suite"] in a}
        return compare_suites(per_suite, margin=self.cfg.eval.gate_margin, alpha=self.cfg.eval.gate_alpha,
                              seed=self.cfg.seed, n_resamples=2000)

    def _gate(self, result: dict, path: Path | None) -> dict:
        """The metrics record of one evaluation; `path` is the checkpoint evaluated, None for the starting model."""
        step = result["step"]
        self._save(result)
        score = suite_score(result)
        record = {"step": step, "eval/score": score, "eval/seconds": result["seconds"],
                  "eval/samples_per_s": result["samples"] / result["seconds"] if result["seconds"] > 0 else None}
        for s in result["suites"]:
            record[f"eval/{s['suite']}/mean"] = s["summary"]["mean"]
            record[f"eval/{s['suite']}/se"] = s["summary"]["se"]
            for name, c in s["summary"].get("components", {}).items():  # run_reward: each source of the reward
                record[f"eval/{s['suite']}/{name}/mean"] = c["mean"]
        if path is None:  # the starting model: the baseline of the gains, never the best
            self.previous = self.start = result
            self.log(f"eval of the starting model (step 0): score {score:.3f}")
            return record
        if self.previous is not None:
            record.update(gate_metrics("vs_previous", self._compare(self.previous, result)))
        if self.start is not None:
            record.update(gate_metrics("vs_start", self._compare(self.start, result)))
        becomes_best = self.best is None
        if self.best is not None:
            vs_best = self._compare(self.best, result)
            record.update(gate_metrics("vs_best", vs_best))
            becomes_best = score > suite_score(self.best) and not record["eval/vs_best/regressed"]
        if becomes_best:
            ckpt.write_best_pointer(self.run_dir, {"checkpoint": path.name, "step": step, "score": score,
                                                   "path": str(path)})
            self.best = result
        record["eval/is_best"] = int(becomes_best)
        write_gate_file(path, record)
        regressed = [ref for ref in ("vs_previous", "vs_best") if record.get(f"eval/{ref}/regressed")]
        if regressed:
            self.notify("gate_regressed", step=step, checkpoint=path.name, score=score,
                        regressed=regressed, best_step=self.best["step"],
                        diffs={k.removeprefix("eval/"): v for k, v in record.items() if k.endswith("/diff")})
        record["eval/best_step"] = self.best["step"]
        self.previous = result
        self.log(f"eval of step {step}: score {score:.3f}" + gain_text(record)
                 + (" (new best)" if becomes_best else f" (best stays step {self.best['step']})")
                 + (" REGRESSED vs previous" if record.get("eval/vs_previous/regressed") else ""))
        return record

    def best_checkpoint(self) -> Path | None:
        best = ckpt.read_best_pointer(self.run_dir)
        return self.run_dir / "checkpoints" / best["checkpoint"] if best else None

    def summary(self) -> dict:
        """For summary.json: the best checkpoint, best.json as it stands, and the suite curve from evals/ (step 0
        first on a run that started fresh): [{"step", "score"}] in step order."""
        best = self.best_checkpoint()
        curve = [{"step": r["step"], "score": suite_score(r)}
                 for r in map(self._load, eval_steps(self.run_dir)) if r is not None]
        return {"best_checkpoint": str(best) if best else None, "best_eval": ckpt.read_best_pointer(self.run_dir),
                "eval_scores": curve}


def gain_text(record: dict) -> str:
    """', vs the start: run_reward +0.210 [+0.150, +0.270]' for each suite gated against the starting model."""
    suites = [k.split("/")[2] for k in record if k.startswith("eval/vs_start/") and k.endswith("/diff")]
    parts = [f"{s} {record[f'eval/vs_start/{s}/diff']:+.3f} [{record[f'eval/vs_start/{s}/ci_low']:+.3f}, "
             f"{record[f'eval/vs_start/{s}/ci_high']:+.3f}]" for s in suites]
    return f", vs the start: {', '.join(parts)}" if parts else ""


def release(checkpoint_dir: Path | None) -> None:
    """The evaluator is done with this checkpoint: retention may prune it (the starting model holds nothing)."""
    if checkpoint_dir is not None:
        (checkpoint_dir / ckpt.HOLD).unlink(missing_ok=True)


def eval_steps(run_dir: Path) -> list[int]:
    """The steps with a result under runs/<name>/evals/, in order."""
    found = sorted((run_dir / "evals").glob(f"{ckpt.PREFIX}*/results.json"))
    return [int(p.parent.name[len(ckpt.PREFIX):]) for p in found]
