"""Real model sizes on this machine: a Qwen2-0.5B-shaped model and the 94M shape of benchmarks/perf.py, built
locally (random init, no hub), each run for a few real GRPO steps through `posttrain train`, full fine-tuning and
LoRA (r=16, all-linear). Per run: the step-time split from metrics.jsonl (time/*, mean over the steps after the
first), every actor's peak RSS, and the planner's prediction for the same config, side by side.

    flock /tmp/posttrain-bench.lock .venv/bin/python benchmarks/model_sizes.py             # both shapes, full + LoRA
    flock /tmp/posttrain-bench.lock .venv/bin/python benchmarks/model_sizes.py --shapes qwen2-0.5b --modes lora
    .venv/bin/python benchmarks/model_sizes.py --report-only                                # the table from the JSON

Peak RSS: the loop does not log memory, so a thread here reads /proc/<pid>/status of every process under the
`posttrain train` subprocess (Ray's actors are its descendants) every 0.25 s. VmHWM is the kernel's own high-water
mark of a process's resident set, so a peak between two reads is not missed; it is taken when the last step's
metrics line appears ("through the steps") and again at exit (after the final eval and checkpoint). An actor is
named by its process title (ray::Trainer, ray::ReferenceModel, ray::RolloutWorker, ...). The planner predicts model
bytes (weights, gradients, AdamW states, activations, KV cache), not the process around them, so the JSON also
holds the peak RSS of a bare process that imports what an actor imports (torch, transformers, peft, vLLM): the
comparison is predicted + that baseline against the measured peak.

Models and runs are cached under runs/model-sizes/ (not in git): the 0.5B weights (~2 GB in fp32) and a byte-level
BPE tokenizer (models/bpe.py, ChatML template; 32,000 learned tokens, filler tokens up to the model's 151,936 ids)
are built once. Writes benchmarks/results/model_sizes.json (after every run) and prints two markdown tables.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from common import log_to, machine, md_table, read_json, write_json

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "runs" / "model-sizes"
RESULTS = ROOT / "benchmarks" / "results" / "model_sizes.json"

# Qwen2-0.5B's published config.json shape (random weights here): 494,032,768 parameters with tied embeddings.
QWEN2_05B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, rope_theta=1_000_000.0,
                 rms_norm_eps=1e-6, max_position_embeddings=2048, hidden_act="silu", initializer_range=0.02)
SHAPES = ("qwen2-0.5b", "94m")
MODES = ("full", "lora")
# The step: 2 addition prompts x 4 samples, 32 new tokens, a KL term (so full fine-tuning has a reference actor and
# LoRA a reference pass inside the trainer). A random model never gets an addition right, so perf.py's dense reward
# (the vowel share of the completion) is added to the verifier: rewards vary within every group and every step
# really updates the policy (with all-zero advantages a LoRA step would leave B = 0 and change nothing).
STEPS, PROMPTS, GROUP, NEW_TOKENS, KL, THREADS = 5, 2, 4, 32, 0.04, 2
DENSE_REWARD = {"name": "vowel_share", "fn": str(ROOT / "benchmarks" / "workload_rewards.py") + ":vowel_share",
                "weight": 1.0}
LORA = {"r": 16, "alpha": 32, "target_modules": "all-linear"}
POLL_S = 0.25


log = log_to("model-sizes")


# ---------------------------------------------------------------------------------------------- models


def qwen2_05b_tokenizer(out: Path):
    """A byte-level BPE tokenizer of 32,000 learned tokens (models/bpe.py, ChatML template, eos <|endoftext|>) whose
    remaining ids up to the model's 151,936 are filler tokens: a random model samples every id, and each must
    decode. (Learning all 151,936 from the synthetic corpus takes tens of minutes: the corpus generator's weighted
    sampling is linear in the lexicon.)"""
    from transformers import AutoTokenizer

    from posttrain.models.bpe import train_bpe_tokenizer

    vocab, learned = QWEN2_05B["vocab_size"], 32_000
    if not (out / "tokenizer.json").exists():
        log(f"training a {learned:,}-token BPE tokenizer, filling ids up to {vocab:,}")
        tok = train_bpe_tokenizer(out, learned)
        tok.add_tokens([f"<|fill_{i}|>" for i in range(vocab - len(tok))])
        tok.save_pretrained(str(out))
    return AutoTokenizer.from_pretrained(str(out))


def build_qwen2_05b(out: Path) -> Path:
    """The Qwen2-0.5B shape, random init (seed 0), float32 safetensors, with the tokenizer above."""
    if (out / "config.json").exists():
        return out
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, Qwen2Config

    tok = qwen2_05b_tokenizer(CACHE / "models" / "qwen2-0.5b-tokenizer")
    ids = dict(pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id)
    config = Qwen2Config(**QWEN2_05B, **ids, dtype="float32")
    torch.manual_seed(0)
    log("building the Qwen2-0.5B-shaped model (random init)")
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    GenerationConfig(eos_token_id=ids["eos_token_id"], pad_token_id=ids["pad_token_id"]).save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return out


def build_94m(out: Path) -> Path:
    """benchmarks/perf.py's 94M model: the tiny factory's "80m" size (768 hidden, 10 layers), character tokenizer."""
    from posttrain.models.tiny import build_tiny_model

    if not (out / "config.json").exists():
        build_tiny_model(out, "80m", seed=0)
    return out


def model_dir(shape: str) -> Path:
    return (build_qwen2_05b if shape == "qwen2-0.5b" else build_94m)(CACHE / "models" / shape)


# ---------------------------------------------------------------------------------------------- one run


def run_config(shape: str, mode: str, model: Path, steps: int) -> dict:
    cfg = {
        "name": f"{shape}-{mode}", "runs_dir": str(CACHE / "runs"), "seed": 0,
        "model": {"path": str(model), "dtype": "float32"},
        "task": {"name": "addition", "heldout_size": 16},
        "reward": {"functions": [DENSE_REWARD]},
        "algorithm": {"name": "grpo", "prompts_per_step": PROMPTS, "group_size": GROUP, "kl_coef": KL, "lr": 1e-5,
                      "lr_schedule": "constant", "skip_zero_variance_groups": False},
        "rollout": {"engine": "vllm", "max_new_tokens": NEW_TOKENS, "vllm": {"max_model_len": 128, "kv_cache_gb": 1}},
        "train": {"steps": steps},
        "eval": {"every": 0},
        "checkpoint": {"every": 0},
        "topology": {"torch_threads": THREADS},
        "logging": {"progress": False},
    }
    if mode == "lora":
        cfg["model"]["lora"] = dict(LORA)
    return cfg


def proc_status(pid: int) -> dict | None:
    """VmHWM (the kernel's peak resident set), VmRSS and its parts RssAnon (private), RssFile (mapped files) and
    RssShmem (shared memory: Ray's object store pages this process touched), in bytes, and the process title;
    None when it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return None
    kb = {ln.split(":")[0]: int(ln.split()[1]) * 1024 for ln in status if ln.startswith(("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"))}
    return {"title": title, **kb} if "VmHWM" in kb else None


def role_of(title: str) -> str:
    """'ray::Trainer.train_step' -> 'Trainer'; a worker not yet given an actor is 'IDLE'; anything else by name."""
    if title.startswith("ray::"):
        return title[5:].split(".")[0].split(" ")[0]
    return Path(title.split(" ")[0]).name


def mem_available() -> int:
    lines = Path("/proc/meminfo").read_text().splitlines()
    return next(int(ln.split()[1]) * 1024 for ln in lines if ln.startswith("MemAvailable"))


class PeakRss(threading.Thread):
    """Polls the process tree under `root` for each process's VmHWM, and the machine's MemAvailable."""

    def __init__(self, root: int, metrics: Path, steps: int):
        super().__init__(daemon=True)
        self.root, self.metrics, self.steps = root, metrics, steps
        self.hwm: dict[int, int] = {}
        self.anon: dict[int, int] = {}  # polled maximum of RssAnon: private memory, without object-store pages
        self.shmem: dict[int, int] = {}
        self.roles: dict[int, str] = {}
        self.at_last_step: dict[str, int] | None = None
        self.min_available = mem_available()
        self.stop = threading.Event()

    def poll(self) -> None:
        import psutil

        try:
            pids = [self.root] + [c.pid for c in psutil.Process(self.root).children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        for pid in pids:
            s = proc_status(pid)
            if s is None:
                continue
            self.hwm[pid] = max(self.hwm.get(pid, 0), s["VmHWM"])
            self.anon[pid] = max(self.anon.get(pid, 0), s.get("RssAnon", 0))
            self.shmem[pid] = max(self.shmem.get(pid, 0), s.get("RssShmem", 0))
            role = role_of(s["title"])
            if role != "IDLE" or pid not in self.roles:
                self.roles[pid] = role
        self.min_available = min(self.min_available, mem_available())
        if self.at_last_step is None and self.metrics.exists():
            done = sum('"time/step"' in ln for ln in self.metrics.read_text().splitlines())
            if done >= self.steps:
                self.at_last_step = self.by_role()

    def by_role(self, which: str = "hwm") -> dict[str, int]:
        out: dict[str, int] = {}
        for pid, value in getattr(self, which).items():
            role = self.roles.get(pid, "?")
            out[role] = max(out.get(role, 0), value)
        return out

    def run(self) -> None:
        while not self.stop.is_set():
            self.poll()
            time.sleep(POLL_S)


def run_once(shape: str, mode: str, steps: int) -> dict:
    """`posttrain train` on the config above in a subprocess, with its processes' peak RSS."""
    import yaml

    from posttrain.tracking.jsonl import read_metrics

    model = model_dir(shape)
    cfg = run_config(shape, mode, model, steps)
    run_dir = CACHE / "runs" / cfg["name"]
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)
    conf = CACHE / f"{cfg['name']}.yaml"
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text(yaml.safe_dump(cfg, sort_keys=False))
    available_before, load_before = mem_available(), os.getloadavg()[0]
    log(f"{shape} {mode}: posttrain train {conf}")
    t0 = time.perf_counter()
    logf = open(CACHE / f"{cfg['name']}.log", "w")
    proc = subprocess.Popen([str(ROOT / ".venv/bin/posttrain"), "train", str(conf), "--quiet"], stdout=logf,
                            stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    sampler = PeakRss(proc.pid, run_dir / "metrics.jsonl", steps)
    sampler.start()
    rc = proc.wait()
    sampler.stop.set()
    sampler.join()
    logf.close()
    wall = time.perf_counter() - t0
    records = [m for m in read_metrics(run_dir) if "time/step" in m] if (run_dir / "metrics.jsonl").exists() else []
    out = {"config": cfg, "config_file": str(conf), "returncode": rc, "wall_seconds": wall, "steps_done": len(records),
           "peak_rss_bytes_through_steps": sampler.at_last_step, "peak_rss_bytes_at_exit": sampler.by_role(),
           "polled_max_rss_anon_bytes": sampler.by_role("anon"), "polled_max_rss_shmem_bytes": sampler.by_role("shmem"),
           "machine_memory_used_peak_bytes": available_before - sampler.min_available,
           # > 2 on this 2-core machine: something else ran beside the run (the step times are then upper bounds)
           "load_average_1m": {"before": load_before, "after": os.getloadavg()[0]}}
    if rc != 0:
        out["log_tail"] = (CACHE / f"{cfg['name']}.log").read_text()[-3000:]
        log(f"{shape} {mode}: exit {rc}; see {CACHE / (cfg['name'] + '.log')}")
    later = records[1:]  # the first step warms up
    if later:
        keys = sorted({k for m in later for k in m if k.startswith("time/")})
        out["phase_seconds_mean"] = {k[5:]: statistics.mean(m.get(k, 0.0) for m in later) for k in keys}
        out["response_length_mean"] = statistics.mean(m["response_length"] for m in later)
    return out


# ---------------------------------------------------------------------------------------------- prediction


BASELINE_IMPORTS = {  # what each actor's process imports before it loads a model
    "Trainer": "ray, torch, transformers, peft, posttrain.training.trainer",
    "ReferenceModel": "ray, torch, transformers, posttrain.training.reference",
    "RolloutWorker": "ray, torch, transformers, vllm, posttrain.rollout.worker",
}


def import_baseline_rss() -> dict[str, int]:
    """Peak RSS (bytes) of a fresh process per actor kind that imports what the actor imports, no model loaded."""
    out = {}
    for actor, modules in BASELINE_IMPORTS.items():
        code = f"import resource, {modules}; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)"
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
        out[actor] = int(r.stdout.strip().splitlines()[-1])
    return out


def mean_prompt_tokens(conf: str) -> int:
    """Mean prompt length in tokens of the task's prompts as the engine gets them (chat template applied)."""
    from posttrain.config import load_config
    from posttrain.models.loading import PromptEncoder, load_tokenizer
    from posttrain.tasks import load_task

    rc = load_config(conf, [])
    enc = PromptEncoder(load_tokenizer(rc.model.path), rc.model.chat_template)
    task = load_task(rc.task, rc.seed)
    return round(statistics.mean(len(enc.encode(p.prompt)) for p in task.train[:200]))


def predict(conf: str, prompt_tokens: int, completion_tokens: int, peak_flops: float, memory_gb: int) -> dict:
    """The planner on this machine as one CPU slot (its RAM, the matmul FLOP/s measured here) for the run's config
    at the measured prompt and completion lengths: per-role memory and the colocated layout's phase times."""
    from dataclasses import replace

    from posttrain.config import load_config
    from posttrain.topology.from_config import plan_inputs, reference_placement
    from posttrain.topology.plan import colocated

    rc = load_config(conf, [f"topology.cluster=1x1xCPU-{memory_gb}GB", f"rollout.max_new_tokens={completion_tokens}"])
    inp = plan_inputs(rc, prompt_tokens=prompt_tokens)
    inp = replace(inp, cluster=replace(inp.cluster, device=replace(inp.cluster.device, peak_flops=peak_flops)))
    plan = colocated(inp)
    roles = {r: sum(m["resident"].values()) + sum(m["working"].values()) for r, m in plan.memory.items()}
    return {"params": inp.policy.params, "trainable_params": inp.trainable_params,
            "reference": reference_placement(inp), "role_bytes": roles, "memory": plan.memory,
            "phase_seconds": plan.phase_seconds, "step_seconds": plan.step_seconds,
            "inputs": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                       "sequences": inp.workload.sequences, "peak_flops": peak_flops}}


# ---------------------------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=SHAPES)
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--build-only", action="store_true", help="Build the models and the tokenizer, run nothing.")
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args()
    if args.report_only:
        print(markdown(read_json(RESULTS)))
        return
    if args.build_only:
        for shape in args.shapes:
            log(f"{shape}: {model_dir(shape)}")
        return

    from plan_validation import matmul_flops

    results = read_json(RESULTS, {"runs": {}})
    results["machine"] = described = machine()
    results["matmul_flops"] = peak = matmul_flops()
    results["import_baseline_rss_bytes"] = import_baseline_rss()
    results["settings"] = {"steps": args.steps, "prompts_per_step": PROMPTS, "group_size": GROUP,
                           "max_new_tokens": NEW_TOKENS, "kl_coef": KL, "torch_threads": THREADS, "lora": LORA,
                           "engine": "vllm", "dtype": "float32", "poll_seconds": POLL_S}
    for shape in args.shapes:
        for mode in args.modes:
            run = results["runs"][f"{shape}/{mode}"] = run_once(shape, mode, args.steps)
            write_json(RESULTS, results, end="")  # after every run: a later failure keeps this one
            completion = round(run.get("response_length_mean") or NEW_TOKENS)
            run["predicted"] = predict(run["config_file"], mean_prompt_tokens(run["config_file"]), completion, peak,
                                       described["memory_gib"])
            write_json(RESULTS, results, end="")
    print(markdown(results))


ACTOR_OF_ROLE = {"policy": "Trainer", "reference": "ReferenceModel", "rollout": "RolloutWorker"}
PHASES = ("step", "generate", "reward", "reference", "train", "sync", "other")
PLANNER_PHASE = {"generate": "generate", "reward": "reward", "reference": "reference", "train": "train_policy",
                 "sync": "sync"}


def _gb(x: float | None) -> str:
    return "-" if x is None else f"{x / 1e9:.2f}"


def markdown(results: dict) -> str:
    """Two tables: memory per actor (predicted + import baseline vs measured peak RSS) and the step-time split."""
    m = results["machine"]
    base = results["import_baseline_rss_bytes"]
    mem, split = [], []  # rows of the two tables
    for key, run in results["runs"].items():
        shape, mode = key.split("/")
        pred = run["predicted"]
        peaks = run["peak_rss_bytes_through_steps"] or run["peak_rss_bytes_at_exit"]
        first = True
        for role, actor in ACTOR_OF_ROLE.items():
            p, got = pred["role_bytes"].get(role), peaks.get(actor)
            if p is None and got is None:
                continue
            with_base = p + base[actor] if p is not None else None
            err = f"{with_base / got - 1:+.0%}" if with_base and got else "-"
            head = [shape, mode, f"{pred['trainable_params']:,}", pred["reference"]] if first else ["", "", "", ""]
            mem.append([*head, actor, _gb(p), _gb(with_base), _gb(got), err])
            first = False
        if run["returncode"] != 0:
            mem.append(["", "", "", "", f"exit {run['returncode']} after {run['steps_done']} steps", "", "", "", ""])
        ph = run.get("phase_seconds_mean", {})
        split.append([shape, mode, run["steps_done"], *(f"{ph[k]:.1f}" if k in ph else "-" for k in PHASES),
                      f"{pred['step_seconds']:.1f}"])
        split.append(["", "planner", "", "", *(f"{pred['phase_seconds'][PLANNER_PHASE[k]]:.1f}"
                                              if k in PLANNER_PHASE else "" for k in PHASES[1:]), ""])
    machine_line = (f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, torch {m['torch']}; matmul "
                    f"{results['matmul_flops'] / 1e9:.0f} GFLOP/s.")
    return "\n".join([
        machine_line, "",
        md_table(["shape", "mode", "trainable params", "reference", "actor", "predicted GB", "+ import baseline",
                  "measured peak RSS GB", "error"], mem), "",
        md_table(["shape", "mode", "steps", "step s", *PHASES[1:], "planner step s"], split),
    ])


if __name__ == "__main__":
    main()
