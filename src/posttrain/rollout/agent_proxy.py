"""An OpenAI-compatible endpoint in front of the rollout fleet, for agent programs written anywhere (docs/agents.md).

    POST /v1/chat/completions          messages (+ tools) -> choices[0].message (content, tool_calls), usage
    POST /v1/completions               a raw prompt string -> choices[0].text
    POST /v1/episodes/{id}/reward      {"reward": float}: the episode's reward (rollout.agent.reward=agent)
    GET  /v1/models                    the one model served

It listens on 127.0.0.1 only (a stdlib threading HTTP server: an agent makes a few calls a second, not thousands).
Each request's API key (`Authorization: Bearer <key>`) names its episode; a key is valid from `open` to `finish`.
The proxy renders messages with the run's chat template itself and keeps the exact ids of every call
(rollout/agent_transcript.py), so the trainer sees what the engine saw. Sampling follows the run
(rollout.temperature, top_p, max_new_tokens, each call's seed derived from the episode's as multi-turn turns'),
not the request: the trainer's behaviour policy is the run's; a request's max_tokens can only lower the budget.
Calls of several episodes that arrive together go to the engines as one batch (`GenerationQueue`). `stream` and
`n > 1` are refused with a 400.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

from posttrain.errors import PosttrainError
from posttrain.rollout.agent_transcript import AgentTranscript
from posttrain.rollout.engine import Completion, SamplingSpec
from posttrain.rollout.sampler import turn_seed
from posttrain.rollout.tool_calls import HERMES_BLOCK, ToolCall, parse_tool_calls
from posttrain.rollout.trajectory import ChatRenderer, Turn

Generate = Callable[[list[list[int]], SamplingSpec, list[int]], list[list[Completion]]]


class GenerationQueue:
    """Calls from the HTTP threads, gathered for `wait_seconds` and sent to `generate` together (one call per
    distinct sampling spec). `generate` is set by whoever runs the episodes (the fleet, or an engine in tests)."""

    def __init__(self, wait_seconds: float = 0.005):
        self.generate: Generate | None = None
        self.wait_seconds = wait_seconds
        self._items: list[dict] = []
        self._cv = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="agent-proxy-generate", daemon=True)
        self._thread.start()

    def submit(self, prompt: list[int], spec: SamplingSpec, seed: int) -> Completion:
        item = {"prompt": prompt, "spec": spec, "seed": seed, "done": threading.Event()}
        with self._cv:
            self._items.append(item)
            self._cv.notify()
        item["done"].wait()
        if "error" in item:
            raise item["error"]
        return item["result"]

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._items and not self._stop:
                    self._cv.wait()
                if self._stop:
                    return
            time.sleep(self.wait_seconds)  # let the other episodes' calls of this moment join the batch
            with self._cv:
                batch, self._items = self._items, []
            groups: dict[tuple, list[dict]] = {}
            for item in batch:
                s = item["spec"]
                groups.setdefault((s.max_new_tokens, s.temperature, s.top_p), []).append(item)
            for items in groups.values():
                try:
                    outs = self.generate([i["prompt"] for i in items], items[0]["spec"], [i["seed"] for i in items])
                    for i, group in zip(items, outs):
                        i["result"] = group[0]
                except BaseException as e:  # noqa: BLE001 - handed to the waiting request, which reports it
                    for i in items:
                        i["error"] = e
                for i in items:
                    i["done"].set()

    def close(self) -> None:
        with self._cv:
            self._stop = True
            for i in self._items:
                i["error"] = RuntimeError("the agent endpoint closed")
                i["done"].set()
            self._cv.notify()
        self._thread.join(5)


@dataclass
class ProxyEpisode:
    """The proxy's side of one episode: its transcript, sampling, token limit and reward."""
    key: str
    transcript: AgentTranscript
    spec: SamplingSpec
    limit: int                      # tokens per chain, prompt included (rollout.max_total_tokens)
    reward: float | None = None
    refused: list[str] = field(default_factory=list)   # why calls were refused (e.g. context_length_exceeded)
    closed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


class ApiError(Exception):
    def __init__(self, status: int, message: str, code: str):
        super().__init__(message)
        self.status, self.code = status, code


