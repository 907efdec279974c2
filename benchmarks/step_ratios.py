"""Step time against TRL at three sizes, full and LoRA (issue 19): posttrain's GRPO step over TRL's GRPOTrainer step on
the same model, prompts, reward function, group size, completion length, KL, learning rate and threads, each with its
split (generate, reward, reference, train, sync). Sizes: perf.py's 4M and 94M shapes (character tokenizer) and the
Qwen2-0.5B shape of model_sizes.py (random init, its BPE tokenizer; prompts as plain text on both sides). Rounds
alternate which side runs first; each round's ratio is reported, and their median. Writes
benchmarks/results/step_ratios.json and prints a markdown table.

    .venv/bin/python benchmarks/step_ratios.py                               # all (~35 min on 2 cores)
    .venv/bin/python benchmarks/step_ratios.py --sizes 4m --kinds full --rounds 1 --steps 2   # a quick look

The workload is model_sizes.py's: 2 addition prompts x 4 samples, 32 new tokens, and perf.py's dense reward
(workload_rewards.py:vowel_share, the same file on both sides) so every group's rewards vary and every step updates
on both sides (a random model never solves an addition). posttrain runs its defaults (vLLM engine, packing) with
group skipping off (nothing to skip with a dense reward); TRL generates with transformers (its default without a
vLLM server) and its gradient checkpointing is off, as posttrain recomputes nothing. With LoRA (r=16, alpha 32,
all-linear) TRL's reference is its base with adapters off, as posttrain's is.

What is timed: posttrain's `time/step` (metrics.jsonl), TRL's on_step_begin -> on_step_end; the first `--warmup`
steps of each run are dropped. Start-up (Ray, engines, model loading) is outside both.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import common  # noqa: E402 (benchmarks/ on the path first)
from common import (GPU_NOTE, Matched, ensure_trl_venv, log_to, lscpu_model, md_table, median,  # noqa: E402
                    read_json, round_order, round_ratios, run_trl, step_batches, write_json)

RESULTS = HERE / "results" / "step_ratios.json"
RUNS = HERE.parent / "runs" / "bench-step-ratios"

PROMPTS, GROUP, NEW_TOKENS, KL, CLIP, THREADS, SEED = 2, 4, 32, 0.04, 0.2, 2, 0
LR = {"full": 1e-5, "lora": 1e-4}
LORA = {"r": 16, "alpha": 32.0, "dropout": 0.0, "target_modules": "all-linear"}
SIZES = ("4m", "94m", "qwen2-0.5b")
KINDS = ("full", "lora")
PHASES = ("generate", "reward", "reference", "train", "sync", "other")
REWARD = f"{HERE / 'workload_rewards.py'}:vowel_share"


log = log_to("step-ratios")


def matched(kind: str) -> Matched:
    """Both sides' settings for `kind` (full or lora); both score with workload_rewards.py:vowel_share."""
    return Matched(prompts_per_step=PROMPTS, group_size=GROUP, max_new_tokens=NEW_TOKENS, kl_coef=KL, lr=LR[kind],
                   clip_eps=CLIP, torch_threads=THREADS, seed=SEED, reward=REWARD,
                   lora=LORA if kind == "lora" else None)


def model_for(size: str) -> str:
    if size == "4m":
        from perf import model_dir

        return model_dir(RUNS, "4m")
    from model_sizes import model_dir

    return str(model_dir(size))


def batches(steps: int):
    from posttrain.config import TaskConfig

    return step_batches(TaskConfig(name="addition", heldout_size=16), SEED, PROMPTS, steps)[1]


def run_posttrain(name: str, model: str, kind: str, steps: int, warmup: int) -> dict:
    overrides = [
        f"name={name}", f"runs_dir={RUNS / 'runs'}", f"model.path={model}", f"train.steps={steps}",
        *matched(kind).posttrain_overrides(), "model.chat_template=never", "algorithm.skip_zero_variance_groups=false",
        "rollout.vllm.max_model_len=128", "rollout.vllm.kv_cache_gb=1", "task.name=addition", "task.heldout_size=16",
        "eval.every=0", "checkpoint.every=0", "logging.progress=false",
    ]
    m = common.run_posttrain(overrides).steps[warmup:]
    return {"step_seconds": [r["time/step"] for r in m],
            "split": [{k: r.get(f"time/{k}", 0.0) for k in PHASES} for r in m],
            "completion_mean_length": median([r["response_length"] for r in m]), "overrides": overrides}


