"""Agent rollouts (rollout/agent_episodes.py, agent_proxy.py): agent programs drive episodes through the
OpenAI-compatible endpoint on 127.0.0.1, and the trainer's rows are exactly the ids the engine saw and sampled.

The real transformers engine on the tools demo's SFT-warm-started model (it calls the calculator), wrapped to log
every request it serves; agents are real subprocesses:
- the official `openai` client (tests/fixtures/agents/openai_agent.py): a tool call, its result, a second call, a
  reward. Each episode's row (prompt + completion, mask) is the last request the engine served + its sample, every
  earlier request a prefix of it, the mask 1 exactly on sampled tokens, and the trainer's logprobs equal the
  engine's (tests/test_multiturn_tokens.py's checks);
- bash + curl (tests/fixtures/agents/curl_agent.sh), whose raw-text call starts a second chain;
- an agent that crashes, one that hangs past the timeout (killed within it + a margin), one without a reward: each
  ends with its reason, none blocks the others;
- what the endpoint refuses (an unknown or ended key, streaming, no messages, a reward that is not a number).
Bad input: an agent command not found, a port in use: exit 2 with one message each. And the product path:
`posttrain train` with `rollout.agent` in a subprocess, on Ray."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from posttrain.cli import app
from posttrain.rollout.engine import SamplingSpec
from test_multiturn_tokens import LOGPROB_TOL, token_exact, trainer_gap

AGENTS = Path(__file__).resolve().parent / "fixtures" / "agents"
OPENAI_AGENT = f"{sys.executable} {AGENTS / 'openai_agent.py'}"


class LoggingEngine:
    """One engine in this process, keeping what each generate call was given and returned (the proxy's generate)."""

    def __init__(self, model_dir: str, max_model_len: int):
        from posttrain.rollout.engines import make_engine

        self.engine = make_engine("hf", model_dir, max_model_len=max_model_len)
        self.served: list[tuple[list[int], list[int], list[float]]] = []
        self.lock = threading.Lock()

    def __call__(self, prompts, spec, seeds):
        with self.lock:
            out = self.engine.generate(prompts, spec, seeds)
            for p, group in zip(prompts, out):
                self.served += [(list(p), list(c.token_ids), list(c.logprobs)) for c in group]
        return out


def agent_cfg(model_dir, **agent):
    from posttrain.demo_tools import demo_tools_config

    fields = ", ".join(f"{k}: {v!r}" if isinstance(v, str) else f"{k}: {v}" for k, v in agent.items())
    return demo_tools_config([f"sft.out={model_dir}", "rollout.tools=[]", f"rollout.agent={{{fields}}}"])


@pytest.fixture(scope="module")
def model(tools_sft_model):
    from posttrain.models.loading import load_tokenizer

    cfg, model_dir = tools_sft_model
    return str(model_dir), load_tokenizer(str(model_dir)), LoggingEngine(str(model_dir),
                                                                         cfg.rollout.vllm.max_model_len)


def run_agents(model, problems, temperature=0.0, **agent):
    from posttrain.rollout.agent_episodes import AgentEpisodeRunner

    model_dir, tokenizer, engine = model
    cfg = agent_cfg(model_dir, **agent)
    runner = AgentEpisodeRunner(cfg, tokenizer, model_dir)
    try:
        start = len(engine.served)
        episodes, times = runner.run_with(engine, problems, [f"0/{p.id}/0" for p in problems],
                                          [1000 * (i + 1) for i in range(len(problems))],
                                          SamplingSpec(n=1, max_new_tokens=cfg.rollout.max_new_tokens,
                                                       temperature=temperature))
    finally:
        runner.close()
    return episodes, times, engine.served[start:]


def problems(n: int, phrasing: str = "What is"):
    from posttrain.demo_tools import demo_tools_config
    from posttrain.tasks import load_task

    cfg = demo_tools_config([])
    return [p for p in load_task(cfg.task, cfg.seed).train[:200] if p.prompt.startswith(phrasing)][:n]


def assert_token_exact(model, episodes, served):
    _, tokenizer, engine = model
    for ep in episodes:
        prompt, completion, mask = ep.prompt_ids, ep.completion_ids(), ep.loss_mask()
        assert token_exact(prompt, completion, mask, served) is None, (token_exact(prompt, completion, mask, served),
                                                                       ep.record())
        gap = trainer_gap(engine.engine.model, tokenizer.pad_token_id, prompt, completion, mask, ep.engine_logprobs())
        assert gap < LOGPROB_TOL, f"trainer vs engine logprobs differ by {gap}"


def test_openai_client_agent_with_a_tool_call_is_token_exact(model):
    from posttrain.rollout.tools import check_tools

    sys.path.insert(0, str(AGENTS))
    try:
        import openai_agent
    finally:
        sys.path.remove(str(AGENTS))
    assert openai_agent.TOOLS == [check_tools(["posttrain.tasks.builtin_tools:calculate"])[0].schema]

    t = time.perf_counter()
    episodes, times, served = run_agents(model, problems(4), command=OPENAI_AGENT, concurrency=2, timeout_seconds=60)
    wall = time.perf_counter() - t
    assert [ep.end_reason for ep in episodes] == ["completed"] * 4, [ep.record() for ep in episodes]
    with_tool = [ep for ep in episodes if any(t.role == "tool" for t in ep.turns)]
    assert len(with_tool) >= 2, [ep.record() for ep in episodes]
    for ep in with_tool:
        assert [t.role for t in ep.turns] == ["assistant", "tool", "assistant"]
        assert ep.turns[0].tool_calls[0]["name"] == "calculate"
        assert ep.record()["agent"]["calls"] == 2 and ep.record()["agent"]["dropped_calls"] == 0
        assert ep.env_reward() in (0.0, 1.0)
    assert len(served) == sum(ep.assistant_turns() for ep in episodes)  # one engine request per call
    assert_token_exact(model, episodes, served)
    print(f"openai agents: {len(episodes)} episodes ({len(with_tool)} with a tool call) in {wall:.1f} s, "
          f"generate {sum(times.generate_turns):.2f} s")


def test_curl_agent_and_a_rewritten_history(model):
    episodes, _, served = run_agents(model, problems(1), command=f"bash {AGENTS / 'curl_agent.sh'}",
                                     timeout_seconds=30)
    (ep,) = episodes
    assert ep.end_reason == "completed", ep.record()
    assert ep.env_reward() == 0.5
    # the raw-text call does not continue the chat call's ids: it is a chain of its own, and the episode trains on it
    assert ep.record()["agent"] == {**ep.record()["agent"], "calls": 2, "chains": 2, "dropped_calls": 1}
    assert len(served) == 2 and len(ep.completion_ids()) <= 4
    assert_token_exact(model, episodes, served)


def test_crash_hang_and_no_reward_end_with_their_reason(model, tmp_path):
    script = tmp_path / "agent.sh"
    script.write_text(
        'curl -sS "$OPENAI_BASE_URL/chat/completions" -H "Authorization: Bearer $OPENAI_API_KEY" '
        '-d \'{"messages": [{"role": "user", "content": "hi"}]}\' > /dev/null\n'
        'case "$POSTTRAIN_SAMPLE_ID" in\n'
        '  *crash*) echo "agent failed: boom" >&2; exit 3 ;;\n'
        '  *hang*) sleep 60 ;;\n'
        '  *) exit 0 ;;  # no reward\n'
        'esac\n')
    from posttrain.tasks import Problem

    rows = [Problem(f"{kind}", "What is 1+1?", "2") for kind in ("crash", "hang", "quiet")]
    t = time.perf_counter()
    episodes, _, served = run_agents(model, rows, command=f"bash {script}", concurrency=3, timeout_seconds=4)
    wall = time.perf_counter() - t
    assert [ep.end_reason for ep in episodes] == ["agent_crashed", "agent_timeout", "no_reward"]
    assert wall < 4 + 3, f"the hung agent held the batch {wall:.1f} s"
    crashed, hung, quiet = (ep.record()["agent"] for ep in episodes)
    assert crashed["exit_code"] == 3 and "agent failed: boom" in crashed["output_tail"]
    assert hung["exit_code"] is None and hung["seconds"] < 4 + 1
    assert quiet["exit_code"] == 0 and quiet["reward"] is None
    for ep in episodes:  # their ids are kept, exact, but nothing of them is trained on
        assert ep.assistant_turns() == 1 and sum(ep.loss_mask()) == 0
    assert_token_exact(model, [], served)

    from posttrain.rollout.episode_metrics import episode_metrics

    m = episode_metrics([ep.record() for ep in episodes])
    assert m["episode/end/agent_crashed"] == m["episode/end/agent_timeout"] == m["episode/end/no_reward"] == 1 / 3


def test_the_endpoint_refuses_what_it_cannot_serve(model):
    import json
    import urllib.error
    import urllib.request

    from posttrain.rollout.agent_proxy import AgentProxy

    model_dir, tokenizer, engine = model
    proxy = AgentProxy(tokenizer, model_dir=model_dir)
    proxy.queue.generate = engine
    proxy.open("ep-good", "0/x/0", 1, SamplingSpec(n=1, max_new_tokens=4, temperature=0.0), limit=192)

    def post(path, body, key="ep-good"):
        request = urllib.request.Request(f"{proxy.url}{path}", data=json.dumps(body).encode(), method="POST",
                                         headers={"Authorization": f"Bearer {key}"})
        try:
            with urllib.request.urlopen(request) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())["error"]["code"]

    hi = {"messages": [{"role": "user", "content": "What is 1+1?"}]}
    try:
        assert post("/chat/completions", hi, key="ep-nope") == (401, "invalid_api_key")
        assert post("/chat/completions", {**hi, "stream": True}) == (400, "invalid_request_error")
        assert post("/chat/completions", {"messages": []}) == (400, "invalid_request_error")
        assert post("/episodes/ep-good/reward", {"reward": "high"}) == (400, "invalid_request_error")
        assert post("/episodes/ep-nope/reward", {"reward": 1.0})[0] == 401
        status, reply = post("/chat/completions", {**hi, "max_tokens": 2})
        assert status == 200 and reply["usage"]["completion_tokens"] <= 2
        assert post("/episodes/ep-good/reward", {"reward": 1}) == (200, {"episode": "ep-good", "reward": 1.0})
        ended = proxy.finish("ep-good")
        assert ended.reward == 1.0 and ended.transcript.calls == 1
        assert post("/chat/completions", hi) == (401, "invalid_api_key")  # the key ends with its episode
    finally:
        proxy.close()


