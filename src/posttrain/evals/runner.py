"""Running suites on a model: generate with a rollout engine, score, summarise, cache.

A sample's record is {id, prompt, output, score, tokens} (+ `failed` for regression cases, `chosen_score` /
`rejected_scores` for preference pairs). Prompt i of a suite is sampled with seed `sampling.seed + 1024 i` (its sample j with that + j; see
`rollout.sampler.prompt_seeds`), so two
models evaluated on the same suite see identical prompts and seeds: their records pair up by id.

The cache key of a suite's records is sha256(model content hash, suite digest, sampling, engine, dtype): the
model content hash covers the weight files, config and tokenizer, so a re-run on unchanged inputs reads the
records instead of generating.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from posttrain.errors import PosttrainError
from posttrain.evals.scorers import score_outputs
from posttrain.evals.stats import mean_se
from posttrain.evals.suites import Suite, best_of_k_score, pairwise_score
from posttrain.models.loading import model_content_hash


@dataclass
class EngineSettings:
    kind: str = "vllm"  # "vllm" or "hf"
    dtype: str = "float32"
    max_model_len: int = 128  # tokens
    kv_cache_gb: float = 1.0

    def options(self) -> dict:
        if self.kind == "hf":
            return {"dtype": self.dtype, "max_model_len": self.max_model_len}
        return {"dtype": self.dtype, "max_model_len": self.max_model_len, "kv_cache_gb": self.kv_cache_gb}


SEED_LAYOUT = 2  # 1: prompt i had seed + i, so its samples shared streams with its neighbours'


def cache_key(model_hash: str, suite: Suite, engine: EngineSettings) -> str:
    sampling = suite.sampling.model_dump() if suite.sampling else None
    # SEED_LAYOUT: records sampled under an earlier seed layout are not these seeds' records
    blob = json.dumps([model_hash, suite.digest, sampling, engine.kind, engine.dtype, SEED_LAYOUT], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def generate_records(engine, encoder, suite: Suite) -> list[dict]:
    """Generates every sample of a generation/regression suite and scores it."""
    from posttrain.rollout.engine import SamplingSpec
    from posttrain.rollout.sampler import prompt_seeds

    s = suite.sampling
    prompts = [encoder.encode(x["prompt"]) for x in suite.samples]
    spec = SamplingSpec(n=s.n, max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p)
    groups = engine.generate(prompts, spec, prompt_seeds(s.seed, len(prompts)))
    rows = []
    for sample, group in zip(suite.samples, groups):
        for j, c in enumerate(group):
            rows.append({"prompt": sample["prompt"], "output": encoder.decode_completion(c.token_ids),
                         "record": sample, "tokens": len(c.token_ids),
                         "id": sample["id"] if s.n == 1 else f"{sample['id']}#{j}"})
    scores, extras = score_outputs(suite.score, rows)  # one call for a batch scorer
    records = []
    for i, (row, score) in enumerate(zip(rows, scores)):
        rec = {"id": row["id"], "prompt": row["prompt"], "output": row["output"], "score": score,
               "tokens": row["tokens"], **(extras[i] if extras is not None else {})}
        if suite.explain is not None:
            rec["failed"] = suite.explain(row["output"], row["record"])
        records.append(rec)
    return records


def preference_records(suite: Suite) -> list[dict]:
    """Scores each pair's chosen and rejected completions with the suite's scorer: pairwise accuracy, or
    best-of-k (RewardBench 2) when `rejected` is a list."""
    rows = []  # every pair's chosen, then its rejected completions: one call for a batch scorer
    for pair in suite.samples:
        rejected = pair["rejected"] if isinstance(pair["rejected"], list) else [pair["rejected"]]
        rows += [{"prompt": pair["prompt"], "output": text, "record": pair, "tokens": 0}
                 for text in [pair["chosen"], *rejected]]
    scores, _ = score_outputs(suite.score, rows)
    records, at = [], 0
    for pair in suite.samples:
        k = len(pair["rejected"]) if isinstance(pair["rejected"], list) else 1
        chosen, rejected_scores = scores[at], scores[at + 1:at + 1 + k]
        at += 1 + k
        score = (pairwise_score(chosen, rejected_scores[0]) if k == 1
                 else best_of_k_score(chosen, rejected_scores))
        records.append({"id": pair["id"], "prompt": pair["prompt"], "output": pair["chosen"], "score": score,
                        "tokens": 0, "chosen_score": chosen, "rejected_scores": rejected_scores})
    return records


Z95 = 1.959963984540054  # two-sided 95% normal quantile


def _mean_ci(scores: list[float]) -> dict:
    ms = mean_se(scores)
    return {"mean": ms.mean, "se": ms.se, "n": ms.n, "ci_low": ms.mean - Z95 * ms.se, "ci_high": ms.mean + Z95 * ms.se}


def summarize(records: list[dict]) -> dict:
    """mean, SE, n and the normal 95% CI of the scores, mean tokens; for records with `components` (the run_reward
    suite) the same per source, a source's None scores left out, and `failures` per source."""
    tokens = [r["tokens"] for r in records]
    out = {**_mean_ci([r["score"] for r in records]), "mean_tokens": sum(tokens) / len(tokens)}
    names = list(dict.fromkeys(k for r in records for k in r.get("components", {})))
    if names:
        scored = {k: [r["components"][k] for r in records if r["components"].get(k) is not None] for k in names}
        out["components"] = {k: _mean_ci(v) for k, v in scored.items() if v}
        out["failures"] = {k: sum(k in r.get("errors", {}) for r in records) for k in names}
    return out


