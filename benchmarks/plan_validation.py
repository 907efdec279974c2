"""Predicted vs measured memory and step time for the built-in tiny configs on this CPU machine.

    flock /tmp/posttrain-heavy.lock python benchmarks/plan_validation.py --sizes 1m 4m --steps 6

For each tiny size: the planner's per-role prediction (topology/plan.py on a one-CPU-slot 'cluster' whose peak
FLOP/s is measured here with a matmul) against
  - memory, measured in a fresh process per role: the exact bytes of parameters, gradients and AdamW states; the
    bytes of the tensors autograd saves for backward (a saved_tensors hook, deduplicated by storage); and the
    growth of the process's peak RSS over the step (what the OS saw, allocator and temporaries included);
  - step time, measured by a short real run (`posttrain.loop.train`, vLLM engine) from metrics.jsonl time/* keys.
Writes benchmarks/results/plan_validation.json and prints a markdown table."""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import md_table, write_json

ROOT = Path(__file__).resolve().parents[1]


def matmul_flops() -> float:
    """Sustained fp32 FLOP/s of a 1024^3 matmul on the torch threads the trainer uses (2)."""
    import torch

    torch.set_num_threads(2)
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    for _ in range(3):
        a @ b
    t = time.perf_counter()
    n = 20
    for _ in range(n):
        a @ b
    return n * 2 * 1024**3 / (time.perf_counter() - t)


def batch_for(cfg, model_dir: str, completion_tokens: int):
    """A step's batch as the trainer sees it: real task prompts, completions of completion_tokens tokens."""
    from posttrain.models.loading import PromptEncoder, load_tokenizer
    from posttrain.tasks import load_task

    task = load_task(cfg.task, cfg.seed)
    enc = PromptEncoder(load_tokenizer(model_dir), cfg.model.chat_template)
    n = cfg.algorithm.prompts_per_step * cfg.algorithm.group_size
    prompts = [enc.encode(p.prompt) for p in task.train[:n]]
    completions = [[5] * completion_tokens for _ in prompts]
    return prompts, completions