class AgentProxy:
    """The endpoint. `port` 0 picks a free one; a port in use is a PosttrainError naming rollout.agent.port.
    `tool_parser`: how tool calls are read from the policy's text (rollout.tool_parser)."""

    def __init__(self, tokenizer, *, port: int = 0, tool_parser: str = "hermes", model_dir: str = "model.path"):
        self.tokenizer, self.tool_parser, self.model_dir = tokenizer, tool_parser, model_dir
        self.stop_ids = {tokenizer.eos_token_id, tokenizer.pad_token_id}
        self.queue = GenerationQueue()
        self.episodes: dict[str, ProxyEpisode] = {}
        self.failure: BaseException | None = None   # a generate call that failed (the run re-raises it)
        self._renderers: dict[str, ChatRenderer] = {}
        self._lock = threading.Lock()
        ChatRenderer(tokenizer, None, model_dir)  # no chat template: the error names the model now
        try:
            self.server = ThreadingHTTPServer(("127.0.0.1", port), _handler(self))
        except OSError as e:
            self.queue.close()
            raise PosttrainError(f"rollout.agent.port={port}: cannot listen on 127.0.0.1:{port} ({e.strerror or e})",
                                 hint="free the port, or set rollout.agent.port=0 to take any free one") from None
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, name="agent-proxy", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        """OPENAI_BASE_URL for the agents."""
        return f"http://127.0.0.1:{self.port}/v1"

    def open(self, key: str, sample_id: str, seed: int, spec: SamplingSpec, limit: int) -> ProxyEpisode:
        ep = ProxyEpisode(key, AgentTranscript(sample_id, seed), spec, limit)
        with self._lock:
            self.episodes[key] = ep
        return ep

    def finish(self, key: str) -> ProxyEpisode:
        """Ends the episode's key: a call still generating for it is waited for, later calls get a 401."""
        with self._lock:
            ep = self.episodes.pop(key)
        with ep.lock:
            ep.closed = True
        return ep

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.queue.close()

    # ------------------------------------------------------------------ the calls

    def episode(self, key: str | None) -> ProxyEpisode:
        ep = self.episodes.get(key or "")
        if ep is None:
            raise ApiError(401, "unknown or finished episode key: use the OPENAI_API_KEY this episode was started "
                           "with", "invalid_api_key")
        return ep

    def renderer(self, tools) -> ChatRenderer:
        key = json.dumps(tools, sort_keys=True)
        with self._lock:
            if key not in self._renderers:
                self._renderers[key] = ChatRenderer(self.tokenizer, tools, self.model_dir)
            return self._renderers[key]

    def chat(self, ep: ProxyEpisode, body: dict) -> dict:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise ApiError(400, "messages must be a non-empty list of message objects", "invalid_request_error")
        tools = body.get("tools") or None
        renderer = self.renderer(tools)
        with ep.lock:
            chain, pending, prompt = ep.transcript.prepare(renderer, messages, tools, self.tool_parser)
            c, k = self._sample(ep, prompt, body)
            text = self._decode(c.token_ids)
            calls = parse_tool_calls(text, self.tool_parser) if tools else []
            message, finish = openai_message(text, calls, k, c.finish_reason)
            sampled = Turn("assistant", text, list(c.token_ids), list(c.logprobs),
                           tool_calls=[call.record() for call in calls])
            ep.transcript.commit(chain, pending, prompt, sampled, message)
        return {"id": f"chatcmpl-{ep.key[-8:]}-{k}", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model") or "posttrain-policy",
                "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
                "usage": usage(prompt, c.token_ids)}

    def complete(self, ep: ProxyEpisode, body: dict) -> dict:
        prompt_text = body.get("prompt")
        if isinstance(prompt_text, list) and len(prompt_text) == 1:
            prompt_text = prompt_text[0]
        if not isinstance(prompt_text, str) or not prompt_text:
            raise ApiError(400, "prompt must be one non-empty string", "invalid_request_error")
        ids = list(self.tokenizer(prompt_text, add_special_tokens=False)["input_ids"])
        with ep.lock:
            chain, pending = ep.transcript.prepare_text(ids, prompt_text)
            c, k = self._sample(ep, ids, body)
            text = self._decode(c.token_ids)
            ep.transcript.commit(chain, pending, ids, Turn("assistant", text, list(c.token_ids), list(c.logprobs)),
                                 {"role": "assistant", "content": text})
        return {"id": f"cmpl-{ep.key[-8:]}-{k}", "object": "text_completion", "created": int(time.time()),
                "model": body.get("model") or "posttrain-policy",
                "choices": [{"index": 0, "text": text, "logprobs": None,
                             "finish_reason": "stop" if c.finish_reason == "stop" else "length"}],
                "usage": usage(ids, c.token_ids)}

    def set_reward(self, key: str, body: dict) -> dict:
        ep = self.episode(key)
        value = body.get("reward")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ApiError(400, f"reward must be a finite number, got {value!r}", "invalid_request_error")
        with ep.lock:
            ep.reward = float(value)
        return {"episode": key, "reward": ep.reward}

    def _sample(self, ep: ProxyEpisode, prompt: list[int], body: dict) -> tuple[Completion, int]:
        """One completion of `prompt` for `ep` (called with ep.lock held: an episode's calls run one at a time)."""
        if body.get("stream"):
            raise ApiError(400, "stream=true is not supported by the posttrain endpoint; ask without streaming",
                           "invalid_request_error")
        if body.get("n", 1) not in (1, None):
            raise ApiError(400, "n must be 1: each call of an episode is one sample", "invalid_request_error")
        if ep.closed:
            raise ApiError(401, "the episode has ended", "invalid_api_key")
        asked = [v for v in (body.get("max_tokens"), body.get("max_completion_tokens")) if isinstance(v, int)]
        budget = min([ep.spec.max_new_tokens, ep.limit - len(prompt), *asked])
        if budget < 1:
            ep.refused.append("context_length_exceeded")
            raise ApiError(400, f"the conversation ({len(prompt)} tokens) leaves no room within the episode's "
                           f"{ep.limit} tokens (rollout.max_total_tokens)", "context_length_exceeded")
        k = ep.transcript.calls
        spec = SamplingSpec(n=1, max_new_tokens=budget, temperature=ep.spec.temperature, top_p=ep.spec.top_p)
        try:
            return self.queue.submit(prompt, spec, turn_seed(ep.transcript.seed, k)), k
        except Exception as e:
            self.failure = self.failure or e
            raise ApiError(500, f"generation failed: {e}", "server_error") from None

    def _decode(self, token_ids: list[int]) -> str:
        cut = next((i for i, t in enumerate(token_ids) if t in self.stop_ids), len(token_ids))
        return self.tokenizer.decode(token_ids[:cut], skip_special_tokens=True)


