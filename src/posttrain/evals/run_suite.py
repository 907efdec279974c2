"""A suite built from a run's own config: `posttrain eval --model DIR --from-run runs/<name>`, or `run_reward` in
`eval.suites` (the run being trained).

Samples: the run's held-out split, built as the loop builds it (`load_task(cfg.task, cfg.seed)`), greedy with
`eval.max_new_tokens` as the loop's held-out eval. Score: the run's own reward, composed as in training
(rewards/scoring.py): sum over the weighted sources (verifier, length, format and each `reward.functions` entry)
of weight * score, a function's None adding nothing and a failed call giving `reward.default`. Each record keeps
its components (`components: {source: score}`) and failures (`errors: {source: why}`); the summary gives each
source's mean, SE and 95% CI (a function's None samples left out of its mean) beside the composite's.

The functions are checked against the sha256 the run recorded (config.yaml comments, `record_sources`): a file
that is gone or changed since the run is an error (`allow_changed` evaluates the new definition with a warning),
and the sha256 of each file is part of the suite's cache key. The reward-model and judge sources need their own
actors or endpoints: a run weighting them is refused here (evaluate them with the reward_model / judge scorers).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from posttrain.errors import PosttrainError
from posttrain.evals.suites import Sampling, Suite

RUN_REWARD = "run_reward"  # the suite's name, and the eval.suites entry that asks for it in the loop
_RECORDED = re.compile(r"^# reward function (\S+): .* sha256 ([0-9a-f]{64}) of ")


def recorded_sources(run_dir: Path) -> dict[str, str]:
    """name -> sha256 of each reward function's file as the run recorded it: config.yaml's comments (written at
    start), else summary.json's reward_functions."""
    found = {}
    for line in (run_dir / "config.yaml").read_text().splitlines():
        m = _RECORDED.match(line)
        if m:
            found[m.group(1)] = m.group(2)
    summary = run_dir / "summary.json"
    if not found and summary.is_file():
        for name, src in (json.loads(summary.read_text()).get("reward_functions") or {}).items():
            found[name] = src.get("sha256")
    return found


def read_run(run_dir: str | Path, *, allow_changed: bool = False, warn=print):
    """(the run's RunConfig, name -> sha256 of each reward function's file now, the run's task). PosttrainError
    when `run_dir` is not a run, or a function's file is gone or (unless `allow_changed`) changed since the run."""
    from posttrain.config import load_config
    from posttrain.rewards.functions import check_function
    from posttrain.tasks import load_task
    from posttrain.tasks.base import answer_needed

    d = Path(run_dir)
    where = f"--from-run {d}"
    if not (d / "config.yaml").is_file():
        raise PosttrainError(f"{where}: not a run directory (no config.yaml in it)",
                             hint="point --from-run at runs/<name>, the directory `posttrain train` wrote")
    cfg = load_config(d / "config.yaml")
    task = load_task(cfg.task, cfg.seed, need_answer=answer_needed(cfg.reward.weights))
    columns = getattr(task, "columns", ())  # a function may take the dataset's columns by name, as the loop allows
    recorded = recorded_sources(d)
    now = {}
    for i, f in enumerate(cfg.reward.functions):
        try:
            src = check_function(f.name, f.fn, f"reward.functions.{i}.fn", columns)
        except PosttrainError as e:
            was = f" (the run recorded sha256 {recorded[f.name]})" if f.name in recorded else ""
            raise PosttrainError(f"{where}: the run's reward function {f.name!r} cannot be loaded{was}: "
                                 f"{str(e).splitlines()[0]}",
                                 hint="restore the file the run used (run from the directory the run was started "
                                 "in: paths in its config.yaml are relative to it)") from None
        old = recorded.get(f.name)
        if old is not None and old != src.sha256:
            text = (f"{where}: reward function {f.name!r} ({src.file}) changed since the run: sha256 {old} (run) "
                    f"-> {src.sha256} (now)")
            if not allow_changed:
                raise PosttrainError(text, hint="restore the file the run used (e.g. from git), or pass "
                                     "--allow-changed-reward to score with the new definition")
            warn(f"warning: {text}; scoring with the new definition (--allow-changed-reward)")
        now[f.name] = src.sha256
    return cfg, now, task