def _train_args(tmp_path: Path, model_dir: str, *extra: str) -> list[str]:
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({"name": "bad", "runs_dir": str(tmp_path / "runs"), "model": {"path": model_dir}}))
    return ["train", str(cfg), "task.train_size=200", "task.heldout_size=20", "logging.progress=false", *extra]


def test_an_agent_command_not_found_is_one_message(tmp_path, model):
    result = CliRunner().invoke(app, _train_args(tmp_path, model[0],
                                                 "rollout.agent={command: no-such-agent-xyz --episode}"))
    assert result.exit_code == 2, result.output
    assert "rollout.agent.command" in result.output and "'no-such-agent-xyz' is not found on PATH" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "runs").exists()


def test_a_port_in_use_is_one_message(tmp_path, model):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(app, _train_args(tmp_path, model[0],
                                                     f"rollout.agent={{command: 'bash agent.sh', port: {port}}}"))
    assert result.exit_code == 2, result.output
    assert f"rollout.agent.port={port}" in result.output and "Traceback" not in result.output


@pytest.mark.integration
def test_posttrain_train_trains_on_agent_episodes(tmp_path, model):
    """`posttrain train` with rollout.agent (the openai agent), 2 GRPO steps on Ray with the hf engine: exit 0, every
    sample an agent episode that completed with the agent's reward, trained every step (groups without signal kept),
    and the trainer's logprobs of the trained rows equal the engine's: the rows are the ids the engine saw and
    sampled (a row of other ids would be nats away, tests/test_multiturn_tokens.py)."""
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({
        "name": "agent", "runs_dir": str(tmp_path / "runs"), "model": {"path": model[0]},
        "task": {"name": "tool_arithmetic", "train_size": 200, "heldout_size": 4},
        "rollout": {"engine": "hf", "num_workers": 1, "max_new_tokens": 40, "max_total_tokens": 192,
                    "vllm": {"max_model_len": 192},
                    "agent": {"command": OPENAI_AGENT, "concurrency": 2, "timeout_seconds": 120}},
        "algorithm": {"prompts_per_step": 2, "group_size": 2, "skip_zero_variance_groups": False},
        "train": {"steps": 2}, "eval": {"every": 0}, "checkpoint": {"every": 0},
        "reward": {"weights": {"environment": 1.0}}, "logging": {"progress": False},
    }))
    done = subprocess.run([sys.executable, "-m", "posttrain.cli", "train", str(cfg)], capture_output=True, text=True,
                          timeout=900, env={**os.environ})
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "runs" / "agent"
    records = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2] and all(len(r["samples"]) == 4 for r in records)
    episodes = [ep for r in records for ep in r["episodes"].values()]
    assert len(episodes) == 8 and all(ep["end_reason"] == "completed" for ep in episodes), episodes
    assert all(ep["agent"]["calls"] >= 1 and ep["agent"]["reward"] in (0.0, 1.0) for ep in episodes)
    steps = [m for m in (json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()) if "time/step" in m]
    assert [m["episode/end/completed"] for m in steps] == [1.0, 1.0]
    gaps = [(m["loss"], m["logprob_gap_max"]) for m in steps]  # (None, None): a step that trained nothing
    assert all(loss is not None and gap < LOGPROB_TOL for loss, gap in gaps), gaps

