"""The built-in tool-use demo (`posttrain demo --task tools`): RL teaches a tiny model to use a calculator.

The task (tasks/tool_arithmetic.py) is a*b+c, a*b-c or a+b*c with 3-digit numbers: no 1M-parameter model computes
that in its head, but copying the expression into a `calculate` call (tasks/builtin_tools.py) and copying the
result back is within its reach. The steps:

1. demonstrations: TRACES tool-call traces on training problems, the tool messages produced by the real sandboxed
   tool runner. They are imperfect, and how depends on how the question is phrased (real demonstration data's flaws
   cluster by source in the same way), see TRACE_MIX: "What is ...?" is 90% perfect (10% a typo in the copied
   expression), "Calculate ..." 90% (10% a guess without the tool), "Compute ..." 20% (80% a malformed call, then a
   guess), "... = ?" 20% (80% a guess). So the warm-started model, decoding greedily, solves the first two phrasings
   as often as it copies well and fails the last two, while sampling still calls the tool correctly on them now and
   then: room that RL reliably finds, since only a valid call whose result is copied is rewarded.
2. a byte-level BPE tokenizer trained on the rendered traces, with merges across words (the tool prompt and the
   call's JSON keys become a few tokens: a trace is ~60 tokens instead of ~200), eos = <|im_end|> (engines stop at
   the end of a turn) and the ChatML tool template (models/bpe.CHATML_TOOLS_TEMPLATE);
3. the tiny model, SFT on the traces (training/sft_traces.py: the token construction of the RL rollout);
4. GRPO on multi-turn episodes (`posttrain.loop.train`, rollout.tools = the calculator), held-out success and
   tool-call validity measured on greedy episodes before and after.

Measured here (2 cores): 400 traces were memorised (training loss -> 0, held-out success 0%); 1,500 teach copying
after ~600-1,000 SFT steps. Writes runs/demo-tools/summary.json (success and validity before -> after, wall time),
runs/demo-tools/tools.png and the run's usual files.
"""

from __future__ import annotations

import copy
import json
import random
import time
from pathlib import Path

from posttrain.config import RunConfig, apply_overrides, validate_config
from posttrain.tasks.base import Problem
from posttrain.tasks.tool_arithmetic import expression_of, phrasing_of

TOOL_SPEC = "posttrain.tasks.builtin_tools:calculate"
TRACES = 1500             # SFT demonstrations (training problems); 400 were memorised, copying never learned
VOCAB = 800               # BPE tokens: the traces' recurring text needs few; a small head keeps the tiny model fast
MODEL_SIZE = "1m"
# Llama, not Qwen2: transformers loads a qwen2 model directory's tokenizer as Qwen2Tokenizer, which swaps in Qwen's
# word-splitting pre-tokenizer and so undoes the across-word merges the demo tokenizer is trained with. With Qwen2's
# attention biases, which made copying the expression come sooner in SFT here.
MODEL_ARCH = "llama"
MAX_POSITIONS = 192       # the longest episode: tool prompt ~40 tokens + 3 turns and their tool messages
# How each phrasing (tool_arithmetic.PHRASINGS) is demonstrated: behaviour -> share of its traces.
TRACE_MIX = (
    {"perfect": 0.9, "typo": 0.1},
    {"perfect": 0.9, "guess": 0.1},
    {"perfect": 0.2, "malformed": 0.8},
    {"perfect": 0.2, "guess": 0.8},
)

# The demo's config: the defaults below, then the user's dotted overrides.
DEMO_TOOLS_CONFIG: dict = {
    "name": "demo-tools",
    "task": {"name": "tool_arithmetic", "train_size": 20000, "heldout_size": 400},
    "rollout": {"tools": [TOOL_SPEC], "tool_parser": "hermes", "max_turns": 3, "max_new_tokens": 40,
                "max_total_tokens": MAX_POSITIONS, "vllm": {"max_model_len": MAX_POSITIONS}},
    "algorithm": {"name": "grpo", "group_size": 8, "prompts_per_step": 16, "lr": 3e-4, "lr_schedule": "linear",
                  "kl_coef": 0.02},
    "train": {"steps": 60},
    "eval": {"every": 20, "max_new_tokens": 40},
    "checkpoint": {"every": 0},
    "sft": {"batch_size": 32, "lr": 2e-3, "warmup_steps": 30, "max_steps": 1200},
}