class RunRewardScorer:
    """The run's reward on eval outputs, one `batch` call per suite (a batch function sees the whole suite)."""

    def __init__(self, cfg, task, sources: dict[str, str]):
        from posttrain.rewards.functions import FunctionScorers

        self.cfg, self.task, self.sources = cfg, task, sources
        self.weights = {**cfg.reward.weights, **{f.name: f.weight for f in cfg.reward.functions}}
        unsupported = [k for k in ("rm", "judge") if self.weights.get(k)]
        if unsupported:
            raise PosttrainError(f"--from-run: the run weights reward source(s) {unsupported}, which a run_reward "
                                 "suite does not score (they need a reward-model actor or a judge endpoint)",
                                 hint="evaluate them with a suite whose scorer is reward_model or judge "
                                 "(docs/evals.md)")
        self.functions = (FunctionScorers(cfg.reward.functions, cfg.reward.timeout_seconds, cfg.reward.default,
                                          field="reward.functions") if cfg.reward.functions else None)

    def batch(self, rows: list[dict]) -> tuple[list[float], list[dict]]:
        """rows: {prompt, output, record, tokens, id} -> (composed reward per row, {components, errors} per row)."""
        from posttrain.rewards.compose import compose, format_component, length_component
        from posttrain.rewards.verifier import score_one
        from posttrain.tasks import Problem

        r = self.cfg.reward
        outputs = [row["output"] for row in rows]
        verified = [score_one(self.task, Problem(row["record"]["id"], row["prompt"], row["record"]["answer"],
                                                 row["record"].get("columns") or {}), row["output"], r.default)
                    for row in rows]
        components = {"verifier": [v.reward for v in verified],
                      "length": length_component([row["tokens"] for row in rows], self.cfg.rollout.max_new_tokens),
                      "format": format_component(outputs, r.format_regex)}
        errors = [{"verifier": v.error} if v.error else {} for v in verified]
        if self.functions is not None:
            fn_rows = [{"prompt": row["prompt"], "completion": row["output"], "answer": row["record"]["answer"],
                        "completion_ids": None, "sample_id": str(row.get("id", row["record"]["id"])),
                        "columns": row["record"].get("columns") or {}} for row in rows]
            for name, (scores, errs) in self.functions.score(fn_rows, "eval").items():
                components[name] = scores
                for i, e in enumerate(errs):
                    if e is not None:
                        errors[i][name] = e
        total = compose(components, self.weights)
        shown = [k for k in components if k == "verifier" or k in self.weights]
        extras = []
        for i in range(len(rows)):
            extra = {"components": {k: components[k][i] for k in shown}}
            if errors[i]:
                extra["errors"] = errors[i]
            extras.append(extra)
        return total, extras


def run_suite(run_dir: str | Path, *, allow_changed: bool = False, warn=print) -> Suite:
    """The `run_reward` suite of the run in `run_dir` (see the module docstring)."""
    cfg, sources, task = read_run(run_dir, allow_changed=allow_changed, warn=warn)
    # the dataset's other columns go to the functions as in training
    samples = [{"id": p.id, "prompt": p.prompt, "answer": p.answer, "columns": p.columns} for p in task.heldout]
    sampling = Sampling(temperature=0.0, max_new_tokens=cfg.eval.max_new_tokens)
    scorer = RunRewardScorer(cfg, task, sources)
    blob = json.dumps([samples, cfg.reward.model_dump(mode="json"), cfg.task.model_dump(mode="json"),
                       cfg.rollout.max_new_tokens, sampling.model_dump(), sources], sort_keys=True, default=str)
    return Suite(RUN_REWARD, "generation", samples, scorer, sampling, hashlib.sha256(blob.encode()).hexdigest(),
                 str(Path(run_dir) / "config.yaml"))
