"""A run's files as the driver writes and reads them: its directory (runs/<name>/), the driver's half of a
checkpoint (`RunState`), resuming from the newest valid checkpoint, and summary.json's numbers. The trainer's half
of a checkpoint is training/trainer_state.py; the checkpoint directory format is checkpoint.py."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from posttrain import checkpoint as ckpt
from posttrain.config import RunConfig, dump_config
from posttrain.errors import PosttrainError
from posttrain.models.lora import check_resume_kind
from posttrain.rollout.sampler import Cursor
from posttrain.step_metrics import TIME_KEYS


@dataclass
class RunState:
    """The driver's half of a checkpoint (the trainer holds weights, optimizer and its RNG)."""

    step: int = 0
    cursor: Cursor = field(default_factory=Cursor)
    eval_history: list[dict] = field(default_factory=list)
    data_fingerprint: str | None = None  # of the training split the cursor walks (sampler.data_fingerprint)
    reward_functions: dict = field(default_factory=dict)  # name -> {fn, file, sha256, form} (reward.functions)
    data_rows: int | None = None  # rows of that split: says what changed when the fingerprint does
    data_changes: list[dict] = field(default_factory=list)  # resumes onto changed data (--allow-data-change)

    def to_json(self, fingerprint: str) -> dict:
        return {"step": self.step, "cursor": vars(self.cursor), "eval_history": self.eval_history,
                "config_fingerprint": fingerprint, "data_fingerprint": self.data_fingerprint,
                "data_rows": self.data_rows,
                **({"reward_functions": self.reward_functions} if self.reward_functions else {}),
                **({"data_changes": self.data_changes} if self.data_changes else {})}

    @classmethod
    def from_json(cls, d: dict) -> "RunState":
        return cls(d["step"], Cursor(**d["cursor"]), d["eval_history"], d.get("data_fingerprint"),
                   d.get("reward_functions", {}), d.get("data_rows"), d.get("data_changes", []))


def prepare_run_dir(cfg: RunConfig, resume: bool) -> Path:
    run_dir = cfg.run_dir
    ckpt_root = run_dir / "checkpoints"
    if not resume and ckpt.list_checkpoints(ckpt_root):
        raise PosttrainError(
            f"run directory {run_dir} already holds checkpoints",
            hint="pass --resume to continue it, or choose another run with name=<new name>",
        )
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write-probe"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise PosttrainError(f"runs_dir: cannot write to {run_dir} ({e.strerror})", hint="choose a writable runs_dir") from None
    for stale in ("metrics.jsonl", "samples.jsonl", "summary.json", "interruptions.jsonl"):
        if not resume and (run_dir / stale).exists():
            (run_dir / stale).unlink()
    (run_dir / "config.yaml").write_text(dump_config(cfg))
    return run_dir


def save_checkpoint(cfg: RunConfig, roles, state: RunState) -> Path:
    import ray

    root = cfg.run_dir / "checkpoints"
    tmp = ckpt.begin_checkpoint(root, state.step)
    try:
        ray.get([roles.trainer.save.remote(str(tmp))] + ([roles.critic.save.remote(str(tmp))] if roles.critic else []))
        (tmp / "state.json").write_text(json.dumps(state.to_json(cfg.fingerprint()), indent=1))
        final = ckpt.finalize_checkpoint(tmp, state.step)
    except Exception as e:
        if not ckpt.is_disk_full(e):
            raise
        shutil.rmtree(tmp, ignore_errors=True)
        raise PosttrainError(f"checkpoint at step {state.step}: no space left on the disk of {root}",
                             hint="free disk space, lower checkpoint.keep_last, then continue with --resume") from None
    best = ckpt.best_checkpoint(root, {e["step"]: e["heldout_accuracy"] for e in state.eval_history}) \
        if cfg.checkpoint.keep_best else None
    ckpt.prune_checkpoints(root, cfg.checkpoint.keep_last, protect=(best,) if best else ())
    return final


