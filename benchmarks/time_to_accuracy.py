"""Time to accuracy, posttrain against TRL (issue 19): from one SFT-warm-started model on the built-in addition
task, the train wall time until greedy held-out accuracy first reaches the start + 10 points, for posttrain full,
posttrain LoRA, TRL's GRPOTrainer full and TRL LoRA (`peft_config`), with the same prompts in the same order, group
size, completion length, KL coefficient, learning rate (per kind: full or LoRA), seed and held-out set; then a
lever ablation: posttrain with one lever flipped per row. Writes benchmarks/results/time_to_accuracy.json.

    .venv/bin/python benchmarks/time_to_accuracy.py                  # all rows (~25 min on 2 quiet cores)
    .venv/bin/python benchmarks/time_to_accuracy.py --rows posttrain_full,trl_full --step-cap 8   # a quick look
    nice -n 5 .venv/bin/python benchmarks/time_to_accuracy.py --note "contended: 3 other engineers"

What is timed, on both sides: the steps' own wall time (rollout, reward, reference, train, weight sync), summed up
to the first held-out eval at or above the target. The evals themselves are outside it (posttrain: `time/eval` of
metrics.jsonl, outside `time/step`; TRL: a TrainerCallback that evaluates after on_step_end's timer), and so is
start-up (Ray, the vLLM engine, model loading). The held-out eval is the same on both sides: greedy, 8 new tokens,
exact match of the stripped completion, on the same 500 problems; posttrain's runs on its vLLM engines, TRL's with
transformers `generate` (their step-0 accuracies are in the JSON: they should agree).

posttrain's runs go to --step-cap (its eval.stop_at_accuracy takes an absolute accuracy, the target here is the
start + 10 points) and the time to target is read from the curve; TRL's stop at the target (its callback). With
one-step-off rollout, posttrain's held-out eval waits for the rollout in flight (one_step_off.py), so that
rollout's time would hide in the excluded eval time: those rows add back each eval's excess over the synchronous
runs' median eval time (`eval_wait_added_s`); their evals also see the engines' weights, one update behind the
trainer's.

TRL runs in its own venv (common.ensure_trl_venv, with peft at this venv's version for `peft_config`); both sides'
settings come from one common.Matched per kind (`matched`).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import common
from common import Matched, ensure_trl_venv, loadavg, log_to, lscpu_model, median, run_trl, step_batches, write_json

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "time_to_accuracy.json"

# The matched settings (both sides). Learning rates per kind: LoRA's adapters need a larger one than full weights.
# Full at 1e-3 collapsed posttrain's held-out accuracy from 0.18 to 0.00 within 64 steps (2026-12-04); 3e-4 is
# posttrain's default.
PROMPTS, GROUP, NEW_TOKENS, KL, CLIP, THREADS, SEED = 32, 8, 8, 0.02, 0.2, 2, 0
LR = {"full": 3e-4, "lora": 2e-3}
LORA = {"r": 16, "alpha": 32.0, "dropout": 0.0, "target_modules": "all-linear"}
HELDOUT, EVAL_TOKENS, DELTA = 500, 8, 0.10

# row -> (stack, kind, posttrain overrides beyond the matched ones). posttrain's main rows use its defaults
# (vLLM rollout, packing, skipping groups without learning signal, synchronous rollout); each ablation flips one.
MAIN = {
    "posttrain_full": ("posttrain", "full", []),
    "posttrain_lora": ("posttrain", "lora", []),
    "trl_full": ("trl", "full", []),
    "trl_lora": ("trl", "lora", []),
}
ABLATION = {
    "posttrain_full_hf_generate": ("posttrain", "full", ["rollout.engine=hf"]),
    "posttrain_full_one_step_off": ("posttrain", "full", ["rollout.async_one_step_off=true"]),
    "posttrain_full_no_group_skip": ("posttrain", "full", ["algorithm.skip_zero_variance_groups=false"]),
    "posttrain_full_no_packing": ("posttrain", "full", ["train.packing=false"]),
    "posttrain_lora_one_step_off": ("posttrain", "lora", ["rollout.async_one_step_off=true"]),
    "posttrain_full_dynamic_sampling": ("posttrain", "full", ["algorithm.dynamic_sampling_rounds=2"]),
    # one-step-off with the 2 cores split: the engine's thread beside one trainer/reference thread
    "posttrain_full_one_step_off_split": ("posttrain", "full", ["rollout.async_one_step_off=true",
                                                                "topology.torch_threads=1"]),
    "posttrain_lora_one_step_off_split": ("posttrain", "lora", ["rollout.async_one_step_off=true",
                                                                "topology.torch_threads=1"]),
}
ROWS = {**MAIN, **ABLATION}
LEVERS = {  # row -> (lever, the row it is compared with, whether the row has the lever on)
    "posttrain_full_no_packing": ("packing", "posttrain_full", False),
    "posttrain_full_no_group_skip": ("skipping groups with no learning signal", "posttrain_full", False),
    "posttrain_full_hf_generate": ("vLLM rollout instead of transformers generate", "posttrain_full", False),
    "posttrain_full_one_step_off": ("one-step-off overlap (full)", "posttrain_full", True),
    "posttrain_lora_one_step_off": ("one-step-off overlap (LoRA)", "posttrain_lora", True),
    "posttrain_full_dynamic_sampling": ("dynamic sampling (2 refill rounds)", "posttrain_full", True),
    "posttrain_full_one_step_off_split": ("one-step-off, 1 trainer thread beside the engine's (full)",
                                          "posttrain_full", True),
    "posttrain_lora_one_step_off_split": ("one-step-off, 1 trainer thread beside the engine's (LoRA)",
                                          "posttrain_lora", True),
    "posttrain_lora": ("LoRA (cheaper backward, shared reference) instead of full", "posttrain_full", True),
}


log = log_to("tta")


class LoadSampler:
    """/proc/loadavg's 1-minute figure every `every` seconds while the runs go (the machine is shared)."""

    def __init__(self, every: float = 10.0):
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every,), daemon=True)

    def _run(self, every: float) -> None:
        while not self._stop.is_set():
            self.samples.append(float(loadavg()[0]))
            self._stop.wait(every)

    def __enter__(self) -> "LoadSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict:
        s = self.samples
        return {"loadavg_1min_mean": round(sum(s) / len(s), 2) if s else None, "loadavg_1min_max": max(s, default=None),
                "samples": len(s)}


