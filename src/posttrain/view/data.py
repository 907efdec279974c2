"""What the run viewer reads from runs/<name>/: metrics.jsonl, samples.jsonl, config.yaml, summary.json and the
checkpoints with their manifests and gate verdicts. A run in progress is normal: a half-written last line is
skipped, and summary.json or checkpoints may not exist yet."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from posttrain.errors import PosttrainError

PHASES = ("generate", "reward", "reference", "train", "sync", "other")
# Which phases keep each role busy; sync occupies the trainer (export) and the engines (load) at once.
ROLE_PHASES = {"rollout": ("generate", "sync"), "trainer": ("train", "sync"), "reference": ("reference",), "reward": ("reward",)}
CHECKPOINT_DIR = re.compile(r"^step[_-](\d+)$")


@dataclass
class Checkpoint:
    step: int
    path: Path
    complete: bool  # manifest.json present (written last, so a checkpoint without one is incomplete)
    bytes: int | None
    created_unix: float | None
    gate: str | None  # the gate's verdict when one was recorded (manifest "gate" or gate.json)
    gate_detail: str = ""


@dataclass
class RunView:
    run_dir: Path
    name: str
    config: dict
    metrics: list[dict]
    summary: dict | None
    checkpoints: list[Checkpoint]
    samples: dict[int, list]  # step -> [[id, text, reward], ...] for the chosen steps
    sample_steps: list[int]  # every step that has samples
    notes: list[str] = field(default_factory=list)  # things the reader noticed (a half-written line, ...)
    episodes: dict[int, dict] = field(default_factory=dict)  # multi-turn runs: step -> {sample id: Episode.record()}

    @property
    def steps(self) -> list[dict]:
        """Training step records (eval-only lines excluded)."""
        return [m for m in self.metrics if "time/step" in m]

    @property
    def evals(self) -> list[tuple[int, float]]:
        return [(m["step"], m["eval/heldout_accuracy"]) for m in self.metrics if m.get("eval/heldout_accuracy") is not None]

    @property
    def alarms(self) -> dict[int, dict[str, object]]:
        return fired_alarms(self.metrics)

    @property
    def finished(self) -> bool:
        return self.summary is not None

    @property
    def total_steps(self) -> int | None:
        return (self.config.get("train") or {}).get("steps")


def fired_alarms(metrics: list[dict]) -> dict[int, dict[str, object]]:
    """step -> {alarm name: value} for every `alarm/*` key of metrics.jsonl that fired (a true, non-zero or
    non-empty value)."""
    out: dict[int, dict[str, object]] = {}
    for m in metrics:
        for k, v in m.items():
            if k.startswith("alarm/") and v not in (None, False, 0, 0.0, "", [], {}):
                out.setdefault(int(m.get("step", 0)), {})[k.removeprefix("alarm/")] = v
    return out


def read_jsonl(path: Path, notes: list[str]) -> list[dict]:
    """Rows of a jsonl file that may be being written: a broken last line is skipped (and noted); a broken line
    before it is an error naming the file and line."""
    if not path.exists():
        return []
    lines = path.read_text(errors="replace").split("\n")
    while lines and not lines[-1].strip():
        lines.pop()
    return read_jsonl_lines(path, lines, notes, last=True)


def read_jsonl_lines(path: Path, lines: list[str], notes: list[str], *, last: bool, first_line: int = 1) -> list[dict]:
    """Parses `lines` (line numbers from `first_line`); `last`: they end the file, so a broken final line is a
    write in progress rather than an error."""
    rows = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            if last and i == len(lines) - 1:
                notes.append(f"{path.name}: line {first_line + i} is incomplete (still being written); skipped")
                break
            raise PosttrainError(f"{path}: line {first_line + i} is not valid JSON ({e.msg})",
                                 hint="fix or remove that line; the viewer reads every other line as written") from None
    return rows


def _gate_of(ckpt_dir: Path, manifest: dict) -> tuple[str | None, str]:
    gate = manifest.get("gate")
    gate_file = ckpt_dir / "gate.json"
    if gate is None and gate_file.exists():
        try:
            gate = json.loads(gate_file.read_text())
        except json.JSONDecodeError:
            return "unreadable", f"{gate_file.name} is not valid JSON"
    if gate is None:
        return None, ""
    if isinstance(gate, dict):
        verdict = gate.get("verdict") or ("pass" if gate.get("passed") else "fail" if "passed" in gate else None)
        detail = gate.get("reason") or gate.get("detail") or ""
        return (str(verdict) if verdict is not None else "recorded"), str(detail)
    return str(gate), ""


def read_checkpoints(root: Path) -> list[Checkpoint]:
    out = []
    if not root.is_dir():
        return out
    for p in root.iterdir():
        m = CHECKPOINT_DIR.match(p.name)
        if not (p.is_dir() and m):
            continue
        mpath = p / "manifest.json"
        manifest = {}
        if mpath.exists():
            try:
                manifest = json.loads(mpath.read_text())
            except json.JSONDecodeError:
                manifest = {}
        files = manifest.get("files") or {}
        gate, detail = _gate_of(p, manifest)
        out.append(Checkpoint(
            step=int(m.group(1)), path=p, complete=bool(manifest), created_unix=manifest.get("created_unix"),
            bytes=sum(int(f.get("bytes", 0)) for f in files.values()) if files else None, gate=gate, gate_detail=detail,
        ))
    return sorted(out, key=lambda c: c.step)


STEP_PREFIX = re.compile(r'^\{"step": (\d+)[,}]')  # how the loop writes samples.jsonl lines


def read_samples(path: Path, wanted: list[int] | None, notes: list[str]) -> tuple[list[int], dict[int, list], dict[int, dict]]:
    """(every step with samples, {step: samples} and {step: episodes} (multi-turn runs only) for the wanted steps;
    default first, middle, last). Only the wanted lines are parsed in full: samples.jsonl grows by a batch of
    completions per step and is re-read on every rebuild of a served page."""
    if not path.exists():
        return [], {}, {}
    lines = [l for l in path.read_text(errors="replace").split("\n") if l.strip()]
    index: dict[int, int] = {}  # step -> line index
    for i, line in enumerate(lines):
        m = STEP_PREFIX.match(line)
        if m is None:  # not written by the loop: parse the line to find its step
            rows = read_jsonl_lines(path, [line], notes, last=i == len(lines) - 1, first_line=i + 1)
            if not rows:
                continue
        index[int(m.group(1)) if m else int(rows[0]["step"])] = i
    chosen = wanted or default_sample_steps(sorted(index))
    out, episodes = {}, {}
    for s in chosen:
        if s in index:
            i = index[s]
            rows = read_jsonl_lines(path, [lines[i]], notes, last=i == len(lines) - 1, first_line=i + 1)
            if rows:
                out[s] = rows[0].get("samples", [])
                if rows[0].get("episodes"):
                    episodes[s] = rows[0]["episodes"]
            else:  # the line being written
                del index[s]
    missing = [s for s in chosen if s not in index]
    if wanted and missing:
        notes.append(f"no samples recorded at step(s) {', '.join(map(str, missing))}")
    return sorted(index), out, episodes


def default_sample_steps(steps: list[int], count: int = 3) -> list[int]:
    """First, middle and last step (or fewer when the run has fewer)."""
    if not steps:
        return []
    picks = {steps[round(i * (len(steps) - 1) / max(count - 1, 1))] for i in range(count)}
    return sorted(picks)


def read_run(run_dir: str | Path, sample_steps: list[int] | None = None) -> RunView:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise PosttrainError(f"run directory {run_dir} does not exist", hint="pass runs/<name> of a run that has started")
    notes: list[str] = []
    config = {}
    if (run_dir / "config.yaml").exists():
        config = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    metrics = read_jsonl(run_dir / "metrics.jsonl", notes)
    if not metrics and not (run_dir / "metrics.jsonl").exists():
        notes.append("no metrics.jsonl yet: the run has not logged a step")
    summary = None
    if (run_dir / "summary.json").exists():
        try:
            summary = json.loads((run_dir / "summary.json").read_text())
        except json.JSONDecodeError:
            notes.append("summary.json is incomplete (still being written)")
    all_steps, samples, episodes = read_samples(run_dir / "samples.jsonl", sample_steps, notes)
    return RunView(run_dir=run_dir, name=config.get("name", run_dir.name), config=config, metrics=metrics,
                   summary=summary, checkpoints=read_checkpoints(run_dir / "checkpoints"), samples=samples,
                   sample_steps=all_steps, notes=notes, episodes=episodes)


def busy_fractions(steps: list[dict]) -> dict[str, float]:
    """Share of the steps' wall time each role was working (sums of its phases over sums of time/step). A role
    that reports `busy/<role>` itself is taken at its word (mean over steps)."""
    if not steps:
        return {}
    wall = sum(m.get("time/step") or 0.0 for m in steps) or 1e-9
    out = {}
    for role, phases in ROLE_PHASES.items():
        own = [m[f"busy/{role}"] for m in steps if m.get(f"busy/{role}") is not None]
        out[role] = sum(own) / len(own) if own else sum((m.get(f"time/{p}") or 0.0) for m in steps for p in phases) / wall
    return out