def load_resume_state(cfg: RunConfig, warn, data: str | None = None, rows: int | None = None,
                      allow_data_change: bool = False) -> tuple[Path, RunState]:
    """The newest valid checkpoint and its RunState, after the checks that make resuming it safe. `data`/`rows`:
    the training split's fingerprint and row count now; a difference is an error unless `allow_data_change`, which
    records it in the state (and so in every later checkpoint and the summary) instead."""
    root = cfg.run_dir / "checkpoints"
    path = ckpt.latest_valid_checkpoint(root, warn=warn)
    if path is None:
        raise PosttrainError(
            f"--resume: no valid checkpoint under {root}", hint="start the run without --resume",
        )
    check_resume_kind(cfg.model.lora, cfg.model.path, path)  # before the fingerprint: says what differs
    saved = json.loads((path / "state.json").read_text())
    if saved.get("config_fingerprint") != cfg.fingerprint():
        raise PosttrainError(
            f"--resume: the config's model/task/algorithm/seed differ from the checkpoint {path}",
            hint="resume with the run's own config (runs/<name>/config.yaml), changing only train.steps, eval or logging",
        )
    state = RunState.from_json(saved)
    old = saved.get("data_fingerprint")
    if data is not None and old not in (None, data):  # None: a checkpoint from before data fingerprints
        change = data_change(cfg, path, state, data, rows)
        if not allow_data_change:
            raise PosttrainError(
                f"--resume: {change['what']}; its data cursor would skip or repeat samples",
                hint="restore the dataset the run started with, start a new run (name=<new name>) on the new data, "
                     "or pass --allow-data-change to go on from the same cursor over the new data",
            )
        warn(f"--allow-data-change: {change['what']}; going on from data cursor {vars(state.cursor)} over the new "
             "data (recorded in the checkpoints' state.json and summary.json as data_changes)")
        state.data_changes.append({k: v for k, v in change.items() if k != "what"})
    return path, state


def data_change(cfg: RunConfig, path: Path, state: RunState, data: str, rows: int | None) -> dict:
    """What differs between the training data a checkpoint was trained on and the data now, as one sentence
    ("what") and as a record: the step resumed, the old and new fingerprints and row counts."""
    where = f"task.path {cfg.task.path}" if cfg.task.path else f"task {cfg.task.name}"
    count = f"; training rows {state.data_rows} -> {rows}" if state.data_rows is not None and rows is not None else ""
    what = (f"the training data of {where} differ from those the checkpoint {path} was trained on (fingerprint "
            f"{state.data_fingerprint} -> {data}{count})")
    return {"what": what, "step": state.step, "checkpoint": str(path), "data": where,
            "old_fingerprint": state.data_fingerprint, "new_fingerprint": data, "old_rows": state.data_rows,
            "new_rows": rows}


def resume_command(cfg: RunConfig) -> str:
    """The command that continues this run: its own resolved config, which the run dir keeps (prepare_run_dir)."""
    return f"posttrain train {(cfg.run_dir / 'config.yaml').resolve()} --resume"


def build_summary(cfg: RunConfig, state: RunState, final_ckpt: Path | None, wall: float) -> dict:
    from posttrain.cost.run_accounting import accounting_for_run
    from posttrain.tracking import read_metrics

    steps = [m for m in read_metrics(cfg.run_dir) if "time/step" in m]
    gaps = [m["logprob_gap_mean"] for m in steps if m.get("logprob_gap_mean") is not None]
    step_total = sum(m["time/step"] for m in steps) or 1e-9
    split = {k: sum(m[f"time/{k}"] for m in steps) / step_total for k in (*TIME_KEYS, "other")}
    return {
        "name": cfg.name,
        "steps": state.step,
        "heldout_accuracy_before": state.eval_history[0]["heldout_accuracy"] if state.eval_history else None,
        "heldout_accuracy_after": state.eval_history[-1]["heldout_accuracy"] if state.eval_history else None,
        "eval_history": state.eval_history,
        "train_wall_seconds": wall,
        "mean_step_seconds": step_total / max(len(steps), 1),
        "step_time_split": split,
        "logprob_gap_mean": sum(gaps) / len(gaps) if gaps else None,
        "final_checkpoint": str(final_ckpt) if final_ckpt else None,
        "accounting": accounting_for_run(cfg, steps),  # device-seconds, busy fraction per role, cost
        **({"data_changes": state.data_changes} if state.data_changes else {}),  # --allow-data-change resumes
    }


def remove_run(run_dir: Path) -> None:
    if run_dir.exists():
        shutil.rmtree(run_dir)
