"""TRL's GRPOTrainer on the benchmark's model and prompts; run by benchmarks/perf.py with the python of its own venv
(benchmarks/.trl-venv: torch CPU + trl, no posttrain), so nothing here imports posttrain.

    benchmarks/.trl-venv/bin/python benchmarks/perf_trl.py SPEC.json OUT.json

SPEC: {"model": dir, "batches": [[{"prompt", "answer"}, ...] per step], "reward": "file.py:function" (TRL's
reward_funcs form; benchmarks/workload_rewards.py), "group_size", "max_new_tokens", "kl_coef", "lr", "clip_eps",
"torch_threads", "seed", "temperature", "top_p", "max_grad_norm", "work_dir"}, as common.Matched.trl_spec writes
it (GRPOConfig's arguments from it: common.trl_grpo_args), and optionally (benchmarks/time_to_accuracy.py):
  "peft": {"r", "alpha", "dropout", "target_modules"}   LoRA through TRL's own `peft_config` (reference = the base
                                                      with adapters off, as TRL does it)
  "eval": {"problems": [{"prompt", "answer"}], "every": k, "max_new_tokens": m, "target_delta": d}
          greedy held-out accuracy (exact match of the stripped completion) before the first step and after every
          k-th; training stops at the first eval at or above the step-0 accuracy + d. Eval time is outside the
          step times. With "reward": "file.py:function" (benchmarks/real_model_trl.py) the problems' prompts are
          chat messages and the score is that function's mean over the greedy completions (reward_score).
OUT: per-step wall seconds (on_step_begin -> on_step_end, generation included: TRL generates inside the step), the
logged mean completion length of each step, every GRPOConfig field set to something other than TRL's default (so
the results list exactly how TRL was configured), and with "eval" the accuracy curve and each step's split:
generate (`_generate`), reward (`_calculate_rewards`), reference (logprob forwards without grad: TRL's reference,
or the base with adapters off under LoRA), train (the rest of the step: forward, backward, optimizer).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import sys
import time

from common import trl_grpo_args, write_json  # stdlib only: runs in TRL's venv


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


def greedy_texts(model, tokenizer, texts: list[str], max_new_tokens: int, batch_size: int) -> list[str]:
    """The greedy completion of each of `texts` (tokenized without special tokens, left-padded, in batches), cut at
    EOS/pad and decoded."""
    import torch

    was_training = model.training
    model.eval()
    stop = {tokenizer.eos_token_id, tokenizer.pad_token_id}
    completions = []
    with torch.no_grad():
        for i in range(0, len(texts), batch_size):
            enc = tokenizer(texts[i:i + batch_size], add_special_tokens=False, padding=True, padding_side="left",
                            return_tensors="pt")
            out = model.generate(**enc, do_sample=False, max_new_tokens=max_new_tokens,
                                 eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
            for ids in out[:, enc["input_ids"].shape[1]:].tolist():
                cut = next((j for j, t in enumerate(ids) if t in stop), len(ids))
                completions.append(tokenizer.decode(ids[:cut], skip_special_tokens=True))
    model.train(was_training)
    return completions


def greedy_accuracy(model, tokenizer, problems: list[dict], max_new_tokens: int, batch_size: int = 256) -> float:
    """Share of `problems` whose greedy completion, stripped, equals the stripped answer (the addition task's exact
    verifier, as posttrain scores its held-out set). Prompts are tokenized without special tokens, as posttrain's
    PromptEncoder does for a tokenizer without a chat template."""
    texts = greedy_texts(model, tokenizer, [p["prompt"] for p in problems], max_new_tokens, batch_size)
    return sum(t.strip() == p["answer"].strip() for t, p in zip(texts, problems)) / len(problems)


def reward_score(model, tokenizer, problems: list[dict], max_new_tokens: int, reward, batch_size: int = 64) -> float:
    """Mean of `reward` (TRL's reward_funcs form) over the greedy completions of `problems`' chat prompts (lists of
    messages, rendered with the tokenizer's chat template and the generation prompt, as TRL and posttrain render
    them), each given as one assistant message: the real-model example's held-out eval (posttrain's runs the same
    rule as its verifier)."""
    rendered = [tokenizer.apply_chat_template(p["prompt"], add_generation_prompt=True, tokenize=False)
                for p in problems]
    texts = greedy_texts(model, tokenizer, rendered, max_new_tokens, batch_size)
    scores = reward(prompts=[p["prompt"] for p in problems], answer=[p["answer"] for p in problems],
                    completions=[[{"role": "assistant", "content": t}] for t in texts])
    return sum(scores) / len(problems)


def time_phases(trainer) -> dict:
    """Wraps the trainer's generation, reward and grad-free logprob calls with timers; returns the running
    seconds per phase (read and reset by the step callback)."""
    import torch

    phases = {"generate": 0.0, "reward": 0.0, "reference": 0.0}

    def timed(name, fn, only_no_grad=False):
        @functools.wraps(fn)
        def wrapper(*a, **k):
            if only_no_grad and torch.is_grad_enabled():
                return fn(*a, **k)
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                phases[name] += time.perf_counter() - t
        return wrapper

    trainer._generate = timed("generate", trainer._generate)
    trainer._calculate_rewards = timed("reward", trainer._calculate_rewards)
    trainer._get_per_token_logps_and_entropies = timed("reference", trainer._get_per_token_logps_and_entropies,
                                                       only_no_grad=True)
    return phases


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

    given = trl_grpo_args(spec)  # the matched settings in TRL's names (common.Matched built the spec)
    args = GRPOConfig(**given)
    changed = non_default_settings(args, given)
    ev = spec.get("eval")
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])

    class StepTimes(TrainerCallback):
        """Step wall times; with `eval`, the held-out curve (outside the step times) and the early stop."""

        def __init__(self):
            self.seconds, self.lengths, self.splits, self.curve, self._t = [], [], [], [], 0.0
            self.phases, self.eval_seconds, self.target = None, 0.0, None

        def evaluate(self, model, step: int) -> float:
            t = time.perf_counter()
            acc = (reward_score(model, tokenizer, ev["problems"], ev["max_new_tokens"], load_reward(ev["reward"]))
                   if ev.get("reward") else greedy_accuracy(model, tokenizer, ev["problems"], ev["max_new_tokens"]))
            self.eval_seconds += time.perf_counter() - t
            self.curve.append({"step": step, "accuracy": acc, "train_seconds": sum(self.seconds),
                               "eval_seconds": time.perf_counter() - t})
            return acc

        def on_train_begin(self, _args, _state, _control, model=None, **k):
            if ev:
                self.target = self.evaluate(model, 0) + ev["target_delta"]

        def on_step_begin(self, *a, **k):
            if self.phases is not None:
                for name in self.phases:
                    self.phases[name] = 0.0
            self._t = time.perf_counter()

        def on_step_end(self, _args, state, control, model=None, **k):
            self.seconds.append(time.perf_counter() - self._t)
            if self.phases is not None:
                split = dict(self.phases)
                split["train"] = self.seconds[-1] - sum(split.values())
                self.splits.append(split)
            if ev and state.global_step % ev["every"] == 0:
                if self.evaluate(model, state.global_step) >= self.target - 1e-9:
                    control.should_training_stop = True

        def on_log(self, _args, _state, _control, logs=None, **k):
            if logs and "completions/mean_length" in logs:
                self.lengths.append(float(logs["completions/mean_length"]))

    timer = StepTimes()
    peft_config = None
    if spec.get("peft"):
        from peft import LoraConfig

        p = spec["peft"]
        peft_config = LoraConfig(r=p["r"], lora_alpha=p["alpha"], lora_dropout=p["dropout"],
                                 target_modules=p["target_modules"], task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=spec["model"], reward_funcs=reward, args=args, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[timer], peft_config=peft_config)
    timer.phases = time_phases(trainer)  # the step's split (generate, reward, reference, train), with or without eval
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    if ev and (not timer.curve or timer.curve[-1]["step"] != len(timer.seconds)):
        timer.evaluate(trainer.model, len(timer.seconds))  # the last step, when it was not an eval step
    import trl
    import transformers

    out = {"step_seconds": timer.seconds, "completion_mean_length": timer.lengths,
           "wall_seconds": wall, "reference_model": trainer.ref_model is not None,
           "non_default_settings": changed,
           "eval": {"curve": timer.curve, "target": timer.target, "eval_seconds": timer.eval_seconds,
                    "wall_excluding_eval_seconds": wall - timer.eval_seconds} if ev else None,
           "step_split_seconds": timer.splits or None,
           "peft": repr(peft_config) if peft_config is not None else None,
           "trainable_params": sum(x.numel() for x in trainer.model.parameters() if x.requires_grad),
           "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__,
                        "torch_cuda": torch.version.cuda, **peft_version()}}
    write_json(out_path, out, end="")
    return 0


def peft_version() -> dict:
    try:
        import peft
    except ImportError:  # perf.py's venv has no peft: only time_to_accuracy.py installs it
        return {}
    return {"peft": peft.__version__}


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:3]))
