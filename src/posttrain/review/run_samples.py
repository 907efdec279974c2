"""What the sample browser reads from a run directory: every sample of samples.jsonl, the steps that raised an
alarm (metrics.jsonl `alarm/*`), and each sample's prompt, recovered from the run's config and task. Pure reading
and filtering; the web app (app.py) renders the result.

Which directories may be read is decided here too (`resolve_run_dir`): only those under the server's runs root,
because the page may be served to a team with a token and must not become a way to read any file on the machine.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from posttrain.errors import PosttrainError
from posttrain.review.store import ReviewInputError, Text
from posttrain.view.data import fired_alarms, read_jsonl

PER_PAGE = 50  # samples per page: runs log thousands (prompts_per_step * group_size per step)


@dataclass(frozen=True)
class Sample:
    step: int
    sample_id: str  # "<epoch>/<problem id>/<index in group>", as the loop writes it
    text: str  # the completion
    reward: float | None


@dataclass(frozen=True)
class SampleFilter:
    step_min: int | None = None
    step_max: int | None = None
    reward_min: float | None = None
    reward_max: float | None = None
    alarms_only: bool = False
    text: str = ""  # case-insensitive substring of the completion or the sample id

    def matches(self, s: Sample, alarm_steps: set[int]) -> bool:
        if self.step_min is not None and s.step < self.step_min:
            return False
        if self.step_max is not None and s.step > self.step_max:
            return False
        if (self.reward_min is not None or self.reward_max is not None) and s.reward is None:
            return False
        if self.reward_min is not None and s.reward < self.reward_min:
            return False
        if self.reward_max is not None and s.reward > self.reward_max:
            return False
        if self.alarms_only and s.step not in alarm_steps:
            return False
        needle = self.text.lower()
        return not needle or needle in s.text.lower() or needle in s.sample_id.lower()


def resolve_run_dir(runs_root: str | Path, run: str) -> tuple[Path, str]:
    """(the run directory, its name relative to the runs root) for `run`: a path relative to the runs root
    (`demo`, `sweep/a`) or an absolute one inside it. Anything outside the root, or without samples.jsonl, is a
    400 naming the root."""
    root = Path(runs_root).resolve()
    if not run or not run.strip():
        raise ReviewInputError("no run given", hint=f"pick a run directory under {root}")
    candidate = Path(run.strip())
    run_dir = (candidate if candidate.is_absolute() else root / candidate).resolve()
    if not run_dir.is_relative_to(root):
        raise ReviewInputError(f"run {run!r} is outside the runs root {root}",
                               hint="the sample browser reads only run directories under --runs-root")
    if not (run_dir / "samples.jsonl").is_file():
        raise ReviewInputError(f"run {run!r}: no samples.jsonl in {run_dir}", status=404,
                               hint="pick a run that has logged at least one step")
    return run_dir, run_dir.relative_to(root).as_posix() or "."


def list_runs(runs_root: str | Path, max_depth: int = 2) -> list[str]:
    """Names (relative to the runs root) of directories that hold a samples.jsonl, up to `max_depth` levels down."""
    root = Path(runs_root)
    if not root.is_dir():
        return []
    found = []
    for depth in range(1, max_depth + 1):
        for f in root.glob("/".join(["*"] * depth) + "/samples.jsonl"):
            found.append(f.parent.relative_to(root).as_posix())
    return sorted(found)


def read_samples(run_dir: Path) -> tuple[list[Sample], list[str]]:
    """(every sample in step order, notes such as a half-written last line). A line is {"step", "samples":
    [[sample_id, completion, reward], ...]}; a malformed sample row is skipped and noted rather than failing the page."""
    notes: list[str] = []
    out: list[Sample] = []
    for line in read_jsonl(run_dir / "samples.jsonl", notes):
        step = int(line.get("step", 0))
        for row in line.get("samples") or []:
            if not (isinstance(row, list) and len(row) >= 2):
                notes.append(f"samples.jsonl step {step}: a sample row that is not [id, text, reward]; skipped")
                continue
            reward = row[2] if len(row) > 2 and isinstance(row[2], (int, float)) else None
            out.append(Sample(step, str(row[0]), str(row[1]), None if reward is None else float(reward)))
    out.sort(key=lambda s: s.step)  # stable: within a step, the loop's order
    return out, notes


def alarm_steps(run_dir: Path) -> dict[int, list[str]]:
    """step -> names of the alarms that fired there (a metrics.jsonl `alarm/<name>` key with a true, non-zero or
    non-empty value), as the run viewer counts them."""
    fired = fired_alarms(read_jsonl(run_dir / "metrics.jsonl", []))
    return {step: list(names) for step, names in fired.items()}


def find_sample(run_dir: Path, step: int, sample_id: str) -> Sample:
    """The sample to flag, read from the file (the page's copy of the text is not trusted)."""
    for s in read_samples(run_dir)[0]:
        if s.step == step and s.sample_id == sample_id:
            return s
    raise ReviewInputError(f"no sample {sample_id!r} at step {step} in {run_dir / 'samples.jsonl'}", status=404)


def _number(query: dict, key: str, kind: type):
    raw = (query.get(key) or "").strip()
    if not raw:
        return None
    try:
        return kind(raw)
    except ValueError:
        raise ReviewInputError(f"{key}={raw!r} is not a {'whole number' if kind is int else 'number'}") from None


def parse_filter(query: dict) -> SampleFilter:
    """A SampleFilter from the page's query: step ("7" or "3-10"), reward_min, reward_max, alarms ("1"), q (text)."""
    step_min = step_max = None
    step = (query.get("step") or "").strip()
    if step:
        lo, sep, hi = step.partition("-")
        try:
            step_min = int(lo) if lo.strip() else None
            step_max = (int(hi) if hi.strip() else None) if sep else step_min
        except ValueError:
            raise ReviewInputError(f"step={step!r}: give one step (7) or a range (3-10)") from None
    return SampleFilter(step_min=step_min, step_max=step_max, reward_min=_number(query, "reward_min", float),
                        reward_max=_number(query, "reward_max", float), alarms_only=query.get("alarms") in ("1", "on"),
                        text=(query.get("q") or "").strip())


def filter_samples(samples: list[Sample], f: SampleFilter, alarms: dict[int, list[str]]) -> list[Sample]:
    steps = set(alarms)
    return [s for s in samples if f.matches(s, steps)]


def page_of(samples: list, page: int, per_page: int = PER_PAGE) -> tuple[list, int, int]:
    """(the samples on `page` (1-based, clamped into range), that page, the page count)."""
    pages = max(1, -(-len(samples) // per_page))
    page = min(max(1, page), pages)
    return samples[(page - 1) * per_page: page * per_page], page, pages


def problem_id_of(sample_id: str) -> str:
    """The problem id inside "<epoch>/<problem id>/<j>" (a problem id may itself contain '/')."""
    head, _, rest = sample_id.partition("/")
    return rest.rpartition("/")[0] if rest else sample_id


def prompt_lookup(run_dir: Path) -> tuple[Callable[[str], Text], str]:
    """(sample id -> its prompt, a note for the page). The prompts come from the run's task rebuilt from its
    config.yaml and seed; when that fails (no config, a dataset moved away) every prompt is "" and the note says why."""
    config = run_dir / "config.yaml"
    if not config.is_file():
        return (lambda _sid: ""), "prompts unavailable: the run has no config.yaml to rebuild its task from"
    try:
        from posttrain.config import load_config
        from posttrain.tasks import load_task

        cfg = load_config(config)
        task = load_task(cfg.task, cfg.seed, need_answer=False)
        prompts = {p.id: p.prompt for p in [*task.train, *task.heldout]}
    except (PosttrainError, OSError, ValueError, json.JSONDecodeError) as e:
        first_line = str(e).splitlines()[0] if str(e) else type(e).__name__
        return (lambda _sid: ""), f"prompts unavailable: the run's task could not be loaded ({first_line})"
    return (lambda sid: prompts.get(problem_id_of(sid), "")), ""
