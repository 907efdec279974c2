"""The path a user takes with their own model, data and definition of quality, end to end on the real pieces: a BPE
tokenizer with a ChatML template trained locally (`tokenizers`), a Llama-architecture model on it, a chat-format
dataset file with an extra column, SFT, then GRPO with the vLLM engine and two reward functions from a module in a
temporary directory (a batch function in TRL's form and a per-sample one taking the dataset's column).

The learning signal is of the kind the algorithm tests use, because it holds on any CPU: the weighted function
rewards detail (words up to a cap), which every sample of every group grades, so a policy that follows its gradient
raises it by many standard errors within 20 steps whatever the kernels' rounding (see tests/test_algorithm_runs.py
for why exact-match learning in a few steps does not). It can reach the cap within 3-4 steps, so the test compares
the 32 samples of the first step with the 32 of the last (a two-sample z) rather than 5-step windows. The other function (does the completion name the row's unit?)
is logged with weight 0: its series must be there, computed from the dataset's column, without steering the run."""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

UNITS = ["apples", "pears", "books", "coins", "cards", "boats"]
NAMES = ["Tom", "Ana", "Lee", "Sam", "Kim", "Max"]
STEPS, Z_MIN, MAX_NEW = 20, 4.0, 64

REWARDS = '''
def detail(prompts, completions, **kwargs):
    """TRL-form batch function for conversational data: more words score higher, up to 40 words."""
    return [min(len(c[0]["content"].split()), 40) / 40 for c in completions]


def names_unit(prompt, completion, unit):
    """Per-sample, with the dataset's own column: 1 when the completion (a chat prompt's: a list of messages, as
    TRL passes it) names the row's unit."""
    return 1.0 if unit in completion[0]["content"] else 0.0
'''


def two_sample_z(first: list[float], last: list[float]) -> tuple[float, float]:
    """(mean(last) - mean(first), that difference over its standard error from both samples' variances)."""
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    var = lambda xs: sum((x - mean(xs)) ** 2 for x in xs) / (len(xs) - 1)  # noqa: E731
    gain = mean(last) - mean(first)
    se = math.sqrt(var(first) / len(first) + var(last) / len(last))
    return gain, gain / se if se > 0 else (math.inf if gain > 0 else 0.0)


def test_two_sample_z_by_hand():
    # first [0, 1, 2]: mean 1, var 1; last [2, 4, 6]: mean 4, var 4; se = sqrt(1/3 + 4/3) = 1.291; z = 3 / 1.291
    gain, z = two_sample_z([0, 1, 2], [2, 4, 6])
    assert gain == 3 and z == pytest.approx(2.3238, abs=1e-4)


def word_problem(rng: random.Random) -> dict:
    """One chat-format row: the question, a worked answer of 30+ tokens, and the unit as an extra column."""
    a, b, who, unit = rng.randint(10, 60), rng.randint(10, 39), rng.choice(NAMES), rng.choice(UNITS)
    question = f"{who} has {a} {unit} and gets {b} more. How many {unit} does {who} have now?"
    answer = f"{who} starts with {a} {unit}. Then {who} gets {b} more. {a} plus {b} is {a + b}. So {who} has {a + b} {unit}."
    return {"prompt": [{"role": "user", "content": question}], "answer": answer, "unit": unit}


