"""`posttrain review new`: both checkpoints' outputs on the same prompts, stored as a review session.

    posttrain review new --a runs/demo/sft --b runs/demo/checkpoints/final --prompts addition --n 100

Prompts come from an eval suite (a suite file or built-in name: its generation suites, in order), a run's held-out
split (`run:runs/<name>`, as `posttrain eval --from-run` builds it) or a .jsonl prompts file (rows {"prompt": str
or chat list, optional "id", optional "source"}); the first n are kept. Generation is `posttrain compare`'s: one
engine (vLLM, or transformers with --engine hf) starts on A, generates, loads B's weights and generates again with
the same per-prompt seeds (evals/runner.py), so any difference between the two outputs of an item is the weights'.
Everything is checked before the engine starts, and nothing is stored unless both models generated.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Optional

from posttrain.errors import PosttrainError
from posttrain.models.family import family_differences
from posttrain.models.loading import check_model_dir
from posttrain.evals.suites import Sampling, Suite
from posttrain.review.store import NewItem, ReviewInputError, ReviewStore

RUN_PREFIX = "run:"
FILE_SAMPLING = Sampling(temperature=0.0, max_new_tokens=64)  # a prompts file has no sampling of its own


@dataclass
class ReviewPlan:
    """What `review new` will generate: generation suites cut to n prompts, and each prompt's source name."""

    suites: list[Suite]
    sources: list[str]  # per prompt, in suite order: the per-source breakdown's key
    described: str  # where the prompts came from, for the session row
    available: int  # prompts the source holds (before the cut to n)


def _check_message_list(value) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value)


