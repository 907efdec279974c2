"""On-policy distillation against SFT on the teacher's own samples, for the same wall time, on the real-model task
(examples/real-model: single-digit additions asked in four phrasings; the held-out pairs are never added in
training). The teacher is SmolLM2-135M-Instruct after the real-model example's GRPO run; the student is a smaller
model of the same family and tokenizer: SmolLM2-135M-Instruct with a block of its middle layers removed
(`--keep-layers`), which loses the arithmetic but keeps the language.

Per seed:
1. the teacher samples `--samples` completions of every training prompt (temperature 1; its time is reported and
   charged to neither side);
2. both sides start from the same student: the truncated model after `--warm-steps` SFT steps on those samples
   (a student has to produce answers at all before a teacher can grade its tokens);
3. OPD: `posttrain train` with `algorithm.name: opd` and `distill.teacher` (vLLM rollout, the teacher as a Ray
   actor), `--opd-steps` steps, a checkpoint every `--every` steps. Its budget is the sum of its steps' seconds
   (`time/step`: generation, teacher scoring, training, weight sync; not Ray's start nor the evaluations);
4. SFT on the teacher's samples from the same start, in-process, until its training loop has used the same budget;
   the model is evaluated at the same elapsed seconds as OPD's checkpoints (evaluation time not counted).
Every model is scored by one evaluator: greedy completions (24 tokens) of the held-out rows, `accuracy` = the last
number is the sum, `teacher_match` = the completion equals the teacher's own greedy completion.

    python benchmarks/opd_vs_sft.py [--teacher DIR] [--seeds 0 1 2] [--opd-steps 40]
    python benchmarks/opd_vs_sft.py --table        # the markdown table of the saved results

Needs `bash examples/real-model/run.sh` first (the imported model, the data and the trained teacher). Writes
benchmarks/results/opd_vs_sft.json.
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

from common import log_to, machine, md_table, read_json, write_json

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "real-model" / "config.yaml"
WORK = ROOT / "runs" / "bench-opd"
RESULTS = Path(__file__).resolve().parent / "results" / "opd_vs_sft.json"
EVAL_TOKENS = 24
log = log_to("opd")


def parse_layers(spec: str) -> list[int]:
    """'0-15,24-29' -> [0, ..., 15, 24, ..., 29]."""
    out: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def default_teacher() -> Path:
    """The newest checkpoint of the real-model example's run."""
    steps = sorted((ROOT / "runs" / "real-model" / "checkpoints").glob("step_*"))
    if not steps:
        sys.exit("no teacher: run `bash examples/real-model/run.sh` first, or pass --teacher DIR")
    return steps[-1] / "model"


# ---------------------------------------------------------------------------------------------- models and data


def truncated_student(base_dir: Path, keep: list[int]):
    """The base model with only the decoder layers in `keep` (in order), and its tokenizer."""
    import torch

    from posttrain.models.loading import load_causal_lm

    model, tok = load_causal_lm(base_dir)
    model.model.layers = torch.nn.ModuleList([model.model.layers[i] for i in keep])
    for j, layer in enumerate(model.model.layers):
        layer.self_attn.layer_idx = j
    model.config.num_hidden_layers = len(keep)
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = [model.config.layer_types[i] for i in keep]
    return model, tok


def sample_completions(model, tok, prompts: list[list[int]], k: int, seed: int, batch: int = 64) -> list[list[int]]:
    """`k` completions (ids, EOS kept) of each prompt, sampled at temperature 1 with HF generate, prompt-major."""
    import torch

    torch.manual_seed(seed)
    pad, eos, out = tok.pad_token_id, tok.eos_token_id, []
    flat = [p for p in prompts for _ in range(k)]
    for s in range(0, len(flat), batch):
        chunk = flat[s:s + batch]
        width = max(map(len, chunk))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        gen = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_p=1.0,
                             top_k=0, max_new_tokens=EVAL_TOKENS, pad_token_id=pad)
        for row in gen[:, width:].tolist():
            out.append(row[: row.index(eos) + 1] if eos in row else row)
    return out