def measure_role(role: str, model_dir: str, completion_tokens: int) -> dict:
    """Runs in a fresh process: one trainer step or one reference forward, with its memory measured."""
    import torch

    from posttrain.config import load_config
    from posttrain.models.loading import load_causal_lm
    from posttrain.training.batch import completion_logprobs, pack

    torch.set_num_threads(2)
    cfg = load_config(None, [f"model.path={model_dir}"])
    prompts, completions = batch_for(cfg, model_dir, completion_tokens)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    model, tok = load_causal_lm(model_dir, "float32")
    packed = pack(prompts, completions, tok.pad_token_id)
    saved: dict[int, int] = {}

    def keep(t):
        if t.device.type == "cpu":
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    out = {"role": role, "batch": list(packed.input_ids.shape)}
    t = time.perf_counter()
    if role == "trainer":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        with torch.autograd.graph.saved_tensors_hooks(keep, lambda x: x):
            lp = completion_logprobs(model, packed)
        loss = -(lp.sum() / packed.completion_mask.sum())
        loss.backward()
        opt.step()
        states = sum(v.nbytes for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.dim())
        out["grads_bytes"] = sum(p.grad.nbytes for p in model.parameters())
        out["optimizer_bytes"] = states
    else:
        with torch.no_grad():
            completion_logprobs(model, packed)
    out["seconds"] = time.perf_counter() - t
    out["params"] = sum(p.numel() for p in model.parameters())
    out["weights_bytes"] = sum(p.nbytes for p in model.parameters())
    out["saved_activation_bytes"] = sum(saved.values())
    out["peak_rss_growth_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss0
    return out


def short_run(model_dir: str, steps: int, runs_dir: str) -> list[dict]:
    from posttrain.config import load_config
    from posttrain.loop import train
    from posttrain.tracking import read_metrics

    cfg = load_config(None, [f"model.path={model_dir}", f"train.steps={steps}", "eval.every=0", "checkpoint.every=0",
                             "task.heldout_size=16", "algorithm.skip_zero_variance_groups=false",
                             f"runs_dir={runs_dir}", "name=plan-validation", "logging.progress=false"])
    train(cfg, progress=False)
    return [m for m in read_metrics(cfg.run_dir) if "time/step" in m]


def predict(model_dir: str, prompt_tokens: int, completion_tokens: int, peak: float) -> dict:
    from dataclasses import replace

    from posttrain.config import load_config
    from posttrain.topology.devices import parse_cluster
    from posttrain.topology.from_config import plan_inputs
    from posttrain.topology.plan import colocated

    cfg = load_config(None, [f"model.path={model_dir}", "topology.cluster=1x1xCPU", f"rollout.max_new_tokens={completion_tokens}",
                             "rollout.vllm.max_model_len=128"])
    inp = plan_inputs(cfg, prompt_tokens=prompt_tokens)
    cluster = parse_cluster("1x1xCPU")
    inp = replace(inp, cluster=replace(cluster, device=replace(cluster.device, peak_flops=peak)))
    return colocated(inp).to_dict() | {"inputs": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                                                  "sequences": inp.workload.sequences, "peak_flops": peak}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", nargs="+", default=["1m", "4m"])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/plan_validation.json"))
    ap.add_argument("--measure", nargs=3, metavar=("ROLE", "MODEL_DIR", "COMPLETION_TOKENS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure_role(args.measure[0], args.measure[1], int(args.measure[2]))))
        return

    from posttrain.config import load_config
    from posttrain.models.tiny import build_tiny_model

    peak = matmul_flops()
    work = Path(tempfile.mkdtemp(prefix="plan-val-"))
    results = {"machine_matmul_flops": peak, "sizes": {}}
    for size in args.sizes:
        model_dir = str(build_tiny_model(work / size, size, seed=0))
        cfg = load_config(None, [f"model.path={model_dir}"])
        prompts, _ = batch_for(cfg, model_dir, 1)
        prompt_tokens = round(statistics.mean(len(p) for p in prompts))
        completion = cfg.rollout.max_new_tokens
        measured = {}
        for role in ("trainer", "reference"):
            r = subprocess.run([sys.executable, __file__, "--measure", role, model_dir, str(completion)],
                               capture_output=True, text=True, check=True)
            measured[role] = json.loads(r.stdout.strip().splitlines()[-1])
        records = short_run(model_dir, args.steps, str(work / f"runs-{size}"))[1:]  # the first step warms up
        phase = {k: statistics.mean(m[f"time/{k}"] for m in records)
                 for k in ("generate", "reward", "reference", "train", "sync", "other", "step")}
        resp = statistics.mean(m["response_length"] for m in records)
        pred = predict(model_dir, prompt_tokens, completion, peak)
        pred_resp = predict(model_dir, prompt_tokens, max(1, round(resp)), peak)
        results["sizes"][size] = {"measured_memory": measured, "measured_phase_seconds": phase,
                                  "measured_response_length": resp, "predicted": pred,
                                  "predicted_at_measured_length": pred_resp}
    write_json(args.out, results, end="")
    print(markdown(results))


def markdown(results: dict) -> str:
    rows = []

    def row(size, what, p, m, unit="MB"):
        scale = 1e6 if unit == "MB" else 1.0
        fmt = "{:.1f}" if unit == "MB" else "{:.3f}"
        ratio = f"{p / m:.2f}" if m else "-"
        rows.append([size, what, f"{fmt.format(p / scale)} {unit}", f"{fmt.format(m / scale)} {unit}", ratio])

    for size, r in results["sizes"].items():
        mem, tr, ref = r["predicted"]["memory"], r["measured_memory"]["trainer"], r["measured_memory"]["reference"]
        measured_states = tr["weights_bytes"] + tr["grads_bytes"] + tr["optimizer_bytes"]
        pred_states = mem["policy"]["resident"]["train_states"]
        pred_act = mem["policy"]["working"]["activations"]
        row(size, "trainer: weights+grads+AdamW", pred_states, measured_states)
        row(size, "trainer: activations saved for backward", pred_act, tr["saved_activation_bytes"])
        row(size, "trainer: total vs peak RSS growth", pred_states + pred_act, tr["peak_rss_growth_bytes"])
        pred_ref = mem["reference"]["resident"]["weights"] + mem["reference"]["working"]["activations"]
        row(size, "reference: weights + forward vs peak RSS growth", pred_ref, ref["peak_rss_growth_bytes"])
        ps, ms = r["predicted_at_measured_length"]["phase_seconds"], r["measured_phase_seconds"]
        for p_key, m_key in (("generate", "generate"), ("reference", "reference"), ("train_policy", "train"),
                             ("sync", "sync")):
            row(size, f"time: {m_key}", ps[p_key], ms[m_key], unit="s")
        row(size, "time: step", r["predicted_at_measured_length"]["step_seconds"], ms["step"], unit="s")
    return md_table(["model", "quantity", "predicted", "measured", "predicted / measured"], rows)


if __name__ == "__main__":
    main()
