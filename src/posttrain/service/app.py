"""The routes of the Tinker-compatible service (Starlette, served by uvicorn): the endpoints the `tinker` 0.38.0
SDK calls, each a few lines over ServiceState (sessions, queue, futures) and the Backend (models, samplers).

Every error answer has a JSON body naming the problem (the SDK retries a bare 400 as an edge-proxy rejection).
"""

from __future__ import annotations

import asyncio
import time
import uuid

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from posttrain.errors import PosttrainError
from posttrain.service import checkpoints, wire
from posttrain.service.futures import TRY_AGAIN, Outcome
from posttrain.service.state import AuthError, ServiceState, Session
from posttrain.service.backend import Sampler
from posttrain.service.sampling import SampleSpec

CLIENT_CONFIG = {"pjwt_auth_enabled": False, "use_pyqwest_transport": False, "parallel_fwdbwd_chunks": False,
                 "proto_compress_fwdbwd": False, "sample_use_retrieve_futures": False,
                 "custom_loss_server_side": False, "sample_join_sampling_session": False}
DEFAULT_MAX_TOKENS = 128


def _error(message: str, status: int = 400, category: str = "user") -> JSONResponse:
    return JSONResponse({"error": message, "detail": message, "category": category}, status_code=status)


def endpoint(fn):
    """Wraps a handler(state, owner, request): the API key checked, user errors as a 400 with a body."""
    async def handler(request: Request):
        state: ServiceState = request.app.state.service
        try:
            owner = state.owner(request.headers.get("x-api-key"))
            return await fn(state, owner, request)
        except AuthError as e:
            return _error(str(e), 401)
        except PosttrainError as e:
            return _error(str(e))
    return handler


async def _json(request: Request, model_cls):
    return wire.parse_json(model_cls, await request.body())


def _future(rid: str, **extra) -> JSONResponse:
    return JSONResponse({"request_id": rid, **extra})


# ---- session bookkeeping ---------------------------------------------------------------------------------------------
async def client_config(state, owner, request):
    return JSONResponse(CLIENT_CONFIG)


async def create_session(state, owner, request):
    sid = uuid.uuid4().hex[:16]
    state.sessions[sid] = Session(owner, time.monotonic())
    return JSONResponse({"type": "create_session", "session_id": sid})


async def heartbeat(state, owner, request):
    body = await request.json()
    s = state.sessions.get(body.get("session_id"))
    if s is None or s.owner != owner:
        return _error(f"session_id {body.get('session_id')!r}: no such live session", 410)
    s.last_beat = time.monotonic()
    return JSONResponse({"type": "session_heartbeat"})


async def finish(state, owner, request):
    sid = request.path_params["session_id"]
    s = state.sessions.get(sid)
    if s is not None and s.owner == owner:
        await state.end_session(sid)
    return JSONResponse({})


async def telemetry(state, owner, request):
    return JSONResponse({"status": "accepted"})


async def healthz(request: Request):
    state: ServiceState = request.app.state.service
    return JSONResponse({"status": "ok", "executed": state.executed, "sessions": len(state.sessions)})


# ---- training models -------------------------------------------------------------------------------------------------
async def create_model(state, owner, request):
    from tinker import types

    req = await _json(request, types.CreateModelRequest)
    session = state.session(req.session_id, owner)
    if req.optimizer_config.type != "adamw":
        raise PosttrainError(f"CreateModelRequest.optimizer_config.type={req.optimizer_config.type!r}: only adamw "
                             "is served")
    if req.lora_config is None:
        raise PosttrainError("CreateModelRequest.lora_config: missing; this service trains LoRA adapters only")
    model_id = f"{req.session_id}:train:{req.model_seq_id}"
    lora = req.lora_config.model_dump()

    def run():
        state.backend.add_model(model_id, owner, req.session_id, req.base_model, lora)
        session.models.add(model_id)
        return Outcome({"model_id": model_id, "type": "create_model"})
    state.submit(f"{model_id}#create", owner, "create_model", run)
    return _future(f"{model_id}#create", model_id=model_id)


async def get_info(state, owner, request):
    from tinker import types

    req = await _json(request, types.GetInfoRequest)
    m = state.backend.model(req.model_id, owner)
    return JSONResponse({"type": "get_info", "model_id": m.model_id, "is_lora": True, "lora_rank": m.lora["rank"],
                         "model_name": m.base.path,
                         "model_data": {"model_name": m.base.path, "tokenizer_id": m.base.path,
                                        "arch": type(m.base.model.get_base_model()).__name__}})


async def forward_backward(state, owner, request):
    fb = wire.decode_forward_backward(await request.body())
    state.backend.model(fb.model_id, owner)
    kind = "forward" if fb.forward_only else "forward_backward"
    rid = state.submit_ordered(fb.model_id, fb.seq_id, owner, kind, lambda: Outcome(
        state.backend.forward_backward(fb, owner), wire.PROTO))
    return _future(rid, model_id=fb.model_id)