def evaluate(model, encoder, task, teacher_texts: list[str]) -> dict:
    """Held-out greedy accuracy and the share of completions equal to the teacher's greedy completion."""
    from posttrain.training.heldout import greedy_accuracy

    accuracy, texts = greedy_accuracy(model, encoder, task, task.heldout, max_new_tokens=EVAL_TOKENS)
    match = sum(a.strip() == b.strip() for a, b in zip(texts, teacher_texts)) / len(texts)
    return {"accuracy": accuracy, "teacher_match": match, "example": texts[0]}


# ---------------------------------------------------------------------------------------------- the two sides


def run_opd(student_dir: Path, teacher: Path, seed: int, args) -> tuple[list[dict], list[Path]]:
    """`posttrain train` with algorithm opd; the steps' metrics and the checkpoints' model dirs, in step order."""
    cfg = yaml.safe_load(CONFIG.read_text())
    name = f"bench-opd-s{seed}"
    cfg.update(name=name, seed=seed)
    cfg["model"] = {"path": str(student_dir)}
    cfg["algorithm"] = {"name": "opd", "group_size": args.group_size, "prompts_per_step": args.prompts_per_step,
                        "lr": args.opd_lr}
    cfg["distill"] = {"teacher": str(teacher), "coef": 1.0}
    cfg["train"] = {"steps": args.opd_steps}
    cfg["eval"] = {"every": 0, "max_new_tokens": EVAL_TOKENS}
    cfg["checkpoint"] = {"every": args.every, "keep_last": 1000}
    cfg["logging"] = {"progress": False}
    path = WORK / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    run_dir = ROOT / "runs" / name
    shutil.rmtree(run_dir, ignore_errors=True)
    proc = subprocess.run([sys.executable, "-m", "posttrain.cli", "train", str(path)], cwd=ROOT,
                          capture_output=True, text=True)
    (WORK / f"{name}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        sys.exit(f"OPD run failed (exit {proc.returncode}), see {WORK / f'{name}.log'}")
    from posttrain.tracking import read_metrics

    steps = [r for r in read_metrics(run_dir) if "time/step" in r]
    checkpoints = sorted((run_dir / "checkpoints").glob("step_*"))
    return steps, [c / "model" for c in checkpoints]


def run_sft(model, tok, examples, marks: list[float], evaluate_at, args, seed: int) -> list[dict]:
    """SFT on `examples` until the training loop has used marks[-1] seconds; evaluate_at(model) at each mark."""
    from posttrain.config.sections import SFTConfig
    from posttrain.training.sft import sft_steps

    sft = SFTConfig(batch_size=args.sft_batch, lr=args.sft_lr, warmup_steps=10, max_steps=10 ** 6)
    points, spent, todo = [], 0.0, list(marks)
    started = time.perf_counter()
    for step, loss in sft_steps(model, examples, tok.pad_token_id, sft, seed):
        spent += time.perf_counter() - started
        while todo and spent >= todo[0]:
            points.append({"seconds": round(spent, 1), "step": step, "loss": round(loss, 4), **evaluate_at(model)})
            log(f"SFT s{seed} {points[-1]}")
            todo.pop(0)
            model.train()
        if not todo:
            break
        started = time.perf_counter()
    return points


def one_seed(seed: int, teacher_dir: Path, args) -> dict:
    import torch

    from posttrain.config import load_config
    from posttrain.models.loading import PromptEncoder, load_causal_lm
    from posttrain.tasks import load_task
    from posttrain.training.heldout import greedy_accuracy
    from posttrain.training.recipe import save_model_dir
    from posttrain.training.sft import sft_steps
    from posttrain.config.sections import SFTConfig

    torch.set_num_threads(2)
    cfg = load_config(CONFIG)
    task = load_task(cfg.task, seed)
    teacher, tok = load_causal_lm(teacher_dir)
    encoder = PromptEncoder(tok, mode=cfg.model.chat_template)
    teacher_eval = greedy_accuracy(teacher, encoder, task, task.heldout, max_new_tokens=EVAL_TOKENS)
    teacher_texts = teacher_eval[1]
    prompts = [encoder.encode(p.prompt) for p in task.train]
    t0 = time.perf_counter()
    samples = sample_completions(teacher, tok, prompts, args.samples, seed)
    sample_seconds = time.perf_counter() - t0
    del teacher
    examples = [(p + c, [0] * len(p) + [1] * len(c))
                for p, c in zip([p for p in prompts for _ in range(args.samples)], samples)]
    log(f"s{seed}: teacher accuracy {teacher_eval[0]:.3f}; {len(samples)} samples in {sample_seconds:.0f} s")

    def evaluate_at(model):
        return evaluate(model, encoder, task, teacher_texts)

    student, _ = truncated_student(ROOT / args.base, parse_layers(args.keep_layers))
    n_params = sum(p.numel() for p in student.parameters())
    warm = SFTConfig(batch_size=args.sft_batch, lr=args.sft_lr, warmup_steps=10, max_steps=args.warm_steps)
    for _ in sft_steps(student, examples, tok.pad_token_id, warm, seed):
        pass
    start = evaluate_at(student)
    log(f"s{seed}: student {n_params / 1e6:.1f} M params, after {args.warm_steps} warm-up SFT steps {start}")
    student_dir = WORK / f"student-s{seed}"
    save_model_dir(student, tok, student_dir)

    steps, checkpoints = run_opd(student_dir, teacher_dir, seed, args)
    elapsed = list(itertools.accumulate(r["time/step"] for r in steps))  # seconds after each step
    opd = []
    for ckpt in checkpoints:
        k = int(ckpt.parent.name.split("_")[1])
        model, _ = load_causal_lm(ckpt)
        opd.append({"seconds": round(elapsed[k - 1], 1), "step": k,
                    "reverse_kl": round(steps[k - 1]["distill/reverse_kl"], 4), **evaluate_at(model)})
        log(f"OPD s{seed} {opd[-1]}")
    sft = run_sft(student, tok, examples, [p["seconds"] for p in opd], evaluate_at, args, seed)
    return {"seed": seed, "teacher": {"accuracy": teacher_eval[0], "sample_seconds": round(sample_seconds, 1)},
            "student_params": n_params, "start": start, "opd": opd, "sft": sft,
            "opd_mean_step_s": round(elapsed[-1] / len(steps), 2)}


# ---------------------------------------------------------------------------------------------- report


def table(results: dict) -> str:
    """Per seed: the common start, OPD's budget, and each side's held-out accuracy / teacher match at its end;
    then the mean over seeds."""
    rows, ends = [], []
    for r in results["runs"]:
        o, s = r["opd"][-1], r["sft"][-1]
        ends.append((r["start"]["accuracy"], o["accuracy"], s["accuracy"]))
        rows.append([r["seed"], f"{r['start']['accuracy']:.1%} / {r['start']['teacher_match']:.1%}",
                     f"{o['seconds']:.0f} s: {o['step']} OPD steps, {s['step']} SFT steps",
                     f"{o['accuracy']:.1%} / {o['teacher_match']:.1%}", f"{s['accuracy']:.1%} / {s['teacher_match']:.1%}"])
    mean = [sum(e[i] for e in ends) / len(ends) for i in range(3)]
    rows.append(["mean", f"{mean[0]:.1%}", "", f"{mean[1]:.1%}", f"{mean[2]:.1%}"])
    header = ["seed", "start: accuracy / teacher match", "same seconds", "OPD", "SFT on the teacher's samples"]
    return md_table(header, rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--teacher", type=Path, default=None)
    ap.add_argument("--base", default="runs/smollm2")
    ap.add_argument("--keep-layers", default="0-19,26-29")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--samples", type=int, default=2, help="teacher completions per training prompt")
    ap.add_argument("--warm-steps", type=int, default=25)
    ap.add_argument("--opd-steps", type=int, default=40)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--prompts-per-step", type=int, default=8)
    ap.add_argument("--opd-lr", type=float, default=1e-5)
    ap.add_argument("--sft-lr", type=float, default=1e-4)
    ap.add_argument("--sft-batch", type=int, default=32)
    ap.add_argument("--table", action="store_true")
    args = ap.parse_args()
    if args.table:
        print(table(read_json(RESULTS)))
        return
    teacher = args.teacher or default_teacher()
    WORK.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if k not in ("table", "teacher")}
    results = {"machine": machine("transformers", "vllm"), "teacher": str(teacher), "settings": settings, "runs": []}
    for seed in args.seeds:
        results["runs"].append(one_seed(seed, teacher, args))
        write_json(RESULTS, results)
    print(table(results))


if __name__ == "__main__":
    main()