@dataclass
class SuiteResult:
    suite: str
    kind: str
    records: list[dict]
    summary: dict
    cached: bool
    seconds: float  # wall time of generation + scoring (0 when cached)
    key: str = ""
    meta: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"suite": self.suite, "kind": self.kind, "summary": self.summary, "cached": self.cached,
                "seconds": self.seconds, "cache_key": self.key, "records": self.records}


class ModelEvaluator:
    """Evaluates suites on one model at a time, building the engine only when some suite is not cached.
    `switch(model_dir)` moves to another model of the same architecture and tokenizer by loading its weights
    into the running engine (one engine start for a whole comparison)."""

    def __init__(self, engine: EngineSettings, cache_dir: Path | None):
        self.settings = engine
        self.cache_dir = cache_dir
        self.engine = None
        self.encoder = None
        self.engine_model: str | None = None  # the model whose weights the engine holds
        # its config and tokenizer as read when they were loaded: in the loop, retention may delete that checkpoint
        # directory once the evaluator has read it, before the next checkpoint is compared against it
        self.engine_architecture: bytes | None = None
        self.model_dir: str | None = None
        self.model_hash = ""

    def use_model(self, model_dir: str | Path) -> None:
        from posttrain.models.loading import check_model_dir

        check_model_dir(model_dir, field="--model")
        self.model_dir = str(model_dir)
        self.model_hash = model_content_hash(model_dir)

    def _ensure_engine(self) -> None:
        from posttrain.models.loading import PromptEncoder, load_tokenizer
        from posttrain.rollout.engines import make_engine

        if self.engine is None:
            self.engine = make_engine(self.settings.kind, self.model_dir, **self.settings.options())
            self.encoder = PromptEncoder(load_tokenizer(self.model_dir))
            self.engine_architecture = architecture_files(self.model_dir)
        elif self.engine_model != self.model_dir:
            if architecture_files(self.model_dir) != self.engine_architecture:
                self._check_same_family()
            self.engine.update_weights(weights_bytes(self.model_dir))
        self.engine_model = self.model_dir

    def _check_same_family(self) -> None:
        """config.json or tokenizer.json differ in bytes from the engine's model: the same family all the same when
        they agree in what they do (transformers re-serializes every tokenizer it saves, so an SFT output differs
        from its base in bytes only). The engine's model directory may be gone by now (checkpoint retention in the
        loop); then the bytes are all there is to go by."""
        from posttrain.models.family import family_differences

        gone = not Path(self.engine_model).is_dir()
        why = ["its directory is gone, and config.json or tokenizer.json differ in bytes"] if gone else \
            family_differences(self.engine_model, self.model_dir)
        if why:
            raise PosttrainError(
                f"compare: {self.model_dir} and {self.engine_model} are not one model family ({'; '.join(why)}): one "
                "engine serves both by loading the second one's weights into the first one's architecture",
                hint="compare checkpoints of one model family, or run `posttrain eval` on each separately",
            )

    def run(self, suite: Suite) -> SuiteResult:
        key = cache_key(self.model_hash, suite, self.settings)
        path = self.cache_dir / f"{key}.json" if self.cache_dir else None
        if path is not None and path.is_file():
            records = json.loads(path.read_text())
            return SuiteResult(suite.name, suite.kind, records, summarize(records), True, 0.0, key)
        if suite.kind != "preference":
            self._ensure_engine()  # outside the timing: `seconds` is generation + scoring only
        start = time.perf_counter()
        if suite.kind == "preference":
            records = preference_records(suite)
        else:
            records = generate_records(self.engine, self.encoder, suite)
        seconds = time.perf_counter() - start
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(records))
            tmp.replace(path)
        return SuiteResult(suite.name, suite.kind, records, summarize(records), False, seconds, key)


def architecture_files(model_dir: str | Path) -> bytes:
    """config.json and tokenizer.json of a model directory (empty where absent), as one comparable value."""
    def read(name):
        p = Path(model_dir) / name
        return p.read_bytes() if p.is_file() else b""

    return read("config.json") + b"\0" + read("tokenizer.json")


def weights_bytes(model_dir: str | Path) -> bytes:
    """The model's weights as safetensors bytes keyed by HF names: the file itself when there is exactly one
    model.safetensors, otherwise loaded and re-exported."""
    single = Path(model_dir) / "model.safetensors"
    if single.is_file() and not list(Path(model_dir).glob("model-*.safetensors")):
        return single.read_bytes()
    from posttrain.models.loading import load_causal_lm
    from posttrain.models.weights import export_weights

    model, _ = load_causal_lm(model_dir)
    return export_weights(model)


def evaluate(model_dir: str | Path, suites: list[Suite], evaluator: ModelEvaluator, on_suite=None) -> list[SuiteResult]:
    """on_suite(done, result): called after each suite (the CLI's progress bar)."""
    evaluator.use_model(model_dir)
    results = []
    for s in suites:
        results.append(evaluator.run(s))
        if on_suite is not None:
            on_suite(len(results), results[-1])
    return results