def demo_tools_config(overrides: list[str] | None = None) -> RunConfig:
    """DEMO_TOOLS_CONFIG with the user's dotted overrides; the SFT model goes to <runs_dir>/<name>/sft-model unless
    sft.out is given."""
    data = apply_overrides(copy.deepcopy(DEMO_TOOLS_CONFIG), list(overrides or []))
    cfg = validate_config(data, source="the tools demo's config (posttrain.demo_tools.DEMO_TOOLS_CONFIG)")
    if not any(o.startswith("sft.out=") for o in overrides or []):
        cfg.sft.out = str(cfg.run_dir / "sft-model")
    cfg.model.path = cfg.sft.out
    return cfg


# ---------------------------------------------------------------- demonstrations


def call_text(expression: str, malformed: bool = False) -> str:
    """A Hermes tool call of `calculate`; malformed: its closing brace missing, so not JSON."""
    body = json.dumps({"name": "calculate", "arguments": {"expression": expression}})
    return f"<tool_call>\n{body[:-1] if malformed else body}\n</tool_call>"


def near_miss(number: str, rng: random.Random) -> str:
    """A wrong answer of the same length: one or two digits changed (a guess made in the head)."""
    digits = list(number)
    first = 1 if digits[0] == "-" else 0
    for at in rng.sample(range(first, len(digits)), min(len(digits) - first, rng.randint(1, 2))):
        choices = [d for d in "0123456789" if d != digits[at] and not (at == first and d == "0")]
        digits[at] = rng.choice(choices or [digits[at]])
    out = "".join(digits)
    return out if out != number else str(int(number) + 1)


def typo(expression: str, rng: random.Random) -> str:
    """The expression with one digit changed (a slip while copying it)."""
    at = rng.choice([i for i, ch in enumerate(expression) if ch.isdigit()])
    return expression[:at] + rng.choice([d for d in "123456789" if d != expression[at]]) + expression[at + 1:]


def demonstration(problem: Problem, behaviour: str, tool_runner, rng: random.Random) -> list[dict]:
    """One trace (chat messages) of `behaviour` on `problem`; tool messages come from `tool_runner`
    (rollout/tool_sandbox.ToolRunner), as in a rollout."""
    from posttrain.rollout.tool_calls import parse_tool_calls

    user = {"role": "user", "content": problem.prompt}
    if behaviour == "guess":
        return [user, {"role": "assistant", "content": near_miss(problem.answer, rng)}]
    expression = expression_of(problem)
    call = call_text(typo(expression, rng) if behaviour == "typo" else expression, malformed=behaviour == "malformed")
    (result,) = tool_runner.run(parse_tool_calls(call, "hermes"))
    final = near_miss(problem.answer, rng) if behaviour == "malformed" else result.content
    return [user, {"role": "assistant", "content": call}, result.message(), {"role": "assistant", "content": final}]


def demonstrations(problems: list[Problem], tool_runner, seed: int) -> list[list[dict]]:
    """One trace per problem, its behaviour drawn from TRACE_MIX for its phrasing (seeded)."""
    rng = random.Random(f"{seed}/tool-traces")
    traces = []
    for p in problems:
        mix = TRACE_MIX[phrasing_of(p)]
        behaviour = rng.choices(list(mix), list(mix.values()))[0]
        traces.append(demonstration(p, behaviour, tool_runner, rng))
    return traces


# ---------------------------------------------------------------- tokenizer


def build_tools_tokenizer(out_dir: str | Path, traces: list[list[dict]], tools: list[dict], seed: int = 0):
    """A byte-level BPE tokenizer of VOCAB tokens learned mostly from the rendered traces, with the ChatML tool
    template, eos <|im_end|> and <tool_call>/<tool_response> tags as single tokens. Returns it (also saved)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    from posttrain.models.bpe import CHATML_TOOLS_TEMPLATE, IM_END, train_bpe_tokenizer

    rendered = [render_jinja_template([t], tools=tools, chat_template=CHATML_TOOLS_TEMPLATE)[0][0] for t in traces]
    return train_bpe_tokenizer(
        out_dir, VOCAB, extra_texts=rendered, chat_template=CHATML_TOOLS_TEMPLATE, seed=seed, lexicon_size=200,
        sentences=300, eos_token=IM_END, across_words=True,
        added_tokens=["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"],
    )


def build_tools_model(out_dir: str | Path, tokenizer, seed: int = 0) -> Path:
    """The demo's randomly initialised tiny model for `tokenizer` (MODEL_SIZE, MODEL_ARCH with attention biases)."""
    from posttrain.models.tiny import build_tiny_model

    return build_tiny_model(out_dir, MODEL_SIZE, arch=MODEL_ARCH, attention_bias=True, seed=seed, tokenizer=tokenizer,
                            max_position_embeddings=MAX_POSITIONS)