# ---------------------------------------------------------------------------------------------- data


def task_and_batches(step_cap: int):
    """The held-out problems and each step's prompts exactly as posttrain's loop draws them (the same cursor)."""
    from posttrain.config import TaskConfig

    return step_batches(TaskConfig(name="addition", heldout_size=HELDOUT), SEED, PROMPTS, step_cap)


def matched(kind: str) -> Matched:
    """Both sides' settings for `kind` (full or lora): the module's settings as --threads, --seed and --lr-* left
    them. posttrain scores with the addition task's own exact verifier, TRL with exact_answer (the same rule)."""
    return Matched(prompts_per_step=PROMPTS, group_size=GROUP, max_new_tokens=NEW_TOKENS, kl_coef=KL, lr=LR[kind],
                   clip_eps=CLIP, torch_threads=THREADS, seed=SEED, reward=f"{HERE / 'workload_rewards.py'}:exact_answer",
                   reward_builtin=True, lora=LORA if kind == "lora" else None)


# ---------------------------------------------------------------------------------------------- posttrain


def posttrain_overrides(name: str, runs: Path, model: str, kind: str, steps: int, every: int, extra: list[str]):
    return [
        f"name={name}", f"runs_dir={runs}", f"model.path={model}", f"train.steps={steps}",
        *matched(kind).posttrain_overrides(), "task.name=addition", f"task.heldout_size={HELDOUT}",
        f"eval.every={every}", f"eval.max_new_tokens={EVAL_TOKENS}", "checkpoint.every=0", "logging.progress=false",
        *extra,
    ]


def run_posttrain(name: str, runs: Path, model: str, kind: str, steps: int, every: int, extra: list[str]) -> dict:
    overrides = posttrain_overrides(name, runs, model, kind, steps, every, extra)
    run = common.run_posttrain(overrides)
    records, steps_m = run.records, run.steps
    curve, total, by_step = [], 0.0, {r["step"]: r for r in steps_m}
    for r in sorted((r for r in records if "eval/heldout_accuracy" in r), key=lambda r: r["step"]):
        total = sum(by_step[s]["time/step"] for s in by_step if s <= r["step"])
        curve.append({"step": r["step"], "accuracy": r["eval/heldout_accuracy"], "train_seconds": total,
                      "eval_seconds": r.get("time/eval")})
    split_keys = ("generate", "reward", "reference", "train", "sync", "other")
    return {"curve": curve, "overrides": overrides,
            "step_seconds": [r["time/step"] for r in steps_m],
            "step_split_seconds": [{k: r.get(f"time/{k}", 0.0) for k in split_keys} for r in steps_m],
            "kept_groups": [r.get("kept_groups") for r in steps_m]}


# ---------------------------------------------------------------------------------------------- TRL


def run_trl_side(py: Path, name: str, runs: Path, model: str, kind: str, batches, task, every: int) -> dict:
    work = runs / name
    work.mkdir(parents=True, exist_ok=True)
    spec = matched(kind).trl_spec(model, batches, work / "out",
                                  eval={"problems": common.problem_rows(task.heldout), "every": every,
                                        "max_new_tokens": EVAL_TOKENS, "target_delta": DELTA})
    out = run_trl(py, spec, work)
    return {"curve": out["eval"]["curve"], "step_seconds": out["step_seconds"],
            "step_split_seconds": out["step_split_seconds"], "non_default_settings": out["non_default_settings"],
            "peft": out["peft"], "trainable_params": out["trainable_params"], "versions": out["versions"],
            "reference_model_loaded": out["reference_model"]}


# ---------------------------------------------------------------------------------------------- summary


def summarize(res: dict, delta: float, pure_eval_s: float | None = None) -> dict:
    """Start and final accuracy, the first eval at or above start + delta: its step and the train seconds to it,
    and the median step split up to it. `pure_eval_s` (one-step-off rows): each eval's excess over it is rollout
    time that waited inside the eval; it is added back."""
    curve = res["curve"]
    start, target = curve[0]["accuracy"], curve[0]["accuracy"] + delta
    hit = next((c for c in curve if c["step"] > 0 and c["accuracy"] >= target - 1e-9), None)
    upto = hit["step"] if hit else len(res["step_seconds"])
    added = eval_wait_s(curve, upto, pure_eval_s) if pure_eval_s is not None else 0.0
    splits = res["step_split_seconds"][:upto] if res.get("step_split_seconds") else []
    out = {
        "start_accuracy": start, "target_accuracy": round(target, 4), "final_accuracy": curve[-1]["accuracy"],
        "best_accuracy": max(c["accuracy"] for c in curve), "steps_run": len(res["step_seconds"]),
        "reached": hit is not None, "steps_to_target": hit["step"] if hit else None,
        "seconds_to_target": (hit["train_seconds"] + added) if hit else None,
        "seconds_run": sum(res["step_seconds"]) + added,
        "median_step_s": median(res["step_seconds"]),
        "median_split_s_to_target": {k: round(median(s[k] for s in splits), 4) for k in splits[0]} if splits else None,
        "curve": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in c.items()} for c in curve],
    }
    if pure_eval_s is not None:
        out["eval_wait_added_s"] = round(added, 3)
    return out


def eval_wait_s(curve: list[dict], upto: int, pure_eval_s: float) -> float:
    """A one-step-off run's rollout time that waited inside its evals before step `upto`: each eval's excess over
    `pure_eval_s`, a synchronous run's eval time."""
    return sum(max(0.0, (c["eval_seconds"] or 0.0) - pure_eval_s) for c in curve if 0 < c["step"] < upto)


