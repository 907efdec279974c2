"""TRL's GRPOTrainer on the benchmark's model and prompts; run by benchmarks/perf.py with the python of its own venv
(benchmarks/.trl-venv: torch CPU + trl, no posttrain), so nothing here imports posttrain.

    benchmarks/.trl-venv/bin/python benchmarks/perf_trl.py SPEC.json OUT.json

SPEC: {"model": dir, "batches": [[{"prompt", "answer"}, ...] per step], "group_size", "max_new_tokens", "kl_coef",
"lr", "clip_eps", "torch_threads", "seed", "work_dir"}. OUT: per-step wall seconds (on_step_begin -> on_step_end,
generation included: TRL generates inside the step) and the logged mean completion length of each step.
"""

from __future__ import annotations

import json
import sys
import time


def main(spec_path: str, out_path: str) -> int:
    spec = json.loads(open(spec_path).read())
    import torch

    torch.set_num_threads(spec["torch_threads"])
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    rows = [row for batch in spec["batches"] for row in batch]
    answers = {r["prompt"]: r["answer"] for r in rows}
    dataset = Dataset.from_list([{"prompt": r["prompt"]} for r in rows])

    def exact_answer(prompts, completions, **_):
        """The built-in addition task's exact reward: 1 when the completion (to EOS) is the answer."""
        return [1.0 if c.strip() == answers[p] else 0.0 for p, c in zip(prompts, completions)]

    n, per_step = spec["group_size"], len(spec["batches"][0])
    args = GRPOConfig(
        output_dir=spec["work_dir"], per_device_train_batch_size=per_step * n, gradient_accumulation_steps=1,
        num_generations=n, max_completion_length=spec["max_new_tokens"], beta=spec["kl_coef"],
        learning_rate=spec["lr"], lr_scheduler_type="constant", warmup_steps=0, loss_type="dapo",
        scale_rewards="group", epsilon=spec["clip_eps"], num_iterations=1, max_grad_norm=1.0, temperature=1.0,
        top_p=1.0, top_k=0, max_steps=len(spec["batches"]), shuffle_dataset=False, seed=spec["seed"], use_cpu=True,
        bf16=False, fp16=False, report_to="none", logging_steps=1, save_strategy="no", dataloader_num_workers=0,
        disable_dropout=True, log_completions=False, model_init_kwargs={"dtype": "float32"},
    )

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
    trainer = GRPOTrainer(model=spec["model"], reward_funcs=exact_answer, args=args, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[timer])
    t0 = time.perf_counter()
    trainer.train()
    import trl
    import transformers

    out = {"step_seconds": timer.seconds, "completion_mean_length": timer.lengths,
           "wall_seconds": time.perf_counter() - t0, "reference_model": trainer.ref_model is not None,
           "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__,
                        "torch_cuda": torch.version.cuda}}
    open(out_path, "w").write(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:3]))
