"""The built-in demo: a tiny model built from a config, an SFT warm start on the addition task, then GRPO on Ray
with vLLM rollout, all on the built-in default config. Writes runs/demo/summary.json."""

from __future__ import annotations

import json
import time

from posttrain.config import RunConfig
from posttrain.loop import train
from posttrain.run_files import remove_run
from posttrain.machine import describe_machine
from posttrain.models.tiny import build_tiny_model


def run_sft_with_progress(cfg: RunConfig, base: str, out: str, progress: bool):
    """SFT with a progress bar that advances at each held-out evaluation."""
    from posttrain.progress import StepProgress
    from posttrain.training.sft import run_sft

    bar = StepProgress("sft", cfg.sft.max_steps, enabled=progress, fields=("heldout",))
    try:
        return run_sft(cfg, base, out, on_eval=lambda step, acc: bar.update(step, heldout=acc))
    finally:
        bar.close()


def run_demo(cfg: RunConfig, *, progress: bool = True, log=print) -> dict:
    t0 = time.perf_counter()
    run_dir = cfg.run_dir
    remove_run(run_dir)  # the demo always starts from scratch
    base = build_tiny_model(run_dir / "base-model", "1m", seed=cfg.seed)
    log(f"built tiny model {base}")
    sft = run_sft_with_progress(cfg, str(base), cfg.sft.out, progress)
    if not sft.reached_target:
        log(f"warning: SFT stopped at sft.max_steps={cfg.sft.max_steps} below sft.target_accuracy="
            f"{cfg.sft.target_accuracy}; RL starts from a weaker policy (try another seed or raise sft.max_steps)")
    log(f"SFT: {sft.steps} steps, {sft.wall_seconds:.0f} s, held-out accuracy {sft.heldout_accuracy:.3f} -> {sft.out_dir}")
    cfg = cfg.model_copy(deep=True)
    cfg.model.path = str(sft.out_dir)
    summary = train(cfg, progress=progress)
    summary.update(
        {
            "wall_seconds": time.perf_counter() - t0,
            "sft_steps": sft.steps,
            "sft_seconds": sft.wall_seconds,
            "sft_heldout_accuracy": sft.heldout_accuracy,
            "machine": describe_machine(),  # the numbers differ from one CPU's kernels to another's (README)
        }
    )
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary
