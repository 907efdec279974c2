"""Agent rollouts (`rollout.agent`, docs/agents.md): the user's agent program, in any language, drives each episode
through the OpenAI-compatible endpoint (rollout/agent_proxy.py) and the trainer trains on the exact ids of its calls
(rollout/agent_transcript.py). A peer of rollout/episodes.py's EpisodeRunner with the same surface (`run`,
`prompt_encoder`, `close`), so rollout/multi_turn.py turns its episodes into trainer rows and scores them unchanged.

Each episode starts `bash -c <command>` in its own process group, at most `concurrency` at once, with:
    OPENAI_BASE_URL        http://127.0.0.1:<port>/v1
    OPENAI_API_KEY         the episode's key (it names the episode; valid until the episode ends)
    POSTTRAIN_EPISODE_ID   the same key
    POSTTRAIN_REWARD_URL   <OPENAI_BASE_URL>/episodes/<key>/reward, to POST {"reward": x} to
    POSTTRAIN_PROMPT       the row's prompt (a string; chat rows as their messages' JSON)
    POSTTRAIN_SAMPLE_ID    the sample's id, step/prompt_id/index
and the row as one JSON line on stdin: {"id", "prompt", the row's other columns}, plus "answer" when the agent gives
the reward (rollout.agent.reward=agent: it needs the answer to grade; with reward=functions it is kept from it).
Its stdout and stderr go to one log, whose tail an episode that failed keeps.

An episode ends with one of agent_transcript.AGENT_END_REASONS. Past timeout_seconds the whole process group is
killed (SIGKILL), so no episode outlives its bound and no step waits on a stuck agent; an episode that did not
complete keeps its ids but trains on nothing (loss mask 0) and counts in episode/end/<reason>.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from posttrain.config import RunConfig
from posttrain.errors import PosttrainError
from posttrain.rollout.agent_proxy import AgentProxy, Generate
from posttrain.rollout.agent_transcript import AgentEpisode
from posttrain.rollout.engine import SamplingSpec
from posttrain.rollout.episodes import EpisodeTimes, problem_row
from posttrain.rollout.fleet import generate_on_workers
from posttrain.rollout.trajectory import ChatRenderer, Episode

OUTPUT_TAIL = 2000  # characters of a failed agent's output kept in its episode's record
POLL_SECONDS = 0.02
# Commands that start with a shell builtin have no program to look for.
_BUILTINS = {"cd", "exec", "source", ".", "export", "set", "eval", "true", "env", "time", "nice", "timeout"}


def check_agent_command(command: str, cwd: str) -> None:
    """The command's program exists: on PATH, or a file (relative to `cwd`) that may be executed."""
    try:
        words = shlex.split(command)
    except ValueError as e:
        raise PosttrainError(f"rollout.agent.command={command!r} is not a valid shell command ({e})",
                             hint="check its quotes") from None
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        words = words[1:]  # FOO=1 python agent.py: the program is python
    if not words or words[0] in _BUILTINS:
        return
    program = words[0]
    if "/" in program:
        path = Path(cwd) / program
        if not path.is_file():
            raise PosttrainError(f"rollout.agent.command: the program {program!r} is not a file (looked in {cwd})",
                                 hint="give the agent script's path relative to the directory posttrain runs in, or "
                                 "an absolute one")
        if not os.access(path, os.X_OK):
            raise PosttrainError(f"rollout.agent.command: {program!r} is not executable",
                                 hint=f"chmod +x {program}, or start it through its interpreter (bash {program})")
    elif shutil.which(program) is None:
        raise PosttrainError(f"rollout.agent.command: the program {program!r} is not found on PATH",
                             hint="install it, give its full path, or fix the command's spelling")


@dataclass
class _Job:
    index: int
    key: str
    process: subprocess.Popen
    log: object            # the agent's stdout + stderr (a temporary file)
    started: float


class AgentEpisodeRunner:
    """The driver's side of agent rollouts for one run: the endpoint (bound at start, so a port in use is an error
    before any actor starts) and the agents' processes. `close()` stops the endpoint."""

    def __init__(self, cfg: RunConfig, tokenizer, model_dir: str, cwd: str | None = None):
        r = cfg.rollout
        self.cfg, self.agent, self.tokenizer = cfg, r.agent, tokenizer
        self.cwd = cwd or os.getcwd()
        if r.environment or r.tools:
            raise PosttrainError("rollout.agent does not combine with rollout.environment or rollout.tools: the agent "
                                 "is the environment, and it sends its tools with each call",
                                 hint="remove rollout.environment / rollout.tools, or rollout.agent")
        check_agent_command(self.agent.command, self.cwd)
        self.renderer = ChatRenderer(tokenizer, None, model_dir)
        self.proxy = AgentProxy(tokenizer, port=self.agent.port, tool_parser=r.tool_parser, model_dir=model_dir)

    def prompt_encoder(self):
        """A PromptEncoder that renders a task prompt as a user message with the chat template (the start checks'
        prompt lengths; an agent may send other messages)."""
        from posttrain.models.loading import PromptEncoder

        renderer = self.renderer

        class AgentPromptEncoder(PromptEncoder):
            def encode(self, prompt):
                return renderer.prompt_ids(first_messages(prompt))

        return AgentPromptEncoder(self.tokenizer)

    def close(self) -> None:
        self.proxy.close()

    def run(self, workers, problems: list, sample_ids: list[str], seeds: list[int], spec: SamplingSpec, *,
            resync=None, watchdog=None, kind: str = "generate") -> tuple[list[Episode], EpisodeTimes]:
        """One agent episode per (problem, sample id, first-call seed), generated on the rollout `workers`."""
        def generate(prompts, call_spec, call_seeds):
            return generate_on_workers(workers, prompts, call_spec, call_seeds, resync, watchdog=watchdog, kind=kind)

        return self.run_with(generate, problems, sample_ids, seeds, spec)

    def run_with(self, generate: Generate, problems: list, sample_ids: list[str], seeds: list[int],
                 spec: SamplingSpec) -> tuple[list[Episode], EpisodeTimes]:
        """`run` with any `generate(prompts, spec, seeds)` (the fleet's, or one engine's in tests)."""
        spent = [0.0]

        def timed(prompts, call_spec, call_seeds):
            t = time.perf_counter()
            try:
                return generate(prompts, call_spec, call_seeds)
            finally:
                spent[0] += time.perf_counter() - t

        self.proxy.failure = None
        self.proxy.queue.generate = timed
        wall = time.perf_counter()
        episodes: list[Episode | None] = [None] * len(problems)
        waiting, running = list(range(len(problems))), []
        while waiting or running:
            while waiting and len(running) < self.agent.concurrency:
                i = waiting.pop(0)
                running.append(self._start(i, problems[i], sample_ids[i], seeds[i], spec))
            time.sleep(POLL_SECONDS)
            for job in list(running):
                timed_out = time.monotonic() - job.started > self.agent.timeout_seconds
                if timed_out or job.process.poll() is not None:
                    running.remove(job)
                    episodes[job.index] = self._end(job, problems[job.index], sample_ids[job.index],
                                                    seeds[job.index], timed_out)
        if self.proxy.failure is not None:  # the engines failed (not the agent): the step fails as a rollout would
            raise self.proxy.failure
        times = EpisodeTimes([spent[0]], environment=max(0.0, time.perf_counter() - wall - spent[0]))
        return episodes, times

    def _start(self, index: int, problem, sample_id: str, seed: int, spec: SamplingSpec) -> _Job:
        key = f"ep-{secrets.token_hex(12)}"
        self.proxy.open(key, sample_id, seed, spec, self.cfg.rollout.episode_token_limit)
        row = problem_row(problem)
        if self.agent.reward != "agent":
            row.pop("answer", None)
        stdin = tempfile.TemporaryFile()
        stdin.write((json.dumps(row, default=str) + "\n").encode())
        stdin.seek(0)
        log = tempfile.TemporaryFile()
        env = {**os.environ, "OPENAI_BASE_URL": self.proxy.url, "OPENAI_API_KEY": key, "POSTTRAIN_EPISODE_ID": key,
               "POSTTRAIN_REWARD_URL": f"{self.proxy.url}/episodes/{key}/reward", "POSTTRAIN_SAMPLE_ID": sample_id,
               "POSTTRAIN_PROMPT": problem.prompt if isinstance(problem.prompt, str) else json.dumps(problem.prompt)}
        try:
            process = subprocess.Popen(["bash", "-c", self.agent.command], cwd=self.cwd, env=env, stdin=stdin,
                                       stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            stdin.close()
        return _Job(index, key, process, log, time.monotonic())

    def _end(self, job: _Job, problem, sample_id: str, seed: int, timed_out: bool) -> AgentEpisode:
        try:  # the whole group: whatever the agent started in the background goes with it
            os.killpg(job.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        code = job.process.wait()
        seconds = time.monotonic() - job.started
        ended = self.proxy.finish(job.key)
        if timed_out:
            reason = "agent_timeout"
        elif code != 0:
            reason = "agent_crashed"
        elif self.agent.reward == "agent" and ended.reward is None:
            reason = "no_reward"
        else:
            reason = "completed"
        job.log.seek(0)
        output = job.log.read().decode(errors="replace")
        job.log.close()
        chains = ended.transcript.chains
        if chains:
            base = chains[-1].episode
        else:  # no call: trained on nothing, the row's prompt as a user message
            messages = first_messages(problem.prompt)
            base = Episode(sample_id, seed, messages, self.renderer.prompt_ids(messages))
        base.row = problem_row(problem)
        agent = {"exit_code": None if timed_out else code, "seconds": round(seconds, 3),
                 "calls": ended.transcript.calls, "chains": len(chains),
                 "dropped_calls": sum(c.episode.assistant_turns() for c in chains[:-1]), "reward": ended.reward}
        if ended.refused:
            agent["refused"] = ended.refused
        if reason != "completed":
            agent["output_tail"] = output[-OUTPUT_TAIL:]
        return AgentEpisode(base, reason, agent, ended.reward if self.agent.reward == "agent" else None)


def first_messages(prompt) -> list[dict]:
    """A row's prompt as chat messages: a string is one user message."""
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