async def optim_step(state, owner, request):
    from tinker import types

    req = await _json(request, types.OptimStepRequest)
    state.backend.model(req.model_id, owner)
    if not isinstance(req.optim_params, types.AdamParams):
        raise PosttrainError(f"OptimStepRequest.optimizer_params.type={req.optim_params.type!r}: only Adam params "
                             "are served")
    rid = state.submit_ordered(req.model_id, req.seq_id or 0, owner, "optim_step", lambda: Outcome(
        state.backend.optim_step(req.model_id, owner, req.optim_params)))
    return _future(rid, model_id=req.model_id)


# ---- weights -----------------------------------------------------------------------------------------------------------
async def save_weights(state, owner, request):
    from tinker import types

    req = await _json(request, types.SaveWeightsRequest)
    m = state.backend.model(req.model_id, owner)
    name = checkpoints.check_name(req.path or f"step-{m.steps}", "SaveWeightsRequest.path")

    def run():
        path = checkpoints.save(state.state_dir, state.backend, m, "weights", name, with_optimizer=True)
        return Outcome({"path": path, "type": "save_weights"})
    rid = state.submit_ordered(req.model_id, req.seq_id or 0, owner, "save_weights", run)
    return _future(rid, model_id=req.model_id)


async def save_weights_for_sampler(state, owner, request):
    from tinker import types

    req = await _json(request, types.SaveWeightsForSamplerRequest)
    m = state.backend.model(req.model_id, owner)
    if req.path is not None:
        name = checkpoints.check_name(req.path, "SaveWeightsForSamplerRequest.path")

        def run():
            path = checkpoints.save(state.state_dir, state.backend, m, "sampler_weights", name, with_optimizer=False)
            return Outcome({"path": path, "type": "save_weights_for_sampler"})
    else:
        if req.sampling_session_seq_id is None:
            raise PosttrainError("SaveWeightsForSamplerRequest: give path (named) or sampling_session_seq_id")
        sampler_id = f"{m.session_id}:sample:{req.sampling_session_seq_id}"
        session = state.session(m.session_id, owner)

        def run():
            state.backend.sampler_of_model(sampler_id, m, req.kind)
            session.samplers.add(sampler_id)
            return Outcome({"path": None, "sampling_session_id": sampler_id, "type": "save_weights_for_sampler"})
    rid = state.submit_ordered(req.model_id, req.seq_id or 0, owner, "save_weights_for_sampler", run)
    return _future(rid, model_id=req.model_id)


def _load_run(state, owner, req, model_id, session, existing):
    """The load_weights job: into the existing model, or a new one made from the checkpoint's record."""
    def run():
        record, ckpt = checkpoints.read(state.state_dir, req.path, owner, "LoadWeightsRequest.path")
        m = existing
        if m is None:
            m = state.backend.add_model(model_id, owner, req.session_id, req.base_model or record["base_model"],
                                        record["lora"])
            session.models.add(model_id)
        elif m.base.name != record["base_model"] or m.lora["rank"] != record["lora"]["rank"]:
            raise PosttrainError(f"LoadWeightsRequest.path={req.path!r}: a {record['base_model']} rank "
                                 f"{record['lora']['rank']} checkpoint; this model is {m.base.name} rank "
                                 f"{m.lora['rank']}")
        checkpoints.load_into(state.backend, m, ckpt, req.optimizer)
        m.steps = int(record.get("steps", 0))
        return Outcome({"path": req.path, "model_id": model_id, "type": "load_weights"})
    return run


async def load_weights(state, owner, request):
    from tinker import types

    req = await _json(request, types.LoadWeightsRequest)
    checkpoints.parse_path(req.path, "LoadWeightsRequest.path")
    if req.model_id is not None:
        m = state.backend.model(req.model_id, owner)
        rid = state.submit_ordered(req.model_id, req.seq_id or 0, owner, "load_weights",
                                   _load_run(state, owner, req, req.model_id, None, m))
        return _future(rid, model_id=req.model_id)
    if req.session_id is None or req.model_seq_id is None:
        raise PosttrainError("LoadWeightsRequest: give model_id and seq_id, or session_id and model_seq_id")
    session = state.session(req.session_id, owner)
    model_id = f"{req.session_id}:train:{req.model_seq_id}"
    state.submit(f"{model_id}#load", owner, "load_weights", _load_run(state, owner, req, model_id, session, None))
    return _future(f"{model_id}#load", model_id=model_id)


