"""The tool-use demo's pieces: the calculator tool, the task, the ChatML tool template, the demo tokenizer, the
demonstrations and their token construction (the rollout's), SFT on them; and a shortened demo whose RL gain is
checked (integration)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.demo_tools import (TRACE_MIX, build_tools_tokenizer, call_text, demo_tools_config, demonstrations,
                                  near_miss)
from posttrain.models.bpe import CHATML_TEMPLATE, CHATML_TOOLS_TEMPLATE
from posttrain.tasks import load_task
from posttrain.tasks.builtin_tools import calculate
from posttrain.tasks.tool_arithmetic import PHRASINGS, expression_of, phrasing_of


def test_calculate_is_exact_and_refuses_what_is_not_arithmetic():
    assert calculate("37*49+12") == "1825"
    assert calculate(" (2+3)*-4 ") == "-20"
    assert calculate("7//2") == "3" and calculate("7%4") == "3" and calculate("8/2") == "4"
    assert calculate("1/3") == "0.333333"
    assert calculate("1/0") == "error: division by zero"
    for bad in ("2**100", "__import__('os')", "x+1", "1.5*2", "'a'*3", "37*49+"):
        assert calculate(bad).startswith("error:"), bad
    assert calculate("9" * 31 + "*9").startswith("error:")  # results are bounded
    assert calculate("1+" * 150 + "1").startswith("error:")  # so is the expression's length


def test_task_splits_are_disjoint_and_answers_are_the_calculators():
    cfg = demo_tools_config(["task.train_size=300", "task.heldout_size=100"])
    task = load_task(cfg.task, seed=0)
    assert task.name == "tool_arithmetic" and (len(task.train), len(task.heldout)) == (300, 100)
    assert not {p.prompt for p in task.train} & {p.prompt for p in task.heldout}
    for p in task.train[:50] + task.heldout[:50]:
        assert calculate(expression_of(p)) == p.answer
        assert p.prompt == PHRASINGS[phrasing_of(p)].format(e=expression_of(p))
        assert task.score(p, f" {p.answer}\n") == 1.0 and task.score(p, str(int(p.answer) + 1)) == 0.0
    assert {phrasing_of(p) for p in task.train} == set(range(len(PHRASINGS)))
    assert load_task(cfg.task, seed=0).heldout == task.heldout  # seeded


def _render(messages, tools=None, generation_prompt=False, template=CHATML_TOOLS_TEMPLATE):
    from transformers.utils.chat_template_utils import render_jinja_template

    return render_jinja_template([messages], tools=tools, chat_template=template,
                                 add_generation_prompt=generation_prompt)[0][0]


def test_tool_template_renders_tools_and_tool_turns_and_every_prefix():
    schema = {"type": "function", "function": {"name": "calculate", "description": "d", "parameters": {}}}
    convo = [{"role": "user", "content": "What is 2*3+1?"},
             {"role": "assistant", "content": call_text("2*3+1")},
             {"role": "tool", "name": "calculate", "content": "7"},
             {"role": "tool", "name": "calculate", "content": "8"},
             {"role": "assistant", "content": "7"}]
    text = _render(convo, [schema])
    assert text.startswith("<|im_start|>system\n# Tools\n") and json.dumps(schema) in text
    assert "<|im_start|>user\n<tool_response>\n7\n</tool_response><|im_end|>\n" in text
    assert f"<|im_start|>assistant\n{call_text('2*3+1')}<|im_end|>\n" in text
    for k in range(1, len(convo)):  # what trajectory.ChatRenderer.delta_ids needs
        assert text.startswith(_render(convo[:k], [schema])), k
        assert _render(convo[:k + 1], [schema]).startswith(_render(convo[:k], [schema], generation_prompt=True)
                                                             .removesuffix("<|im_start|>assistant\n")), k
    system = [{"role": "system", "content": "Be brief."}] + convo[:1]
    assert _render(system, [schema]).startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert _render(system, generation_prompt=True) == _render(system, generation_prompt=True, template=CHATML_TEMPLATE)


@pytest.fixture(scope="module")
def demo_pieces(tmp_path_factory):
    """The demo's task, tool schemas, 240 demonstrations and tokenizer, and a model directory holding it."""
    from posttrain.demo_tools import build_tools_model
    from posttrain.rollout.tool_sandbox import ToolRunner
    from posttrain.rollout.tools import check_tools

    cfg = demo_tools_config(["task.train_size=400", "task.heldout_size=50"])
    task = load_task(cfg.task, cfg.seed)
    tools = check_tools(cfg.rollout.tools)
    schemas = [t.schema for t in tools]
    with ToolRunner(tools, 5.0, 512) as runner:
        traces = demonstrations(task.train[:240], runner, seed=0)
    out = tmp_path_factory.mktemp("demo-tools")
    tok = build_tools_tokenizer(out / "tokenizer", traces, schemas)
    model_dir = build_tools_model(out / "base", tok)
    return cfg, task, schemas, traces, tok, model_dir