def ratios(rows: dict) -> dict:
    """posttrain's seconds to target over TRL's; when only posttrain reached it, an upper bound (TRL's seconds for
    all its steps), written '< x'."""
    def ratio(a: str, b: str):
        x, y = rows.get(a, {}).get("summary", {}), rows.get(b, {}).get("summary", {})
        if x.get("reached") and y.get("reached"):
            return round(x["seconds_to_target"] / y["seconds_to_target"], 3)
        if x.get("reached") and y:
            return f"< {x['seconds_to_target'] / y['seconds_run']:.3f} ({b} not at target after {y['steps_run']} steps)"
        return None

    reached = [r for r in rows if rows[r].get("summary", {}).get("reached")]
    best_pt = [r for r in ("posttrain_full", "posttrain_lora") if r in reached]
    best_trl = [r for r in ("trl_full", "trl_lora") if r in rows]
    out = {"posttrain_full / trl_full": ratio("posttrain_full", "trl_full"),
           "posttrain_lora / trl_lora": ratio("posttrain_lora", "trl_lora")}
    if best_pt and best_trl:
        p = min(best_pt, key=lambda r: rows[r]["summary"]["seconds_to_target"])
        t = min(best_trl, key=lambda r: rows[r]["summary"]["seconds_to_target"] or float("inf"))
        out[f"best posttrain ({p}) / best TRL ({t})"] = ratio(p, t)
    out["per step, median (not a time to accuracy)"] = {
        f"{a} / {b}": round(rows[a]["summary"]["median_step_s"] / rows[b]["summary"]["median_step_s"], 3)
        for a, b in (("posttrain_full", "trl_full"), ("posttrain_lora", "trl_lora")) if a in rows and b in rows}
    out["target"] = "<= 0.25"
    return out


def levers(rows: dict) -> list[dict]:
    out = []
    for row, (lever, base, on) in LEVERS.items():
        a, b = rows.get(row, {}).get("summary"), rows.get(base, {}).get("summary")
        if not a or not b:
            continue
        with_lever, without = (a, b) if on else (b, a)
        entry = {"lever": lever, "row": row, "compared_with": base,
                 "seconds_to_target_with": with_lever["seconds_to_target"],
                 "seconds_to_target_without": without["seconds_to_target"],
                 "median_step_s_with": with_lever["median_step_s"], "median_step_s_without": without["median_step_s"],
                 "steps_to_target_with": with_lever["steps_to_target"],
                 "steps_to_target_without": without["steps_to_target"]}
        if entry["seconds_to_target_with"] and entry["seconds_to_target_without"]:
            entry["speedup_to_target"] = round(entry["seconds_to_target_without"] / entry["seconds_to_target_with"], 3)
        entry["speedup_per_step"] = round(entry["median_step_s_without"] / entry["median_step_s_with"], 3)
        out.append(entry)
    return out