def read_prompts_file(path: Path) -> list[dict]:
    """Rows of a .jsonl prompts file as samples {id, prompt, source}; errors name the file and line."""
    if not path.is_file():
        raise PosttrainError(f"--prompts {path}: file does not exist",
                             hint="give a .jsonl of {\"prompt\": ...} rows, a suite file or built-in suite name "
                             "(e.g. addition), or run:runs/<name>")
    samples, seen = [], {}
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}, line {lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise PosttrainError(f"{where}: not valid JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise PosttrainError(f"{where}: a row must be an object with a 'prompt'")
        prompt = row.get("prompt")
        if not (isinstance(prompt, str) and prompt) and not _check_message_list(prompt):
            raise PosttrainError(f"{where}: field 'prompt' must be a non-empty string or a list of "
                                 "{role, content} messages")
        sid = str(row.get("id", lineno))
        if sid in seen:
            raise PosttrainError(f"{where}: id {sid!r} already used on line {seen[sid]}; ids must be unique")
        seen[sid] = lineno
        source = row.get("source", path.stem)
        if not isinstance(source, str) or not source:
            raise PosttrainError(f"{where}: field 'source' must be a non-empty string")
        samples.append({"id": sid, "prompt": prompt, "source": source})
    if not samples:
        raise PosttrainError(f"--prompts {path}: no rows", hint="add rows of {\"prompt\": ...}")
    return samples


def _load_source(source: str) -> tuple[list[Suite], Optional[list[str]], str]:
    """(generation suites, per-sample sources or None for "the suite's name", description)."""
    from posttrain.evals.catalog import load_suites

    if source.startswith(RUN_PREFIX):
        from posttrain.evals.run_suite import RUN_REWARD

        run_dir = source[len(RUN_PREFIX):]
        if not (Path(run_dir) / "config.yaml").is_file():
            raise ReviewInputError(f"--prompts {source}: {run_dir} is not a run directory (no config.yaml in it)",
                                   hint="give run:runs/<name>, the directory `posttrain train` wrote")
        return load_suites([RUN_REWARD], run_dir), None, f"held-out split of run {run_dir}"
    path = Path(source)
    if path.suffix == ".jsonl":
        samples = read_prompts_file(path)
        suite = Suite(path.stem, "generation", samples, lambda prompt, output, record: 0.0, FILE_SAMPLING,
                      "", str(path))
        return [suite], [s["source"] for s in samples], f"prompts {path}"
    if not path.exists() and ("/" in source or path.suffix in (".yaml", ".yml")):
        raise PosttrainError(f"--prompts {source}: file does not exist",
                             hint="give a suite file, a built-in suite name (e.g. addition), run:runs/<name> or "
                             "a .jsonl prompts file")
    try:
        suites = load_suites([source])
    except PosttrainError as e:
        if path.exists():
            raise
        raise PosttrainError(f"--prompts {source}: no such file, built-in suite or suite name ({e})",
                             hint="give a suite file, a built-in suite name (e.g. addition), run:runs/<name> or "
                             "a .jsonl prompts file") from None
    generation = [s for s in suites if s.kind == "generation"]
    if not generation:
        raise PosttrainError(f"--prompts {source}: no generation suite in it (kinds: "
                             f"{', '.join(sorted({s.kind for s in suites}))})",
                             hint="review prompts come from generation suites; give one, or a prompts file")
    return generation, None, f"suite {source}"


def plan_review(source: str, n: int, *, seed: int = 0, max_new_tokens: Optional[int] = None,
                temperature: Optional[float] = None) -> ReviewPlan:
    """The first n prompts of `source`, in suite order, one completion each, every suite's sampling seed set to
    `seed` and its max_new_tokens / temperature overridden when given."""
    if n <= 0:
        raise ReviewInputError(f"--n {n}: give a positive number of prompts")
    if max_new_tokens is not None and max_new_tokens <= 0:
        raise ReviewInputError(f"--max-new-tokens {max_new_tokens}: give a positive number of tokens")
    if temperature is not None and temperature < 0:
        raise ReviewInputError(f"--temperature {temperature}: must be >= 0 (0 = greedy)")
    suites, file_sources, described = _load_source(source)
    available = sum(len(s.samples) for s in suites)
    update = {"n": 1, "seed": seed}
    if max_new_tokens is not None:
        update["max_new_tokens"] = max_new_tokens
    if temperature is not None:
        update["temperature"] = temperature
    kept, sources, left = [], [], n
    for s in suites:
        if left == 0:
            break
        samples = s.samples[:left]
        left -= len(samples)
        sampling = s.sampling.model_copy(update=update)
        kept.append(replace(s, samples=samples, sampling=sampling, digest=""))  # digest: no cache is used
        sources += (file_sources[len(sources):len(sources) + len(samples)] if file_sources
                    else [s.name] * len(samples))
    return ReviewPlan(kept, sources, described, available)


def check_models(a: str, b: str, prompts: list) -> None:
    """Both are HF model dirs with the same config.json (but its _name_or_path) and tokenizers that give every
    prompt the same token ids: what one engine serving both (B's weights loaded into A's) needs."""
    pa, pb = check_model_dir(a, field="--a"), check_model_dir(b, field="--b")
    why = family_differences(pa, pb, prompts)
    if not why:
        return
    raise ReviewInputError(
        f"--a {a} and --b {b}: {'; '.join(why)}. One engine serves both models by loading B's weights into A's "
        "architecture, and under another tokenizer the same prompt text is a different token sequence, so the two "
        "outputs would not answer the same input",
        hint="review two checkpoints of one model family (e.g. a run's SFT model against its checkpoint, or a "
        "checkpoint against its base)")


def generate_items(plan: ReviewPlan, a: str, b: str, evaluator) -> tuple[list[NewItem], dict]:
    """A's then B's outputs on the plan's prompts with one evaluator (one engine, B's weights loaded into it), and
    the two models' content hashes {"a_hash", "b_hash"} (models/loading.py model_content_hash)."""
    from posttrain.evals.runner import evaluate

    res_a = evaluate(a, plan.suites, evaluator)
    hashes = {"a_hash": evaluator.model_hash}
    res_b = evaluate(b, plan.suites, evaluator)
    hashes["b_hash"] = evaluator.model_hash
    items, at = [], 0
    for suite, ra, rb in zip(plan.suites, res_a, res_b):
        for rec_a, rec_b in zip(ra.records, rb.records):
            assert rec_a["id"] == rec_b["id"], "both models generate the same samples in the same order"
            items.append(NewItem(f"{suite.name}/{rec_a['id']}", rec_a["prompt"], rec_a["output"], rec_b["output"],
                                 plan.sources[at]))
            at += 1
    return items, hashes


def new_session(*, a: str, b: str, prompts: str, n: int, db: str | Path, name: Optional[str] = None,
                double_share: float = 0.2, seed: int = 0, engine: str = "vllm", dtype: str = "float32",
                max_model_len: int = 128, max_new_tokens: Optional[int] = None, temperature: Optional[float] = None,
                log: Callable[[str], None] = print):
    """Checks every input, generates both models' outputs and stores the session; returns the Session."""
    from posttrain.evals.runner import EngineSettings, ModelEvaluator

    if engine not in ("vllm", "hf"):
        raise ReviewInputError(f"--engine {engine!r}: choose vllm or hf")
    if not 0.0 <= double_share <= 1.0:
        raise ReviewInputError(f"--double {double_share}: a share between 0 and 1")
    plan = plan_review(prompts, n, seed=seed, max_new_tokens=max_new_tokens, temperature=temperature)
    check_models(a, b, [sample["prompt"] for suite in plan.suites for sample in suite.samples])
    name = name or f"{Path(a).name}-vs-{Path(b).name}-{time.strftime('%Y%m%d-%H%M%S')}"
    if Path(db).is_file() and name in {s.id for s in ReviewStore(db).sessions()}:
        raise ReviewInputError(f"--name {name}: session exists in {db}", hint="pick another --name")
    if plan.available < n:
        log(f"{prompts} holds {plan.available} prompts, fewer than --n {n}: using all {plan.available}")
    start = time.perf_counter()
    evaluator = ModelEvaluator(EngineSettings(kind=engine, dtype=dtype, max_model_len=max_model_len), None)
    items, hashes = generate_items(plan, a, b, evaluator)
    meta = {"items": len(items), "engine": engine, "dtype": dtype, "seed": seed, "n_requested": n,
            "prompts": prompts,
            "sampling": {s.name: s.sampling.model_dump() for s in plan.suites},
            **hashes,
            "generation_seconds": round(time.perf_counter() - start, 2)}
    store = ReviewStore(db, create=True)
    return store.create_session(name, str(a), str(b), plan.described, items, double_share=double_share, seed=seed,
                                meta=meta)