def usage(prompt: list[int], completion: list[int]) -> dict:
    return {"prompt_tokens": len(prompt), "completion_tokens": len(completion),
            "total_tokens": len(prompt) + len(completion)}


def openai_message(text: str, calls: list, k: int, finish_reason: str) -> tuple[dict, str]:
    """The assistant message in OpenAI's format and its finish_reason. Calls that all parse become `tool_calls`
    (the text around them the content, None when empty); a malformed call stays in the content, as the policy wrote
    it, for the agent to answer."""
    finish = "stop" if finish_reason == "stop" else "length"
    if calls and all(isinstance(c, ToolCall) for c in calls):
        rest = HERMES_BLOCK.sub("", text).strip() if "<tool_call>" in text else ""
        tool_calls = [{"id": f"call_{k}_{i}", "type": "function",
                       "function": {"name": c.name, "arguments": json.dumps(c.arguments)}} for i, c in enumerate(calls)]
        return {"role": "assistant", "content": rest or None, "tool_calls": tool_calls}, "tool_calls"
    return {"role": "assistant", "content": text}, finish


def _handler(proxy: AgentProxy):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):  # noqa: N802 - the stdlib's name
            if self.path.rstrip("/") == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": "posttrain-policy", "object": "model",
                                                              "owned_by": "posttrain"}]})
            else:
                self._send(404, _error(f"no route GET {self.path}", "not_found"))

        def do_POST(self):  # noqa: N802
            try:
                body = self._body()
                path = self.path.split("?")[0].rstrip("/")
                reward = re.fullmatch(r"/v1/episodes/([^/]+)/reward", path)
                if reward:
                    out = proxy.set_reward(reward.group(1), body)
                elif path == "/v1/chat/completions":
                    out = proxy.chat(proxy.episode(self._key()), body)
                elif path == "/v1/completions":
                    out = proxy.complete(proxy.episode(self._key()), body)
                else:
                    raise ApiError(404, f"no route POST {self.path}", "not_found")
                self._send(200, out)
            except ApiError as e:
                self._send(e.status, _error(str(e), e.code))
            except Exception as e:  # noqa: BLE001 - a bug here must not hang the agent: it gets a 500
                self._send(500, _error(f"{type(e).__name__}: {e}", "server_error"))

        def _key(self) -> str | None:
            auth = self.headers.get("Authorization", "")
            return auth[7:].strip() if auth.lower().startswith("bearer ") else self.headers.get("api-key")

        def _body(self) -> dict:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                body = json.loads(raw or b"{}")
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise ApiError(400, f"the request body is not JSON ({e})", "invalid_request_error") from None
            if not isinstance(body, dict):
                raise ApiError(400, "the request body must be a JSON object", "invalid_request_error")
            return body

        def _send(self, status: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):  # the agents' calls are recorded in the episodes, not on stderr
            pass

    return Handler


def _error(message: str, code: str) -> dict:
    return {"error": {"message": message, "type": "invalid_request_error" if code != "server_error" else code,
                      "code": code}}