# ---------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    global THREADS, SEED  # --threads, --seed: the settings the functions above read from the module
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default=",".join(ROWS), help=f"rows to run, of {', '.join(ROWS)}")
    ap.add_argument("--step-cap", type=int, default=160, help="most steps per run")
    ap.add_argument("--eval-every", type=int, default=4, help="held-out eval every k steps (both sides)")
    ap.add_argument("--warm-model", default=None, help="SFT model (default: runs/demo/sft-model, else one is made)")
    ap.add_argument("--runs-dir", default="runs/bench-tta")
    ap.add_argument("--threads", type=int, default=THREADS, help="torch threads: posttrain's trainer/reference, TRL's")
    ap.add_argument("--note", default="", help="a line for the JSON (e.g. what else ran on the machine)")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--seed", type=int, default=SEED, help="seeds the task split, batch order and sampling (both sides)")
    ap.add_argument("--lr-full", type=float, default=LR["full"], help="learning rate of the full rows (both sides)")
    ap.add_argument("--lr-lora", type=float, default=LR["lora"], help="learning rate of the LoRA rows (both sides)")
    ap.add_argument("--combine", nargs="+", metavar="JSON", help="write --out from per-seed result files, run nothing")
    args = ap.parse_args(argv)
    if args.combine:
        return combine_seeds([Path(p) for p in args.combine], Path(args.out))
    THREADS, SEED = args.threads, args.seed
    LR.update(full=args.lr_full, lora=args.lr_lora)
    wanted = [r for r in args.rows.split(",") if r]
    if unknown := [r for r in wanted if r not in ROWS]:
        raise SystemExit(f"--rows: unknown {unknown}; choose from {', '.join(ROWS)}")

    from perf import ensure_warm_model, machine

    from posttrain.config import RayConfig
    from posttrain.orchestration.runtime import start_ray, stop_ray

    runs = Path(args.runs_dir).resolve()
    runs.mkdir(parents=True, exist_ok=True)
    model = str(Path(ensure_warm_model(SimpleNamespace(warm_model=args.warm_model), runs)).resolve())
    task, batches = task_and_batches(args.step_cap)
    py = ensure_trl_venv(peft=True, log=log) if any(ROWS[r][0] == "trl" for r in wanted) else None
    rows: dict = {}
    t0 = time.perf_counter()
    load_start = loadavg()
    context = {"model": model, "load_start": load_start, "machine": machine(), "cpu": lscpu_model(), "t0": t0}
    with LoadSampler() as load:
        if any(ROWS[r][0] == "posttrain" for r in wanted):
            start_ray(RayConfig(num_cpus=4), 4)  # one Ray session for every posttrain run
        try:
            for name in wanted:
                stack, kind, extra = ROWS[name]
                log(f"{name} ({stack}, {kind}, lr {LR[kind]}{', ' + ' '.join(extra) if extra else ''})")
                before = len(load.samples)
                if stack == "posttrain":
                    res = run_posttrain(name, runs, model, kind, args.step_cap, args.eval_every, extra)
                else:
                    res = run_trl_side(py, name, runs, model, kind, batches, task, args.eval_every)
                during = load.samples[before:]
                res["loadavg_1min_during"] = [min(during), max(during)] if during else None
                rows[name] = {"stack": stack, "kind": kind, "lr": LR[kind], "extra": extra, "result": res}
                log(f"  curve {[(c['step'], round(c['accuracy'], 3)) for c in res['curve']]}")
                out = write_results(args, rows, context, load)  # after every row: a stopped run keeps its rows
        finally:
            stop_ray()
    out = write_results(args, rows, context, load)
    for name, s in out["rows"].items():
        log(f"{name}: start {s['start_accuracy']:.3f} final {s['final_accuracy']:.3f} reached {s['reached']} "
            f"in {s['steps_to_target']} steps, {s['seconds_to_target']} s (median step {s['median_step_s']:.3f} s)")
    print(json.dumps({"rows": {n: {k: v for k, v in r.items() if k != "curve"} for n, r in out["rows"].items()},
                      "ratio": out["ratio_seconds_to_target"], "levers": out["levers"]}, indent=1))
    print(f"wrote {args.out}")
    return 0


