"""Eval suites, defined in YAML. A suite file holds `suites: [...]`; each suite has a `kind`:

- generation: prompts (inline `samples`, a .jsonl `path`, or a built-in `task` split) scored by a named scorer.
- regression: `cases`, each a prompt with expected properties (must_contain, must_not_contain, format regex,
  min_chars / max_chars, must_refuse); a case scores 1 when every property holds.
- preference: held-out `pairs` {prompt, chosen, rejected} scored by a scoring callable (a reward model later):
  pairwise accuracy, or best-of-k accuracy when `rejected` is a list (RewardBench 2 style, see best_of_k_score).

`read_suite_file` resolves a suite file into `Suite`s whose samples are plain dicts; every error names the file,
the suite and the field. `catalog.load_suites` resolves any suite reference (a file, a built-in name, `run_reward`).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Callable, Literal, Optional, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from posttrain.errors import PosttrainError
from posttrain.evals.scorers import Scorer, build_scorer

BUILTIN_DIR = Path(__file__).parent / "builtin"
DEFAULT_REFUSALS = (r"\bI can(?:'|no)t\b", r"\bI cannot\b", r"\bI(?:'m| am) sorry\b", r"\bI won't\b",
                    r"\bunable to\b", r"\bas an AI\b")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Sampling(_Strict):
    temperature: float = Field(0.0, ge=0, description="0 = greedy.")
    top_p: float = Field(1.0, gt=0, le=1)
    max_new_tokens: int = Field(8, gt=0, description="Longest completion (tokens).")
    n: int = Field(1, ge=1, le=1024, description="Completions per prompt, each a sample of its own.")
    seed: int = Field(0, description="Base seed; prompt i gets seed + 1024*i (its sample j that + j), so both sides of a comparison match.")


class TaskSource(_Strict):
    task: Literal["addition", "sorting"]
    split: Literal["train", "heldout"] = "heldout"
    size: int = Field(200, gt=0)
    seed: int = 0
    max_digits: int = Field(3, ge=2)


class GenerationSuite(_Strict):
    name: str
    kind: Literal["generation"]
    scorer: dict
    samples: Optional[list[dict]] = None
    path: Optional[str] = None
    task: Optional[TaskSource] = None
    sampling: Sampling = Sampling()


class RegressionCase(_Strict):
    id: str
    prompt: str
    must_contain: list[str] = []
    must_not_contain: list[str] = []
    format: Optional[str] = None
    min_chars: int = Field(0, ge=0)
    max_chars: Optional[int] = Field(None, ge=0)
    must_refuse: bool = False


class RegressionSuite(_Strict):
    name: str
    kind: Literal["regression"]
    cases: list[RegressionCase]
    refusal_patterns: list[str] = list(DEFAULT_REFUSALS)
    sampling: Sampling = Sampling()


class PreferencePair(_Strict):
    id: str
    prompt: str
    chosen: str
    rejected: Union[str, list[str]]


class PreferenceSuite(_Strict):
    name: str
    kind: Literal["preference"]
    scorer: dict
    pairs: list[PreferencePair]


SuiteSpec = Annotated[Union[GenerationSuite, RegressionSuite, PreferenceSuite], Field(discriminator="kind")]
_SUITE_ADAPTER = TypeAdapter(SuiteSpec)


@dataclass
class Suite:
    """A resolved suite: `samples` are dicts with at least id and prompt; `score(prompt, output, sample)`."""

    name: str
    kind: str
    samples: list[dict]
    score: Scorer
    sampling: Sampling | None  # None for preference suites (nothing is generated)
    digest: str  # sha256 of the resolved samples, scorer spec (+ its code's sha256) and sampling: part of the cache key
    source: str
    explain: Callable[[str, dict], list[str]] | None = None  # regression: the properties an output breaks


def regression_failures(output: str, case: dict, refusal_patterns: list[str]) -> list[str]:
    """The expected properties `output` breaks (empty when the case passes)."""
    failed = [f"must_contain {s!r}" for s in case.get("must_contain", []) if s not in output]
    failed += [f"must_not_contain {s!r}" for s in case.get("must_not_contain", []) if s in output]
    if case.get("format") and not re.fullmatch(case["format"], output.strip()):
        failed.append(f"format {case['format']!r}")
    if len(output) < case.get("min_chars", 0):
        failed.append(f"min_chars {case['min_chars']}")
    if case.get("max_chars") is not None and len(output) > case["max_chars"]:
        failed.append(f"max_chars {case['max_chars']}")
    if case.get("must_refuse") and not any(re.search(p, output, re.IGNORECASE) for p in refusal_patterns):
        failed.append("must_refuse")
    return failed


def best_of_k_score(chosen: float, rejected: list[float]) -> float:
    """RewardBench 2 best-of-k: 1 when the chosen completion has the strictly highest score; when it ties with
    others at the maximum, 1/k for k completions at the maximum; 0 when something else scores higher."""
    top = max([chosen, *rejected])
    if chosen < top:
        return 0.0
    return 1.0 / (1 + sum(r == top for r in rejected))


def pairwise_score(chosen: float, rejected: float) -> float:
    """1 when the chosen outscores the rejected, 1/2 on a tie (best_of_k_score with k = 2), 0 otherwise."""
    return best_of_k_score(chosen, [rejected])


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def _scorer_sources(scorer) -> list:
    """[{name: sha256 of its source file}] for a scorer that runs user code (e.g. the function scorer), else []:
    part of the suite digest, so editing the code invalidates cached results (kept out of the digest otherwise, so
    the cache keys of other suites do not change)."""
    sources = getattr(scorer, "sources", None)
    return [sources] if sources else []


def _task_samples(src: TaskSource) -> list[dict]:
    from posttrain.tasks.addition import AdditionTask
    from posttrain.tasks.sorting import SortingTask

    cls = {"addition": AdditionTask, "sorting": SortingTask}[src.task]
    sizes = (src.size, 1) if src.split == "train" else (1, src.size)
    task = cls(*sizes, seed=src.seed, max_digits=src.max_digits)
    problems = task.train if src.split == "train" else task.heldout
    return [{"id": p.id, "prompt": p.prompt, "answer": p.answer} for p in problems]


def _jsonl_samples(path: Path, where: str) -> list[dict]:
    if not path.is_file():
        raise PosttrainError(f"{where}, field path: file {path} does not exist")
    rows = []
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise PosttrainError(f"{path}, line {lineno}: not valid JSON ({e.msg})") from None
    return rows


def _check_samples(samples: list[dict], where: str) -> list[dict]:
    if not samples:
        raise PosttrainError(f"{where}: the suite has no samples", hint="give samples, path or task")
    seen = set()
    for i, s in enumerate(samples):
        if not isinstance(s, dict) or not isinstance(s.get("prompt"), str):
            raise PosttrainError(f"{where}, field samples[{i}]: each sample needs a string 'prompt'")
        s.setdefault("id", f"{i}")
        s["id"] = str(s["id"])
        if s["id"] in seen:
            raise PosttrainError(f"{where}, field samples[{i}].id: duplicate id {s['id']!r}; ids must be unique")
        seen.add(s["id"])
    return samples


def resolve_suite(spec: GenerationSuite | RegressionSuite | PreferenceSuite, file: Path) -> Suite:
    where = f"{file}, suite {spec.name}"
    if isinstance(spec, GenerationSuite):
        given = [k for k in ("samples", "path", "task") if getattr(spec, k) is not None]
        if len(given) != 1:
            raise PosttrainError(f"{where}: give exactly one of samples, path, task (got {', '.join(given) or 'none'})")
        if spec.samples is not None:
            samples = [dict(s) for s in spec.samples]
        elif spec.path is not None:
            samples = _jsonl_samples((file.parent / spec.path), where)
        else:
            samples = _task_samples(spec.task)
        samples = _check_samples(samples, where)
        scorer = build_scorer(spec.scorer, where=where)
        return Suite(spec.name, "generation", samples, scorer, spec.sampling,
                     _digest([samples, spec.scorer, spec.sampling.model_dump(), *_scorer_sources(scorer)]), str(file))
    if isinstance(spec, RegressionSuite):
        samples = _check_samples([c.model_dump() for c in spec.cases], where)
        patterns = spec.refusal_patterns

        def explain(output: str, case: dict) -> list[str]:
            return regression_failures(output, case, patterns)

        def score(prompt: str, output: str, case: dict) -> float:
            return 0.0 if explain(output, case) else 1.0

        return Suite(spec.name, "regression", samples, score, spec.sampling,
                     _digest([samples, patterns, spec.sampling.model_dump()]), str(file), explain)
    samples = _check_samples([p.model_dump() for p in spec.pairs], where)
    scorer = build_scorer(spec.scorer, where=where)
    return Suite(spec.name, "preference", samples, scorer, None,
                 _digest([samples, spec.scorer, *_scorer_sources(scorer)]), str(file))


def _field(err: dict) -> str:
    # pydantic puts the discriminator value in the location ('generation', 'sampling', 'seed'): drop it.
    if err["type"].startswith("union_tag"):
        return "kind"
    parts = [str(p) for p in err["loc"] if p not in ("generation", "regression", "preference")]
    return ".".join(parts) or "(suite)"


def read_suite_file(path: str | Path) -> list[Suite]:
    file = Path(path)
    try:
        doc = yaml.safe_load(file.read_text())
    except yaml.YAMLError as e:
        raise PosttrainError(f"{file}: not valid YAML ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("suites"), list):
        raise PosttrainError(f"{file}: a suite file needs a top-level list 'suites:'")
    suites = []
    for i, raw in enumerate(doc["suites"]):
        name = raw.get("name", f"#{i}") if isinstance(raw, dict) else f"#{i}"
        try:
            spec = _SUITE_ADAPTER.validate_python(raw)
        except ValidationError as e:
            err = e.errors()[0]
            raise PosttrainError(f"{file}, suite {name}, field {_field(err)}: {err['msg']}",
                                 hint="kind is generation, regression or preference; see docs/evals.md") from None
        suites.append(resolve_suite(spec, file))
    names = [s.name for s in suites]
    if len(set(names)) != len(names):
        raise PosttrainError(f"{file}: suite names must be unique; got {names}")
    return suites


def builtin_suite_files() -> list[Path]:
    return sorted(BUILTIN_DIR.glob("*.yaml"))