def run_trl_side(py: Path, name: str, model: str, kind: str, steps: int, warmup: int) -> dict:
    work = RUNS / name
    work.mkdir(parents=True, exist_ok=True)
    out = run_trl(py, matched(kind).trl_spec(model, batches(steps), work / "out"), work)
    split = [{**s, "sync": 0.0, "other": 0.0} for s in out["step_split_seconds"][warmup:]]
    return {"step_seconds": out["step_seconds"][warmup:], "split": split,
            "completion_mean_length": median(out["completion_mean_length"][warmup:]),
            "trainable_params": out["trainable_params"], "reference_model_loaded": out["reference_model"],
            "non_default_settings": out["non_default_settings"], "versions": out["versions"]}


def summary(run: dict) -> dict:
    return {"median_step_s": median(run["step_seconds"]),
            "median_split_s": {k: median([s.get(k, 0.0) for s in run["split"]]) for k in PHASES}}


def machine() -> dict:
    return common.machine(cpu_model_lscpu=lscpu_model(), gpu=GPU_NOTE)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=",".join(SIZES))
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rounds-0.5b", dest="rounds_big", type=int, default=1, help="rounds at the 0.5B shape")
    ap.add_argument("--steps", type=int, default=4, help="measured steps per run")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--note", default="")
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args(argv)
    if args.report_only:
        print(markdown(read_json(RESULTS)))
        return 0
    py = ensure_trl_venv(peft=True, log=log)
    results = read_json(RESULTS, {"rows": {}})
    results.update({"what": __doc__.split("\n\n")[0], "machine": machine(), "note": args.note,
                    "command": " ".join(sys.argv),
                    "settings": {"prompts_per_step": PROMPTS, "group_size": GROUP, "max_new_tokens": NEW_TOKENS,
                                 "kl_coef": KL, "clip_eps": CLIP, "lr": LR, "torch_threads": THREADS, "lora": LORA,
                                 "reward": "workload_rewards.py:vowel_share", "steps": args.steps,
                                 "warmup": args.warmup}})
    total = args.steps + args.warmup
    for size in args.sizes.split(","):
        model = model_for(size)
        rounds = args.rounds_big if size == "qwen2-0.5b" else args.rounds
        for kind in args.kinds.split(","):
            row = {"size": size, "kind": kind, "model": model, "posttrain": [], "trl": [], "load_1m": []}
            for r in range(rounds):
                for side in round_order(("posttrain", "trl"), r):
                    name = f"{side}-{size}-{kind}-r{r}"
                    log(f"{name}")
                    t = time.time()
                    res = (run_posttrain(name, model, kind, total, args.warmup) if side == "posttrain"
                           else run_trl_side(py, name, model, kind, total, args.warmup))
                    res["wall_s"], res["load_1m_after"] = time.time() - t, os.getloadavg()[0]
                    row[side].append(res)
                    log(f"  median step {summary(res)['median_step_s']:.3f} s")
            ratios = round_ratios([summary(p)["median_step_s"] for p in row["posttrain"]],
                                  [summary(t)["median_step_s"] for t in row["trl"]])
            row.update({"round_ratios": ratios, "ratio": median(ratios),
                        "posttrain_summary": summary({"step_seconds": [x for p in row["posttrain"] for x in p["step_seconds"]],
                                                      "split": [x for p in row["posttrain"] for x in p["split"]]}),
                        "trl_summary": summary({"step_seconds": [x for t in row["trl"] for x in t["step_seconds"]],
                                                "split": [x for t in row["trl"] for x in t["split"]]})})
            results["rows"][f"{size}/{kind}"] = row
            write_json(RESULTS, results, end="")
    print(markdown(results))
    return 0


def markdown(results: dict) -> str:
    m = results["machine"]
    rows = []
    for row in results["rows"].values():
        for side in ("posttrain", "trl"):
            s = row[f"{side}_summary"]
            ratio = (f"{row['ratio']:.2f} ({', '.join(f'{x:.2f}' for x in row['round_ratios'])})"
                     if side == "posttrain" else "")
            rows.append([row["size"], row["kind"], side, f"{s['median_step_s']:.2f}",
                         *(f"{s['median_split_s'][k]:.2f}" for k in PHASES), ratio])
    return (f"Machine: {m.get('cpu_model_lscpu', m['cpu'])}, {m['cores']} cores, torch {m['torch']}. "
            f"Workload: {PROMPTS} prompts x {GROUP} samples, {NEW_TOKENS} new tokens, dense reward.\n\n"
            + md_table(["size", "kind", "stack", "step s", *PHASES, "ratio (rounds)"], rows))


if __name__ == "__main__":
    raise SystemExit(main())