def write_results(args, rows: dict, context: dict, load: LoadSampler) -> dict:
    """Summaries of the rows run so far, the machine, the load and both sides' settings, written to --out."""
    # one-step-off: add back rollout time that waited inside the evals (see the docstring)
    sync_evals = [c["eval_seconds"] for n, r in rows.items() if r["stack"] == "posttrain" and "one_step_off" not in n
                  for c in r["result"]["curve"] if c["step"] > 0 and c["eval_seconds"]]
    pure_eval = median(sync_evals)
    for name, r in rows.items():
        r["summary"] = summarize(r["result"], DELTA, pure_eval if "one_step_off" in name else None)
    out = {
        "what": "train wall seconds (eval and start-up excluded) until greedy held-out accuracy first reaches the "
                "start + 10 points; posttrain vs TRL GRPOTrainer, full and LoRA, from one SFT-warm-started model",
        "note": args.note,
        "command": " ".join(sys.argv),
        "machine": {**context["machine"], "cpu_model_lscpu": context["cpu"],
                    "loadavg_1_5_15_min_at_start": context["load_start"],
                    "loadavg_1_5_15_min_at_end": loadavg(),
                    "load_during": load.summary(),
                    "contended": contention(load.summary())},
        "model": context["model"], "task": f"addition (built-in), {HELDOUT} held-out problems, seed {SEED}",
        "settings": {
            "both": {"prompts_per_step": PROMPTS, "group_size": GROUP, "max_new_tokens": NEW_TOKENS, "kl_coef": KL,
                     "clip_eps": CLIP, "lr_full": LR["full"], "lr_lora": LR["lora"], "lr_schedule": "constant",
                     "lora": LORA, "torch_threads": THREADS, "seed": SEED, "eval_every": args.eval_every,
                     "eval": f"greedy, {EVAL_TOKENS} new tokens, exact match, {HELDOUT} held-out problems",
                     "target": f"start + {DELTA}", "step_cap": args.step_cap,
                     "prompts": "the same batches in the same order (posttrain's sampler cursor; TRL "
                                "shuffle_dataset=False)"},
            "posttrain": {n: r["result"]["overrides"] for n, r in rows.items() if r["stack"] == "posttrain"},
            "trl": {n: {"non_default_settings": r["result"]["non_default_settings"], "peft": r["result"]["peft"],
                        "trainable_params": r["result"]["trainable_params"],
                        "reference_model_loaded": r["result"]["reference_model_loaded"]}
                    for n, r in rows.items() if r["stack"] == "trl"},
            "trl_versions": next((r["result"]["versions"] for r in rows.values() if r["stack"] == "trl"), None),
        },
        "rows": {n: {"stack": r["stack"], "kind": r["kind"], "lr": r["lr"], "extra": r["extra"], **r["summary"],
                     "loadavg_1min_during": r["result"]["loadavg_1min_during"]} for n, r in rows.items()},
        "ratio_seconds_to_target": ratios(rows),
        "levers": levers(rows),
        "pure_eval_seconds_median": pure_eval,
        "wall_seconds": round(time.perf_counter() - context["t0"], 1),
    }
    write_json(args.out, out)
    return out


def contention(load: dict) -> str:
    """What the 1-minute load average during the runs says: about 2 on these 2 cores is the benchmark alone."""
    mean = load.get("loadavg_1min_mean") if load else None
    if mean is None:
        return "unknown"
    if mean > 3.0:
        return (f"contended: load {mean:.1f} on 2 cores, other jobs ran at the same time; rerun on a quiet machine "
                "before quoting")
    return f"quiet: load {mean:.1f} on 2 cores (the benchmark alone)"


