"""TRL's GRPOTrainer on the benchmark's model and prompts; run by benchmarks/perf.py with the python of its own venv
(benchmarks/.trl-venv: torch CPU + trl, no posttrain), so nothing here imports posttrain.

    benchmarks/.trl-venv/bin/python benchmarks/perf_trl.py SPEC.json OUT.json

SPEC: {"model": dir, "batches": [[{"prompt", "answer"}, ...] per step], "reward": "file.py:function" (TRL's
reward_funcs form; benchmarks/workload_rewards.py), "group_size", "max_new_tokens", "kl_coef", "lr", "clip_eps",
"torch_threads", "seed", "work_dir"}. OUT: per-step wall seconds (on_step_begin -> on_step_end, generation included:
TRL generates inside the step), the logged mean completion length of each step, and every GRPOConfig field set to
something other than TRL's default (so the results list exactly how TRL was configured).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
import time


def load_reward(ref: str):
    """`path/to/file.py:function` -> the function (the same file posttrain's reward.functions loads)."""
    path, name = ref.rsplit(":", 1)
    spec = importlib.util.spec_from_file_location("workload_rewards", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def non_default_settings(args, given: dict) -> dict:
    """Each GRPOConfig field the benchmark sets (`given`) whose value differs from the field's declared default
    (paths excluded), as 'value (default X)'. A default GRPOConfig cannot be built on a CPU (bf16 needs a GPU), so
    the declared defaults are read from the dataclass."""
    defaults = {f.name: f.default if f.default is not dataclasses.MISSING else
                (f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
                for f in dataclasses.fields(args)}
    return {k: f"{v!r} (default {defaults.get(k)!r})" for k, v in sorted(given.items())
            if k != "output_dir" and v != defaults.get(k)}


def main(spec_path: str, out_path: str) -> int:
    spec = json.loads(open(spec_path).read())
    import torch

    torch.set_num_threads(spec["torch_threads"])
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    rows = [row for batch in spec["batches"] for row in batch]
    dataset = Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in rows])
    reward = load_reward(spec["reward"])

    n, per_step = spec["group_size"], len(spec["batches"][0])
    given = dict(
        output_dir=spec["work_dir"], per_device_train_batch_size=per_step * n, gradient_accumulation_steps=1,
        num_generations=n, max_completion_length=spec["max_new_tokens"], beta=spec["kl_coef"],
        learning_rate=spec["lr"], lr_scheduler_type="constant", warmup_steps=0, loss_type="dapo",
        scale_rewards="group", epsilon=spec["clip_eps"], num_iterations=1, max_grad_norm=1.0, temperature=1.0,
        top_p=1.0, top_k=0, max_steps=len(spec["batches"]), shuffle_dataset=False, seed=spec["seed"], use_cpu=True,
        bf16=False, fp16=False, report_to="none", logging_steps=1, save_strategy="no", dataloader_num_workers=0,
        disable_dropout=True, log_completions=False, model_init_kwargs={"dtype": "float32"},
        gradient_checkpointing=False,  # TRL's default recomputes activations in backward; posttrain does not
    )
    args = GRPOConfig(**given)
    changed = non_default_settings(args, given)

    class StepTimes(TrainerCallback):
        def __init__(self):
            self.seconds, self.lengths, self._t = [], [], 0.0

        def on_step_begin(self, *a, **k):
            self._t = time.perf_counter()

        def on_step_end(self, *a, **k):
            self.seconds.append(time.perf_counter() - self._t)

        def on_log(self, _args, _state, _control, logs=None, **k):
            if logs and "completions/mean_length" in logs:
                self.lengths.append(float(logs["completions/mean_length"]))

    timer = StepTimes()
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    trainer = GRPOTrainer(model=spec["model"], reward_funcs=reward, args=args, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[timer])
    t0 = time.perf_counter()
    trainer.train()
    import trl
    import transformers

    out = {"step_seconds": timer.seconds, "completion_mean_length": timer.lengths,
           "wall_seconds": time.perf_counter() - t0, "reference_model": trainer.ref_model is not None,
           "non_default_settings": changed,
           "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__,
                        "torch_cuda": torch.version.cuda}}
    open(out_path, "w").write(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:3]))
