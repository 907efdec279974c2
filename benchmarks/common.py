"""What the benchmarks share, in one version each: the median, the order of alternating rounds, the machine a number
was measured on, reading and writing the results JSON, markdown tables, running posttrain and running a child
benchmark process (TRL in its own venv, vLLM alone), and `Matched`: the one builder of the settings a posttrain vs
TRL comparison shares, from which both posttrain's overrides and TRL's GRPOConfig arguments are made.

Only the standard library is imported here at import time: benchmarks/perf_trl.py imports this file in TRL's own
venv (no posttrain), so whatever needs posttrain, torch or a library imports it when called. The benchmarks import
it as `common` (benchmarks/ is on the path when one runs: `python benchmarks/X.py`).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
GPU_NOTE = "not run: no GPU machine drawn for this task"
TRL_VENV = HERE / ".trl-venv"
TRL_VERSION = "1.16.0"


# ---------------------------------------------------------------------------------------------- numbers


def median(xs, empty=None):
    """The median of the values of `xs` (any iterable) that are not None; `empty` when there are none."""
    values = [x for x in xs if x is not None]
    return statistics.median(values) if values else empty


def round_order(items, r: int) -> tuple:
    """The order of round `r` when sides take turns going first: `items` rotated left by r (two sides swap every
    round), so drift on a shared machine falls on every side alike."""
    k = r % len(items)
    return tuple(items[k:]) + tuple(items[:k])


def first_at_target(curve: dict, step_seconds: dict, delta: float) -> tuple:
    """(the first step > 0 whose held-out score in `curve` {step: score} is at or above the start's, curve[0], plus
    `delta`, within float rounding; the seconds of `step_seconds` {step: s} summed up to it), or (None, None) when
    no step reaches it or the curve has no start."""
    start = curve.get(0)
    hit = None if start is None else next((s for s in sorted(curve) if s > 0 and curve[s] >= start + delta - 1e-9), None)
    return hit, (sum(v for s, v in step_seconds.items() if s <= hit) if hit else None)


def round_ratios(numerators, denominators) -> list[float]:
    """Each round's ratio: a side's value over the other side's value of the same round."""
    return [a / b for a, b in zip(numerators, denominators)]


# ---------------------------------------------------------------------------------------------- machine


def log_to(tag: str):
    """A logger that prints '[tag HH:MM:SS] message' to stderr."""
    def log(msg: str) -> None:
        print(f"[{tag} {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)
    return log


def loadavg() -> list[str]:
    """The 1, 5 and 15 minute load averages as /proc/loadavg writes them."""
    with open("/proc/loadavg") as f:
        return f.read().split()[:3]


def lscpu() -> list[str]:
    """`lscpu`'s lines."""
    return subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()


def lscpu_model() -> str:
    """The CPU model name as `lscpu` prints it ('?' when it does not)."""
    return next((line.split(":", 1)[1].strip() for line in lscpu() if line.startswith("Model name")), "?")


def library_version(name: str) -> str:
    return importlib.import_module(name).__version__


def machine(*libraries: str, **extra) -> dict:
    """posttrain.machine.describe_machine() (CPU, cores, memory, kernels, torch), then `extra`'s keys, then with
    `libraries` a "versions" entry: torch's and each named library's version."""
    from posttrain.machine import describe_machine

    out = {**describe_machine(), **extra}
    if libraries:
        out["versions"] = {"torch": out["torch"], **{name: library_version(name) for name in libraries}}
    return out


# ---------------------------------------------------------------------------------------------- results


def read_json(path, default=None):
    """The JSON at `path`, or `default` when there is no file."""
    path = Path(path)
    return json.loads(path.read_text()) if path.exists() else default


def run_seeded_rounds(results_path, sides, seeds, side_key: str, run_one, log) -> dict:
    """`run_one(side, seed)` for every seed, the sides taking turns going first (round_order); each result goes
    into the JSON at `results_path` as it comes (replacing an earlier one of that side and seed), with the CPU it ran
    on, so a benchmark stopped part way keeps what it measured. Returns the results."""
    results = read_json(results_path, default={"runs": []})
    results["machine"] = machine("vllm", "torch")
    for seed in seeds:
        for side in round_order(sides, seed):
            log(f"{side} seed {seed} ...")
            got = {**run_one(side, seed), "cpu": results["machine"]["cpu"]}  # runs of one file may span machines
            log(json.dumps({k: v for k, v in got.items() if k != "heldout"}))
            results["runs"] = [r for r in results["runs"] if (r[side_key], r["seed"]) != (side, seed)] + [got]
            write_json(results_path, results)
    return results


def bench_main(doc: str, sides: dict, side_key: str, results_path: Path, table, run_one, log) -> None:
    """The command line of a benchmark of real-model runs: --steps, --seeds, --<side_key>s (which of `sides` to
    run), --table; `run_one(side, seed, steps)` per run, in run_seeded_rounds."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument(f"--{side_key}s", dest="sides", nargs="+", default=list(sides), choices=list(sides))
    p.add_argument("--table", action="store_true", help="print the docs table from the results file and exit")
    args = p.parse_args()
    if args.table:
        print(table(read_json(results_path)))
        return
    results = run_seeded_rounds(results_path, args.sides, args.seeds, side_key,
                                lambda side, seed: run_one(side, seed, args.steps), log)
    print(table(results))


def write_json(path, data, *, indent: int | None = 1, end: str = "\n") -> Path:
    """`data` as JSON at `path` (its folder made), written beside it and renamed over it, so a reader, or a
    benchmark stopped while writing, never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=indent) + end)
    os.replace(tmp, path)
    return path


# ---------------------------------------------------------------------------------------------- tables


def md_row(cells) -> str:
    """One markdown table row: '| a | b |'."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def md_table(header, rows) -> str:
    """A markdown table: the header row, the '|---|' line, one row per item of `rows` (each a list of cells)."""
    return "\n".join([md_row(header), "|" + "---|" * len(header), *(md_row(r) for r in rows)])


# ---------------------------------------------------------------------------------------------- running posttrain


@dataclass
class PosttrainRun:
    cfg: object
    summary: dict
    records: list[dict]
    train_seconds: float  # train() alone: config loading and reading the metrics are outside it

    @property
    def steps(self) -> list[dict]:
        """The metrics records of the steps (the lines with time/step)."""
        return [r for r in self.records if "time/step" in r]


def run_posttrain(overrides: list[str]) -> PosttrainRun:
    """One posttrain run in this process on the default config with `overrides` (a previous run of the same name
    removed first), and its metrics records."""
    from posttrain.config import load_config
    from posttrain.loop import train
    from posttrain.run_files import remove_run
    from posttrain.tracking import read_metrics

    cfg = load_config(None, overrides)
    remove_run(cfg.run_dir)
    t0 = time.perf_counter()
    summary = train(cfg, progress=False)
    seconds = time.perf_counter() - t0
    return PosttrainRun(cfg, summary, read_metrics(cfg.run_dir), seconds)


def step_batches(task_cfg, seed: int, prompts_per_step: int, steps: int):
    """The task and each step's problems exactly as posttrain's loop draws them (its sampler, the same cursor):
    what the other side of a comparison trains on, in the same order."""
    from posttrain.rollout.sampler import PromptSampler
    from posttrain.tasks import load_task

    task = load_task(task_cfg, seed)
    sampler = PromptSampler(task.train, seed)
    return task, [sampler.next_batch(prompts_per_step) for _ in range(steps)]


def problem_rows(problems) -> list[dict]:
    """Problems as the JSON rows a child process reads: {"prompt", "answer"}."""
    return [{"prompt": p.prompt, "answer": p.answer} for p in problems]


# ---------------------------------------------------------------------------------------------- child processes


def run_logged(cmd: list[str], log_path, env: dict | None = None) -> None:
    """Runs `cmd` to completion (an error if it fails) with its stdout and stderr in `log_path`."""
    with open(log_path, "w") as logf:
        subprocess.run([str(c) for c in cmd], check=True, env=env, stdout=logf, stderr=subprocess.STDOUT)


def run_spec(python, script, spec: dict, work: Path, env: dict, log_name: str) -> dict:
    """A child benchmark `python script SPEC.json OUT.json`: `spec` written to work/spec.json, its output logged in
    work/`log_name`, its result (work/result.json) returned."""
    work = Path(work)
    write_json(work / "spec.json", spec, indent=None, end="")
    run_logged([python, script, work / "spec.json", work / "result.json"], work / log_name, env)
    return json.loads((work / "result.json").read_text())


def trl_env(threads: int) -> dict:
    """The environment TRL runs in: this one without PYTHONPATH (TRL's venv has no posttrain), `threads` OpenMP
    threads, everything offline."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update({"OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_DISABLED": "true"})
    return env


def run_trl(py: Path, spec: dict, work: Path) -> dict:
    """benchmarks/perf_trl.py on `spec` (from `Matched.trl_spec`) with TRL's venv python `py`, offline, with the
    spec's torch threads as OpenMP threads; its log in work/trl.log; returns its result JSON."""
    return run_spec(py, HERE / "perf_trl.py", spec, work, trl_env(spec["torch_threads"]), "trl.log")


def ensure_trl_venv(venv: Path = TRL_VENV, peft: bool = False, log=log_to("trl-venv")) -> Path:
    """TRL's own venv (its python returned): the CPU torch wheel first (checked: no CUDA build), then trl with torch
    and transformers pinned to this venv's versions, so both sides run the same torch and the same model code; with
    `peft`, peft at this venv's version too (TRL's `peft_config` needs it)."""
    import torch
    import transformers

    py = venv / "bin" / "python"
    stamp = venv / f".ok-trl{TRL_VERSION}-torch{torch.__version__}-tf{transformers.__version__}"
    if not stamp.exists():
        log(f"creating {venv} (torch {torch.__version__}, trl {TRL_VERSION})")
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        pip = [str(py), "-m", "pip", "install", "-q"]
        base = torch.__version__.split("+")[0]
        subprocess.run([*pip, f"torch=={base}"], check=True)  # pip prefers the +cpu wheel of the same release
        check = subprocess.run([str(py), "-c", "import torch; print(torch.__version__, torch.version.cuda)"],
                               check=True, capture_output=True, text=True).stdout.split()
        if check[1] != "None":
            raise SystemExit(f"{venv}: pip installed a CUDA torch ({check}); install the CPU wheel by hand and re-run")
        constraints = venv / "constraints.txt"
        constraints.write_text(f"torch=={base}\ntransformers=={transformers.__version__}\n")
        subprocess.run([*pip, "-c", str(constraints), f"trl=={TRL_VERSION}", "numpy"], check=True)
        stamp.touch()
    if peft:
        version = library_version("peft")
        peft_stamp = venv / f".ok-peft{version}"
        if not peft_stamp.exists():
            log(f"installing peft {version} into {venv}")
            subprocess.run([str(py), "-m", "pip", "install", "-q", "-c", str(venv / "constraints.txt"),
                            f"peft=={version}"], check=True)
            peft_stamp.touch()
    return py


# ---------------------------------------------------------------------------------------------- matched settings


@dataclass(frozen=True)
class Matched:
    """The settings a posttrain vs TRL comparison shares. posttrain's overrides (`posttrain_overrides`) and TRL's
    GRPOConfig arguments (`trl_spec`, read by perf_trl.py through `trl_grpo_args`) are both built from one of
    these, so no setting can differ between the sides by accident. What a run adds on top (its name, model,
    steps, task, evals) is the benchmark's; the model and prompts go to both sides from the same values."""

    prompts_per_step: int
    group_size: int
    max_new_tokens: int
    kl_coef: float  # k3 KL to a loaded reference, in the loss
    lr: float  # constant, no warm-up
    clip_eps: float  # one update per batch
    torch_threads: int
    seed: int
    reward: str  # "file.py:function", TRL's reward_funcs form (benchmarks/workload_rewards.py)
    reward_builtin: bool = False  # posttrain scores with the task's own verifier (the same rule as `reward`)
    lora: dict | None = None  # {"r", "alpha", "dropout", "target_modules"}; None = full fine-tuning
    temperature: float = 1.0
    top_p: float = 1.0
    max_grad_norm: float = 1.0

    def posttrain_overrides(self) -> list[str]:
        """posttrain's config overrides for these settings: GRPO, token-mean loss, constant lr."""
        out = [
            f"seed={self.seed}", "algorithm.name=grpo", f"algorithm.prompts_per_step={self.prompts_per_step}",
            f"algorithm.group_size={self.group_size}", f"algorithm.kl_coef={self.kl_coef}", f"algorithm.lr={self.lr}",
            "algorithm.lr_schedule=constant", f"algorithm.clip_eps={self.clip_eps}", "algorithm.loss_agg=token",
            f"algorithm.max_grad_norm={self.max_grad_norm}", f"rollout.max_new_tokens={self.max_new_tokens}",
            f"rollout.temperature={self.temperature}", f"rollout.top_p={self.top_p}",
            f"topology.torch_threads={self.torch_threads}",
        ]
        if not self.reward_builtin:
            name = self.reward.rsplit(":", 1)[1]
            out += ["reward.weights={}", f"reward.functions=[{{name: {name}, fn: '{self.reward}'}}]"]
        if self.lora:
            out += [f"model.lora.{k}={v}" for k, v in self.lora.items()]
        return out

    def trl_spec(self, model: str, batches, work_dir, **extra) -> dict:
        """The spec benchmarks/perf_trl.py runs TRL's GRPOTrainer on: these settings, the model and each step's
        problems (`batches`, as `step_batches` draws them), plus `extra` (perf_trl.py's optional "eval")."""
        return {"model": model, "batches": [problem_rows(b) for b in batches], "reward": self.reward,
                "group_size": self.group_size, "max_new_tokens": self.max_new_tokens, "kl_coef": self.kl_coef,
                "lr": self.lr, "clip_eps": self.clip_eps, "torch_threads": self.torch_threads, "seed": self.seed,
                "temperature": self.temperature, "top_p": self.top_p, "max_grad_norm": self.max_grad_norm,
                "work_dir": str(work_dir), "peft": self.lora, **extra}


def trl_grpo_args(spec: dict) -> dict:
    """TRL's GRPOConfig arguments for a `Matched.trl_spec`: the matched settings in TRL's names, and what makes TRL
    do what posttrain does (token-mean "dapo" loss, group-scaled advantages, no shuffling: the same batches in
    order, float32 on CPU, no gradient checkpointing: posttrain recomputes nothing in backward)."""
    n, per_step = spec["group_size"], len(spec["batches"][0])
    return dict(
        output_dir=spec["work_dir"], per_device_train_batch_size=per_step * n, gradient_accumulation_steps=1,
        num_generations=n, max_completion_length=spec["max_new_tokens"], beta=spec["kl_coef"],
        learning_rate=spec["lr"], lr_scheduler_type="constant", warmup_steps=0, loss_type="dapo",
        scale_rewards="group", epsilon=spec["clip_eps"], num_iterations=1, max_grad_norm=spec["max_grad_norm"],
        temperature=spec["temperature"], top_p=spec["top_p"], top_k=0, max_steps=len(spec["batches"]),
        shuffle_dataset=False, seed=spec["seed"], use_cpu=True, bf16=False, fp16=False, report_to="none",
        logging_steps=1, save_strategy="no", dataloader_num_workers=0, disable_dropout=True, log_completions=False,
        model_init_kwargs={"dtype": "float32"},
        gradient_checkpointing=False,  # TRL's default recomputes activations in backward; posttrain does not
    )