# ---- sampling ----------------------------------------------------------------------------------------------------------
async def create_sampling_session(state, owner, request):
    from tinker import types

    req = await _json(request, types.CreateSamplingSessionRequest)
    session = state.session(req.session_id, owner)
    sampler_id = f"{req.session_id}:sample:{req.sampling_session_seq_id}"
    if req.model_path is not None:
        record, ckpt = checkpoints.read(state.state_dir, req.model_path, owner, "CreateSamplingSessionRequest.model_path")

        def make():
            from safetensors.torch import load_file

            m = state.backend.models.get(record["model_id"])
            if m is None or m.owner != owner:
                raise PosttrainError(f"CreateSamplingSessionRequest.model_path={req.model_path!r}: its training "
                                     "model is not live (this first cut samples saved weights only while their "
                                     "model is loaded)")
            return state.backend.add_sampler(Sampler(sampler_id, owner, req.session_id, m.base, req.model_path,
                                                     m.model_id, load_file(str(ckpt / "adapter.safetensors"))))
    elif req.base_model is not None:
        def make():
            base = state.backend.base(req.base_model)
            return state.backend.add_sampler(Sampler(sampler_id, owner, req.session_id, base))
    else:
        raise PosttrainError("CreateSamplingSessionRequest: give base_model or model_path")
    await state.call(make)
    session.samplers.add(sampler_id)
    return JSONResponse({"type": "create_sampling_session", "sampling_session_id": sampler_id})


async def get_sampler(state, owner, request):
    s = state.backend.sampler(request.path_params["sampler_id"], owner)
    return JSONResponse({"sampler_id": s.sampler_id, "base_model": s.base.name, "model_path": s.model_path})


def _spec(params, tokenizer) -> SampleSpec:
    stop = params.stop
    tokens: tuple[int, ...] = ()
    strings: tuple[str, ...] = ()
    if stop is None:
        eos = tokenizer.eos_token_id
        tokens = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
    elif isinstance(stop, str):
        strings = (stop,)
    elif all(isinstance(x, int) for x in stop):
        tokens = tuple(int(x) for x in stop)
    else:
        strings = tuple(str(x) for x in stop)
    max_tokens = DEFAULT_MAX_TOKENS if params.max_tokens is None else int(params.max_tokens)
    if max_tokens < 0:
        raise PosttrainError(f"SampleRequest.sampling_params.max_tokens={max_tokens}: must be >= 0")
    return SampleSpec(max_tokens, float(params.temperature), int(params.top_k), float(params.top_p), params.seed,
                      tokens, strings)


async def asample(state, owner, request):
    from tinker import types

    req = await _json(request, types.SampleRequest)
    if req.sampling_session_id is None:
        raise PosttrainError("SampleRequest.sampling_session_id: missing; make a sampling client first")
    s = state.backend.sampler(req.sampling_session_id, owner)
    if not 1 <= req.num_samples <= 256:
        raise PosttrainError(f"SampleRequest.num_samples={req.num_samples}: must be 1..256")
    prompt = wire.model_input_tokens(req.prompt, "SampleRequest.prompt")
    spec = _spec(req.sampling_params, s.base.tokenizer)
    rid = f"{req.sampling_session_id}#{req.seq_id if req.seq_id is not None else uuid.uuid4().hex}"
    state.submit(rid, owner, "asample", lambda: Outcome(
        state.backend.sample(s, prompt, spec, req.num_samples, bool(req.prompt_logprobs)), wire.PROTO))
    return _future(rid, sample_sequence_ids=[f"{rid}/{j}" for j in range(req.num_samples)])


async def retrieve_future(state, owner, request):
    from tinker import types

    req = await _json(request, types.FutureRetrieveRequest)
    if state.futures.owner_of(req.request_id) != owner:
        return _error(f"request_id {req.request_id!r}: no such future (expired, or the service restarted)", 410)
    outcome = await state.futures.wait(req.request_id)
    if outcome is None:
        return JSONResponse({**TRY_AGAIN, "request_id": req.request_id})
    if isinstance(outcome.body, bytes):
        return Response(outcome.body, media_type=wire.PROTO)
    return JSONResponse(outcome.body, status_code=outcome.status)


ROUTES = [
    ("client/config", client_config), ("create_session", create_session), ("session_heartbeat", heartbeat),
    ("sessions/{session_id}/finish", finish), ("telemetry", telemetry), ("create_model", create_model),
    ("get_info", get_info), ("forward_backward", forward_backward), ("optim_step", optim_step),
    ("save_weights", save_weights), ("save_weights_for_sampler", save_weights_for_sampler),
    ("load_weights", load_weights), ("create_sampling_session", create_sampling_session), ("asample", asample),
    ("retrieve_future", retrieve_future),
]


def make_app(state: ServiceState) -> Starlette:
    import contextlib

    @contextlib.asynccontextmanager
    async def lifespan(app):
        state.start(asyncio.get_running_loop())
        task = asyncio.create_task(state.housekeeping())
        yield
        task.cancel()
        state.executor.shutdown(wait=False, cancel_futures=True)

    routes = [Route(f"/api/v1/{path}", endpoint(fn), methods=["POST"]) for path, fn in ROUTES]
    routes += [Route("/api/v1/samplers/{sampler_id}", endpoint(get_sampler), methods=["GET"]),
               Route("/api/v1/healthz", healthz, methods=["GET"])]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.service = state
    return app