# ---------------------------------------------------------------- the run


def eval_series(run_dir: Path, key: str) -> list[tuple[int, float]]:
    """(step, value) of an eval metric from the run's metrics.jsonl."""
    path = run_dir / "metrics.jsonl"
    out = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        row = json.loads(line)
        if row.get(key) is not None:
            out.append((row.get("step", 0), row[key]))
    return out


def plot_tools_demo(run_dir: Path, summary: dict) -> Path:
    """tools.png beside the run: held-out success and tool-call validity (greedy episodes) at each evaluation, and
    the sampled episodes' success per GRPO step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = eval_series(run_dir, "accuracy")
    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        ax.plot(*zip(*train), color="tab:blue", alpha=0.35, lw=1, label="sampled episodes solved (per step)")
    for key, color, label in (("heldout_success_curve", "tab:red", "held-out success (greedy)"),
                              ("tool_call_validity_curve", "tab:green", "held-out tool-call validity")):
        if summary.get(key):
            ax.plot(*zip(*summary[key]), "o-", color=color, label=label)
    ax.set(xlabel="GRPO step", ylim=(0, 1.02), title=f"{run_dir.name}: GRPO after SFT on imperfect tool-call traces")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    out = run_dir / "tools.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def run_tools_demo(cfg: RunConfig, *, progress: bool = True, log=print) -> dict:
    from posttrain.loop import train
    from posttrain.run_files import remove_run
    from posttrain.machine import describe_machine
    from posttrain.progress import StepProgress
    from posttrain.rollout.tool_sandbox import ToolRunner
    from posttrain.rollout.tools import check_tools
    from posttrain.tasks import load_task
    from posttrain.training.sft_traces import run_sft_traces

    t0 = time.perf_counter()
    run_dir = cfg.run_dir
    remove_run(run_dir)  # the demo always starts from scratch
    task = load_task(cfg.task, cfg.seed)
    tools = check_tools(cfg.rollout.tools)
    schemas = [t.schema for t in tools]
    with ToolRunner(tools, cfg.rollout.tool_timeout_seconds, cfg.rollout.tool_memory_mb) as runner:
        traces = demonstrations(task.train[:TRACES], runner, cfg.seed)
    tokenizer = build_tools_tokenizer(run_dir / "tokenizer", traces, schemas, cfg.seed)
    base = build_tools_model(run_dir / "base-model", tokenizer, cfg.seed)
    log(f"built tiny model {base} ({len(tokenizer)} tokens), {len(traces)} demonstrations")
    bar = StepProgress("sft", cfg.sft.max_steps, enabled=progress, fields=("loss",))
    try:
        sft = run_sft_traces(cfg, base, cfg.sft.out, traces, schemas,
                             on_step=lambda step, loss: bar.update(step, loss=loss) if step % 10 == 0 else None)
    finally:
        bar.close()
    log(f"SFT: {sft.steps} steps, {sft.wall_seconds:.0f} s, final loss {sft.final_loss:.3f} -> {sft.out_dir}")

    cfg = cfg.model_copy(deep=True)
    cfg.model.path = str(sft.out_dir)
    summary = train(cfg, progress=progress)
    success = eval_series(run_dir, "eval/heldout_accuracy")
    validity = eval_series(run_dir, "eval/tool_call_validity")
    summary.update({
        "heldout_success_before": success[0][1] if success else None,
        "heldout_success_after": success[-1][1] if success else None,
        "tool_call_validity_before": validity[0][1] if validity else None,
        "tool_call_validity_after": validity[-1][1] if validity else None,
        "heldout_success_curve": success,
        "tool_call_validity_curve": validity,
        "sft_traces": len(traces),
        "sft_steps": sft.steps,
        "sft_seconds": sft.wall_seconds,
        "wall_seconds": time.perf_counter() - t0,
        "machine": describe_machine(),
    })
    summary["tools_picture"] = str(plot_tools_demo(run_dir, summary))
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    log(f"held-out success {_fmt(summary['heldout_success_before'])} -> {_fmt(summary['heldout_success_after'])}, "
        f"tool-call validity {_fmt(summary['tool_call_validity_before'])} -> "
        f"{_fmt(summary['tool_call_validity_after'])} ({len(task.heldout)} problems); {summary['tools_picture']}")
    return summary


def _fmt(value: float | None) -> str:
    return "none" if value is None else f"{value:.3f}"