def test_demonstrations_follow_the_mix_and_use_the_tool_runner(demo_pieces):
    _, task, _, traces, _, _ = demo_pieces
    kinds = {k: [] for k in range(len(PHRASINGS))}
    for p, t in zip(task.train, traces):
        assert t[0] == {"role": "user", "content": p.prompt} and t[-1]["role"] == "assistant"
        calls = t[1]["content"].startswith("<tool_call>")
        if not calls:
            kind = "guess"
        elif t[2]["content"].startswith("error: malformed tool call"):
            kind = "malformed"
        else:
            assert t[2] == {"role": "tool", "name": "calculate", "content": t[3]["content"]}
            kind = "perfect" if t[3]["content"] == p.answer else "typo"
        assert (t[-1]["content"] == p.answer) == (kind == "perfect")
        kinds[phrasing_of(p)].append(kind)
    for k, mix in enumerate(TRACE_MIX):
        assert set(kinds[k]) <= set(mix)
        share = kinds[k].count("perfect") / len(kinds[k])
        assert abs(share - mix["perfect"]) < 0.2, (k, share)
    rng = random.Random(0)
    assert all(near_miss(a, rng) != a and len(near_miss(a, rng)) == len(a) for a in ("1825", "-20", "100000"))


def test_trace_tokens_are_the_rollouts_and_the_mask_covers_assistant_turns(demo_pieces):
    from posttrain.models.loading import load_tokenizer
    from posttrain.rollout.trajectory import ChatRenderer
    from posttrain.training.sft_traces import encode_trace

    _, _, schemas, traces, tok, model_dir = demo_pieces
    loaded = load_tokenizer(model_dir)  # what the engines and the trainer load: must tokenize as trained
    assert loaded.eos_token == "<|im_end|>" and len(loaded) == len(tok) <= 1000
    renderer = ChatRenderer(loaded, schemas)
    for trace in traces[:40]:
        full = renderer.render(trace, False)
        assert loaded(full, add_special_tokens=False)["input_ids"] == tok(full, add_special_tokens=False)["input_ids"]
        ids, mask = encode_trace(renderer, trace)
        assert len(ids) == len(mask) <= 192
        assert loaded.decode(ids) + "\n" == full  # the episode's ids spell the conversation, turn edges included
        prompt = renderer.prompt_ids(trace[:1])
        assert ids[:len(prompt)] == prompt and not any(mask[:len(prompt)])
        # masked spans are exactly each assistant turn's own tokens + EOS, in order
        spans, at = [], 0
        while at < len(mask):
            if mask[at]:
                end = mask.index(0, at) if 0 in mask[at:] else len(mask)
                spans.append(ids[at:end])
                at = end
            else:
                at += 1
        said = [m["content"] for m in trace if m["role"] == "assistant"]
        assert spans == [renderer.encode(s) + [loaded.eos_token_id] for s in said]
    call = renderer.encode(call_text("898*78+129"))
    assert len(call) <= 20, [loaded.decode([i]) for i in call]  # JSON keys merged: the tiny model's cost is per token


def test_sft_on_traces_learns_the_assistant_turns(demo_pieces, tmp_path):
    from posttrain.training.sft_traces import run_sft_traces

    cfg, _, schemas, traces, _, model_dir = demo_pieces
    cfg = cfg.model_copy(deep=True)
    cfg.sft.max_steps, cfg.sft.warmup_steps = 30, 5
    losses = []
    result = run_sft_traces(cfg, model_dir, tmp_path / "sft", traces, schemas, on_step=lambda s, l: losses.append(l))
    assert result.steps == 30 and (tmp_path / "sft" / "sft.json").is_file()
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5, losses


# ---------------------------------------------------------------- the demo, shortened, through the CLI

# The demo shortened to ~2.5 min: 650 SFT steps (the model copies expressions part of the time: greedy held-out
# success 25-45%), 20 GRPO steps, 200 held-out problems, the transformers engine (it runs under every kernel setting,
# vLLM's CPU kernels need AVX2). What RL finds is behaviour, not a float trajectory: on "Compute ..." and "... = ?"
# questions the SFT model, decoding greedily, writes a malformed call or guesses (80% of its traces there did), so
# held-out validity starts near 3/4 by construction, while sampling still makes a valid call there one time in five
# or more, and only a valid call whose result is copied is rewarded. Every step pushes those phrasings towards valid
# calls whatever the kernels; measured: validity +25 (own AVX-512 kernels) and +24 points (AVX2), success +14.5 and
# +21 points. The thresholds, +15 validity and +5 success, leave room for another CPU's trajectory.
SHORT = ["sft.max_steps=650", "train.steps=20", "eval.every=0", "task.heldout_size=200", "rollout.engine=hf",
         "logging.progress=false"]


@pytest.mark.integration
def test_tools_demo_cli_raises_success_and_validity(tmp_path):
    done = subprocess.run([str(Path(sys.executable).parent / "posttrain"), "demo", "--task", "tools", "--quiet", f"runs_dir={tmp_path}",
                           *SHORT], capture_output=True, text=True, timeout=900, env={**os.environ})
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "demo-tools" / "summary.json").read_text())
    before, after = summary["heldout_success_before"], summary["heldout_success_after"]
    valid_before, valid_after = summary["tool_call_validity_before"], summary["tool_call_validity_after"]
    print(f"tools demo (short): success {before:.3f} -> {after:.3f}, validity {valid_before:.3f} -> "
          f"{valid_after:.3f}, wall {summary['wall_seconds']:.0f} s")
    assert valid_after - valid_before >= 0.15, summary
    assert after - before >= 0.05, summary
    assert (tmp_path / "demo-tools" / "tools.png").is_file()
    assert "tool-call validity" in done.stderr