def combine_seeds(paths: list[Path], out: Path) -> int:
    """One JSON from per-seed result files (several files may hold one seed's rows: the main rows and the lever
    rows, say): each row's seconds and steps to target per seed and their median, posttrain's ratio to TRL per
    seed (full, LoRA) with the median over the seeds where both reached it, and each lever per seed."""
    runs = [json.loads(p.read_text()) for p in paths]
    seed_of = [r["settings"]["both"]["seed"] for r in runs]
    seeds = list(dict.fromkeys(seed_of))
    pure = {s: median(r["pure_eval_seconds_median"] for r, rs in zip(runs, seed_of)
                      if rs == s and r.get("pure_eval_seconds_median")) for s in seeds}
    for r, s in zip(runs, seed_of):  # one-step-off rows alone in a file: eval wait added from the seed's sync evals
        if r.get("pure_eval_seconds_median") is None and pure[s] is not None:
            for name, x in r["rows"].items():
                if "one_step_off" in name:
                    add_eval_wait(x, pure[s])
    found: dict = {}  # row -> seed -> that row's result
    for r, s in zip(runs, seed_of):
        for name, x in r["rows"].items():
            found.setdefault(name, {})[s] = x
    rows = {}
    for name, per in found.items():
        rows[name] = {
            "seconds_to_target": {s: x["seconds_to_target"] for s, x in per.items()},
            "steps_to_target": {s: x["steps_to_target"] for s, x in per.items()},
            "steps_run": {s: x["steps_run"] for s, x in per.items()},
            "median_step_s": {s: x["median_step_s"] for s, x in per.items()},
            "median_split_s_to_target": {s: x["median_split_s_to_target"] for s, x in per.items()},
            "start_accuracy": {s: x["start_accuracy"] for s, x in per.items()},
            "reached_in": f"{sum(x['reached'] for x in per.values())} of {len(per)} seeds",
            "median_seconds_to_target_where_reached": median(x["seconds_to_target"] for x in per.values()
                                                             if x["reached"]),
        }
    ratio = {}
    pairs = [(a, "trl_" + ROWS[a][1]) for a in rows if a in ROWS and ROWS[a][0] == "posttrain"]  # each against TRL
    for a, b in pairs:
        if b in rows:
            both = {s: rows[a]["seconds_to_target"][s] / rows[b]["seconds_to_target"][s] for s in seeds
                    if rows[a]["seconds_to_target"].get(s) and rows[b]["seconds_to_target"].get(s)}
            ratio[f"{a} / {b}"] = {"per_seed": {s: round(v, 3) for s, v in both.items()},
                                  "median": round(median(both.values()), 3) if both else None,
                                  "seeds_where_both_reached": len(both)}
    combined = {"what": runs[0]["what"] + "; several seeds (each seeds the task split, batch order and sampling on "
                "both sides)", "seeds": seeds, "machine": runs[0]["machine"], "settings": runs[0]["settings"],
                "model": runs[0]["model"], "rows": rows, "ratio_seconds_to_target": ratio, "target": "<= 0.25",
                "levers": levers_over_seeds(found, seeds),
                "load_per_file": [{"seed": s, "rows": list(r["rows"]), **r["machine"]["load_during"]}
                                  for r, s in zip(runs, seed_of)],
                "per_seed_files": runs}
    write_json(out, combined)
    print(json.dumps({"rows": {n: {k: v for k, v in r.items() if k != "median_split_s_to_target"}
                               for n, r in rows.items()}, "ratio": ratio}, indent=1))
    return 0


def add_eval_wait(row: dict, pure_eval_s: float) -> None:
    """A one-step-off row summarized without a synchronous run beside it: add back each eval's excess over
    `pure_eval_s` (the same seed's synchronous eval time) to its seconds to target, as summarize() does."""
    added = eval_wait_s(row["curve"], row["steps_to_target"] or row["steps_run"], pure_eval_s)
    if row["reached"]:
        row["seconds_to_target"] += added
    row["seconds_run"] += added
    row["eval_wait_added_s"] = round(added, 3)


def levers_over_seeds(found: dict, seeds: list) -> list[dict]:
    """Each lever of LEVERS whose rows ran: per seed, the speed-up to target (None where either side missed it) and
    per step, with the medians over seeds."""
    out = []
    for row, (lever, base, on) in LEVERS.items():
        per = {}
        for s in seeds:
            a, b = found.get(row, {}).get(s), found.get(base, {}).get(s)
            if not a or not b:
                continue
            w, wo = (a, b) if on else (b, a)
            per[s] = {"speedup_to_target": round(wo["seconds_to_target"] / w["seconds_to_target"], 3)
                      if w["reached"] and wo["reached"] else None,
                      "speedup_per_step": round(wo["median_step_s"] / w["median_step_s"], 3),
                      "steps_to_target_with": w["steps_to_target"], "steps_to_target_without": wo["steps_to_target"]}
        if per:
            to_target = [v["speedup_to_target"] for v in per.values() if v["speedup_to_target"] is not None]
            out.append({"lever": lever, "row": row, "compared_with": base, "per_seed": per,
                        "median_speedup_to_target": median(to_target) if to_target else None,
                        "median_speedup_per_step": median(v["speedup_per_step"] for v in per.values())})
    return out


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    raise SystemExit(main())