@pytest.fixture(scope="module")
def user_files(tmp_path_factory):
    """A user's directory: model (BPE + ChatML, Llama), chat dataset with a column, reward module."""
    from posttrain.models.bpe import train_bpe_tokenizer
    from posttrain.models.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("user-task")
    rng = random.Random(0)
    rows = [word_problem(rng) for _ in range(400)]
    (root / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    texts = [r["prompt"][0]["content"] + " " + r["answer"] for r in rows]
    tok = train_bpe_tokenizer(root / "tokenizer", 600, extra_texts=texts * 5, lexicon_size=200, sentences=1000)
    model = build_tiny_model(root / "base", "1m", arch="llama", tokenizer=tok, max_position_embeddings=256)
    (root / "my_rewards.py").write_text(REWARDS)
    return root, str(model)


def test_bpe_chat_dataset_sft_then_grpo_with_user_reward_functions(user_files):
    from posttrain.config import load_config
    from posttrain.loop import train
    from posttrain.models.loading import PromptEncoder, load_tokenizer
    from posttrain.tracking import read_metrics
    from posttrain.training.sft import run_sft

    root, base = user_files
    common = [f"runs_dir={root / 'runs'}", "task.name=dataset", f"task.path={root / 'data.jsonl'}",
              "task.heldout_size=40", "task.system_prompt=Answer in full sentences.", "seed=0"]
    t0 = time.perf_counter()
    sft_cfg = load_config(None, [*common, "name=sft", "sft.max_steps=60", "sft.batch_size=32", "sft.warmup_steps=10",
                                 "sft.eval_every=60", "sft.target_accuracy=1.0", "eval.max_new_tokens=64"])
    sft = run_sft(sft_cfg, base, root / "sft-model")
    t_sft = time.perf_counter() - t0

    # The prompt the engine sees is the chat template's rendering, system prompt first.
    tok = load_tokenizer(str(root / "sft-model"))
    row = json.loads((root / "data.jsonl").read_text().splitlines()[0])
    text = tok.decode(PromptEncoder(tok).encode([{"role": "system", "content": "Answer in full sentences."},
                                                 *row["prompt"]]))
    assert text.startswith("<|im_start|>system\nAnswer in full sentences.<|im_end|>\n<|im_start|>user\n")
    assert text.endswith("<|im_start|>assistant\n")

    fns = (f"[{{name: detail, fn: '{root / 'my_rewards.py'}:detail', weight: 1.0}}, "
           f"{{name: unit, fn: '{root / 'my_rewards.py'}:names_unit', weight: 0.0}}]")
    cfg = load_config(None, [
        *common, "name=grpo", f"model.path={root / 'sft-model'}", "rollout.engine=vllm",
        f"rollout.max_new_tokens={MAX_NEW}", "rollout.vllm.max_model_len=192", "reward.weights={}",
        f"reward.functions={fns}", "algorithm.name=grpo", "algorithm.prompts_per_step=8", "algorithm.group_size=4",
        "algorithm.kl_coef=0", "algorithm.lr=1e-3", f"train.steps={STEPS}", "eval.every=0", "eval.max_new_tokens=64",
        "checkpoint.every=0", "logging.progress=false",
    ])
    t1 = time.perf_counter()
    train(cfg, progress=False)
    t_rl = time.perf_counter() - t1
    steps = [m for m in read_metrics(cfg.run_dir) if "time/step" in m]
    detail = [m["reward/detail"] for m in steps]
    unit = [m["reward/unit"] for m in steps]
    logged = [json.loads(line) for line in (cfg.run_dir / "samples.jsonl").read_text().splitlines()]
    gain, z = two_sample_z([r for _id, _text, r in logged[0]["samples"]], [r for _id, _text, r in logged[-1]["samples"]])
    print(f"user task: SFT {sft.steps} steps {t_sft:.0f} s; GRPO {STEPS} steps {t_rl:.0f} s; completion tokens "
          f"{steps[0]['response_length']:.1f} -> {steps[-1]['response_length']:.1f}; reward/detail "
          f"{detail[0]:.3f} -> {detail[-1]:.3f} (gain {gain:+.3f}, z {z:.1f}); reward/unit {unit[0]:.2f} -> {unit[-1]:.2f}")
    assert len(steps) == STEPS and all(0 <= d <= 1 for d in detail) and all(0 <= u <= 1 for u in unit)
    # completions of 32+ tokens: the run is not the 8-token character model's
    assert max(m["response_length"] for m in steps) >= 32
    # weight 0 steers nothing: the reward is the detail function alone
    assert all(m["reward_mean"] == pytest.approx(m["reward/detail"], abs=1e-6) for m in steps)
    assert all(m.get("reward_failures", 0) == 0 for m in steps)
    assert gain > 0.02 and z > Z_MIN, (gain, z, detail)
    # reward/unit of step 1, recomputed from the logged completions and each row's own unit column
    units = {f"row{i}": json.loads(line)["unit"]
             for i, line in enumerate((root / "data.jsonl").read_text().splitlines(), start=1)}
    first = logged[0]
    named = [units[sample_id.split("/")[1]] in text for sample_id, text, _reward in first["samples"]]
    assert first["step"] == 1 and unit[0] == pytest.approx(sum(named) / len(named))
