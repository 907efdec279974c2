"""Multi-turn rollout: episodes in which the policy talks to an environment and calls tools over several turns
(`rollout.environment`, `rollout.tools`; docs/multi-turn.md).

One step's episodes advance together, turn by turn: every active episode's context (its exact ids so far,
rollout/trajectory.py) goes to the rollout workers in one `generate_on_workers` call (so several workers, a worker
that dies and is redone with the same seeds, and an elastic fleet work as for single-turn rollouts); then the
turn's tool calls run in the sandbox (rollout/tool_sandbox.py) and the environment's steps in its own process
(rollout/environment.py), each batched over the episodes. An assistant turn with tool calls gets the tools'
results; one without goes to the environment, which says whether the episode is done. An episode ends with a
reason (trajectory.END_REASONS); none is ever cut half-way into the trainer: a step's episodes all end before the
step trains, and a checkpoint is taken between steps.

Seeds: episode j of prompt i samples its turn t with `turn_seed(sample_seed(run, step, i) + j, t)`; turn 0 is what
a single-turn rollout draws, so one-turn episodes reproduce single-turn samples.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from posttrain.config import RunConfig
from posttrain.rollout.engine import SamplingSpec
from posttrain.rollout.fleet import generate_on_workers
from posttrain.rollout.sampler import turn_seed
from posttrain.rollout.trajectory import ChatRenderer, Episode, Turn, check_tool_template
from posttrain.tasks.base import prompt_text


@dataclass
class EpisodeTimes:
    """Where a multi-turn rollout's wall time went (added to the step's time/* metrics)."""
    generate_turns: list[float]
    tools: float = 0.0
    environment: float = 0.0


def problem_row(problem) -> dict:
    """What an environment's `reset` is given: the row's id, prompt and answer and its other columns."""
    return {"id": problem.id, "prompt": problem.prompt, "answer": problem.answer, **(problem.columns or {})}


def call_record(call) -> dict:
    """A parsed tool call as samples.jsonl keeps it: {name, arguments}, or {error: kind, text} when unusable."""
    if hasattr(call, "arguments"):
        return {"name": call.name, "arguments": call.arguments}
    return {"error": call.kind, "text": call.text}


def result_record(result) -> dict:
    return {"name": result.name, "content": result.content, "error": result.error,
            "seconds": round(result.seconds, 4)}


class EpisodeRunner:
    """The driver's side of multi-turn rollouts for one run: the chat renderer (tools included), the environment's
    process and the tool sandbox. Created at start (user code and the chat template checked before any actor
    starts); `close()` ends the processes."""

    def __init__(self, cfg: RunConfig, tokenizer, model_dir: str):
        from posttrain.rollout.environment import EnvironmentHost, check_environment
        from posttrain.rollout.tool_sandbox import ToolRunner
        from posttrain.rollout.tools import check_tools

        r = cfg.rollout
        self.cfg = cfg
        self.tokenizer = tokenizer
        # the user's code first (its errors name the file), then whether the model's chat template can carry it
        self.environment = (check_environment(r.environment, interface=r.environment_interface)
                            if r.environment else None)
        self.tools = check_tools(r.tools) if r.tools else []
        if self.tools:
            check_tool_template(tokenizer, model_dir)
        self.renderer = ChatRenderer(tokenizer, [t.schema for t in self.tools], model_dir)
        self.env = EnvironmentHost(r.environment, r.environment_timeout_seconds, interface=r.environment_interface)
        self.tool_runner = ToolRunner(self.tools, r.tool_timeout_seconds, r.tool_memory_mb) if self.tools else None
        self.stop_ids = {tokenizer.eos_token_id, tokenizer.pad_token_id}

    def prompt_encoder(self):
        """A PromptEncoder that renders a task prompt as an episode's first turn does without an environment (the
        tools' descriptions included), for the start checks and what else encodes prompts."""
        from posttrain.models.loading import PromptEncoder

        renderer = self.renderer

        class EpisodePromptEncoder(PromptEncoder):
            def encode(self, prompt):
                return renderer.prompt_ids([{"role": "user", "content": prompt}] if isinstance(prompt, str)
                                           else list(prompt))

        return EpisodePromptEncoder(self.tokenizer)

    def close(self) -> None:
        self.env.close()
        if self.tool_runner is not None:
            self.tool_runner.close()

    # ------------------------------------------------------------------ one batch of episodes

    def run(self, workers, problems: list, sample_ids: list[str], seeds: list[int], spec: SamplingSpec, *,
            resync=None, watchdog=None, kind: str = "generate") -> tuple[list[Episode], EpisodeTimes]:
        """One episode per (problem, sample id, first-turn seed), all run to their end. `spec.max_new_tokens`
        bounds each assistant turn; `spec.n` must be 1 (each episode is its own request)."""
        from posttrain.rollout.environment import EnvFailure

        times = EpisodeTimes([])
        t = time.perf_counter()
        firsts = self.env.reset([(sid, problem_row(p)) for sid, p in zip(sample_ids, problems)])
        times.environment += time.perf_counter() - t
        episodes = []
        for p, sid, seed, first in zip(problems, sample_ids, seeds, firsts):
            ep = Episode(sid, seed, [], [], row=problem_row(p))
            if isinstance(first, EnvFailure):  # trained on nothing: the row's prompt, no completion, reward.default
                ep.end_reason = "environment_error"
                ep.messages = [{"role": "user", "content": prompt_text(p.prompt)}]
                ep.turns.append(Turn("environment", f"reset failed: {first.text}", []))
            else:
                ep.messages = list(first)
            ep.prompt_ids = self.renderer.prompt_ids(ep.messages)
            episodes.append(ep)
        limit = self.cfg.rollout.episode_token_limit
        max_turns = self.cfg.rollout.max_turns
        for turn in range(max_turns):
            active = [ep for ep in episodes if not ep.done]
            for ep in active:
                if limit - len(ep.context_ids()) < 1:
                    ep.end_reason = "max_total_tokens"
            active = [ep for ep in active if not ep.done]
            if not active:
                break
            t = time.perf_counter()
            self._generate_turn(workers, active, turn, spec, limit, resync, watchdog, kind)
            times.generate_turns.append(time.perf_counter() - t)
            last = turn + 1 == max_turns
            with_calls = [ep for ep in active if not ep.done and ep.turns[-1].tool_calls]
            answered = [ep for ep in active if not ep.done and not ep.turns[-1].tool_calls]
            if with_calls:
                if last:
                    for ep in with_calls:
                        ep.end_reason = "max_turns"
                else:
                    t = time.perf_counter()
                    self._run_tools(with_calls, limit)
                    times.tools += time.perf_counter() - t
            if answered:
                t = time.perf_counter()
                self._step_environment(answered, turn, last, limit, EnvFailure)
                times.environment += time.perf_counter() - t
        for ep in episodes:
            if not ep.done:
                ep.end_reason = "max_turns"
        self.env.end([ep.sample_id for ep in episodes])
        return episodes, times

    def _generate_turn(self, workers, active: list[Episode], turn: int, spec: SamplingSpec, limit: int, resync,
                       watchdog, kind: str) -> None:
        """One assistant turn for every active episode: one generate call per distinct token budget (the budget is
        max_new_tokens unless an episode is near rollout.max_total_tokens)."""
        from posttrain.rollout.tool_calls import parse_tool_calls

        budgets: dict[int, list[Episode]] = {}
        for ep in active:
            budgets.setdefault(min(spec.max_new_tokens, limit - len(ep.context_ids())), []).append(ep)
        for budget, eps in budgets.items():
            turn_spec = SamplingSpec(n=1, max_new_tokens=budget, temperature=spec.temperature, top_p=spec.top_p)
            outs = generate_on_workers(workers, [ep.context_ids() for ep in eps], turn_spec,
                                       [turn_seed(ep.seed, turn) for ep in eps], resync, watchdog=watchdog, kind=kind)
            for ep, group in zip(eps, outs):
                c = group[0]
                text = self._decode(c.token_ids)
                calls = parse_tool_calls(text, self.cfg.rollout.tool_parser) if self.tools else []
                ep.turns.append(Turn("assistant", text, list(c.token_ids), list(c.logprobs),
                                     tool_calls=[call_record(call) for call in calls]))
                ep.messages.append({"role": "assistant", "content": text})
                ep.pending_calls = calls
                if c.finish_reason != "stop":
                    ep.end_reason = "max_total_tokens" if budget < spec.max_new_tokens else "truncated"

    def _decode(self, token_ids: list[int]) -> str:
        cut = next((i for i, t in enumerate(token_ids) if t in self.stop_ids), len(token_ids))
        return self.tokenizer.decode(token_ids[:cut], skip_special_tokens=True)

    def _append(self, ep: Episode, new: list[dict], turn: Turn, limit: int) -> None:
        """Appends the new messages' ids after the history, or ends the episode when they leave no room."""
        turn.token_ids = self.renderer.delta_ids(ep.messages, new, ep.turns[-1].token_ids)
        if len(ep.context_ids()) + len(turn.token_ids) >= limit:
            ep.end_reason = "max_total_tokens"
            return
        ep.turns.append(turn)
        ep.messages.extend(new)

    def _run_tools(self, eps: list[Episode], limit: int) -> None:
        results = self.tool_runner.run([call for ep in eps for call in ep.pending_calls])
        at = 0
        for ep in eps:
            mine, at = results[at:at + len(ep.pending_calls)], at + len(ep.pending_calls)
            ep.pending_calls = []
            new = [{"role": "tool", "name": r.name, "content": r.content} for r in mine]
            self._append(ep, new, Turn("tool", "\n".join(r.content for r in mine), [],
                                       tool_results=[result_record(r) for r in mine]), limit)

    def _step_environment(self, eps: list[Episode], turn: int, last: bool, limit: int, failure_type) -> None:
        from posttrain.rollout.environment import EpisodeState

        asks = []
        for ep in eps:
            state = EpisodeState(row=ep.row, messages=list(ep.messages), turn=turn,
                                 tool_calls=sum(len(t.tool_calls) for t in ep.turns if t.sampled))
            asks.append((ep.sample_id, state, ep.messages[-1]))
        for ep, out in zip(eps, self.env.step(asks)):
            if isinstance(out, failure_type):
                ep.end_reason = "environment_error"
                ep.turns[-1].tool_results = [{"name": "environment", "content": out.text, "error": "exception"}]
                continue
            new, reward, done = out
            ep.turns[-1].reward = reward
            if done:
                ep.end_reason = "answered"
            elif last:
                ep.end_reason = "max_turns"
            else:
                self._append(ep, list(new), Turn(new[0]["role"] if new else "user",
                                                 "\n".join(m.get("content", "") for m in new), []), limit)


def episode_heldout(runner: EpisodeRunner, workers, task, problems: list, max_new_tokens: int, resync=None,
                    watchdog=None) -> dict:
    """Greedy episodes on held-out problems: success (the task's verifier on the final answer is 1) and tool-call
    validity (rollout/episode_metrics.py: the share of the calls run that parsed, named a known tool with valid
    arguments and ran without error; None when no call was run)."""
    from posttrain.rewards.verifier import score_one

    spec = SamplingSpec(n=1, max_new_tokens=max_new_tokens, temperature=0.0)
    episodes, _ = runner.run(workers, problems, [f"heldout/{p.id}" for p in problems], [0] * len(problems), spec,
                             resync=resync, watchdog=watchdog, kind="heldout")
    from posttrain.rollout.episode_metrics import episode_metrics

    success = [score_one(task, p, ep.final_text()).reward >= 1.0 for p, ep in zip(problems, episodes)]
    counts = episode_metrics([ep.record() for ep in episodes])
    return {"success": sum(success) / len(success), "tool_call_validity": counts["episode/tool_call_validity"],
            "tool_calls_per_episode": counts["episode/tool_calls"], "episodes": episodes}
