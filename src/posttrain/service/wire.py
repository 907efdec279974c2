"""The wire of the Tinker-compatible service: requests and answers in the `tinker` SDK's own types.

JSON requests are validated with the SDK's pydantic request classes (a bad body is a PosttrainError naming the
field); `forward_backward` arrives as the SDK's protobuf `ForwardBackwardRequest`, and its answer and `asample`'s go
back as the protobuf `ForwardBackwardOutput` / `SampleResponse` (the SDK asks with Accept: application/x-protobuf).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from posttrain.errors import PosttrainError

PROTO = "application/x-protobuf"


@dataclass
class DatumIn:
    """One datum of a forward_backward: its input tokens [T] and loss_fn_inputs (dense arrays, shape [T])."""

    tokens: np.ndarray
    inputs: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class ForwardBackwardIn:
    model_id: str
    seq_id: int
    loss_fn: str
    config: dict[str, float]
    forward_only: bool
    data: list[DatumIn]


def parse_json(model_cls, body: bytes):
    """`body` as the SDK's pydantic `model_cls`; PosttrainError naming the first bad field."""
    from pydantic import ValidationError

    try:
        raw = json.loads(body or b"{}")
    except ValueError as e:
        raise PosttrainError(f"request body is not JSON: {e}") from None
    try:
        return model_cls.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(body)"
        raise PosttrainError(f"{model_cls.__name__}.{where}: {err['msg']}") from None


def model_input_tokens(model_input, where: str) -> list[int]:
    """The token ids of a ModelInput (SDK type); only encoded text chunks are served."""
    tokens: list[int] = []
    for i, chunk in enumerate(model_input.chunks):
        if not hasattr(chunk, "tokens"):
            raise PosttrainError(f"{where}.chunks[{i}]: a {type(chunk).__name__} chunk; this service takes text "
                                 "tokens only (EncodedTextChunk)")
        tokens.extend(int(t) for t in chunk.tokens)
    return tokens


def _tensor(msg, where: str) -> np.ndarray:
    from tinker.proto import tinker_public_pb2 as pb

    dtypes = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64, pb.DTYPE_INT32: np.int32}
    if msg.dtype not in dtypes:
        raise PosttrainError(f"{where}.dtype: {msg.dtype} is not float32, int64 or int32")
    dtype = dtypes[msg.dtype]
    if msg.HasField("sparse_csr"):
        shape = list(msg.shape)
        values = np.frombuffer(msg.sparse_csr.values, dtype=dtype)
        crow = np.frombuffer(msg.sparse_csr.crow_indices, dtype=np.int64)
        col = np.frombuffer(msg.sparse_csr.col_indices, dtype=np.int64)
        rows = len(crow) - 1
        dense = np.zeros((rows, shape[-1] if len(shape) > 1 else int(col.max(initial=-1)) + 1), dtype=dtype)
        for r in range(rows):
            dense[r, col[crow[r]:crow[r + 1]]] = values[crow[r]:crow[r + 1]]
        return dense.reshape(shape) if shape else dense
    arr = np.frombuffer(msg.dense, dtype=dtype).copy()
    return arr.reshape(list(msg.shape)) if len(msg.shape) else arr


def decode_forward_backward(body: bytes) -> ForwardBackwardIn:
    """The protobuf ForwardBackwardRequest as plain arrays; PosttrainError naming what is malformed."""
    from google.protobuf.message import DecodeError
    from tinker.proto import tinker_public_pb2 as pb

    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except DecodeError as e:
        raise PosttrainError(f"forward_backward: the body is not a ForwardBackwardRequest protobuf ({e})") from None
    config = {k: float(v) for k, v in msg.loss_fn_config.items()}
    for k, v in msg.loss_fn_config_v2.items():
        if v.WhichOneof("value") == "text":
            raise PosttrainError(f"forward_backward.loss_fn_config.{k}: a text value; the served losses take numbers")
        config[k] = float(v.number)
    data = []
    for i, d in enumerate(msg.data):
        tokens: list[int] = []
        for j, chunk in enumerate(d.model_input):
            if chunk.WhichOneof("chunk") != "encoded_text":
                raise PosttrainError(f"forward_backward.data[{i}].model_input[{j}]: only text token chunks are "
                                     "served (encoded_text)")
            tokens.extend(np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32).tolist())
        inputs = {name: _tensor(t, f"forward_backward.data[{i}].loss_fn_inputs.{name}")
                  for name, t in d.loss_fn_inputs.items()}
        data.append(DatumIn(np.asarray(tokens, dtype=np.int64), inputs))
    return ForwardBackwardIn(msg.model_id, int(msg.seq_id), msg.loss_fn, config, bool(msg.forward_only), data)


def _batched(arrays: list[np.ndarray]):
    from tinker.proto import tinker_public_pb2 as pb

    is_int = arrays and np.issubdtype(arrays[0].dtype, np.integer)
    np_dtype = np.int64 if is_int else np.float32
    parts = [np.ascontiguousarray(a, dtype=np_dtype).reshape(-1) for a in arrays]
    offsets = np.cumsum([0] + [p.nbytes for p in parts]).astype(np.int64)
    return pb.BatchedTensor(data=b"".join(p.tobytes() for p in parts), offsets=offsets.tobytes(),
                            dtype=pb.DTYPE_INT64 if is_int else pb.DTYPE_FLOAT32)


def encode_forward_backward_output(outputs: list[dict[str, np.ndarray]], metrics: dict[str, float]) -> bytes:
    """`outputs`: per datum, name -> 1-D array (logprobs, elementwise_loss)."""
    from tinker.proto import tinker_public_pb2 as pb

    msg = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", metrics=metrics)
    if outputs:
        record = msg.loss_fn_outputs.add(type_tag="ArrayRecord", num_datums=len(outputs))
        for name in outputs[0]:
            record.fields[name].CopyFrom(_batched([o[name] for o in outputs]))
    return msg.SerializeToString()


@dataclass
class SequenceOut:
    tokens: list[int]
    logprobs: list[float]
    stop_reason: str  # "stop" | "length"


def encode_sample_response(sequences: list[SequenceOut], prompt_logprobs: list[float] | None) -> bytes:
    """The protobuf SampleResponse; prompt_logprobs has NaN where nothing is scored (position 0)."""
    from tinker.proto import tinker_public_pb2 as pb

    msg = pb.SampleResponse()
    for s in sequences:
        seq = msg.sequences.add()
        seq.stop_reason = pb.STOP_REASON_STOP if s.stop_reason == "stop" else pb.STOP_REASON_LENGTH
        seq.tokens = np.asarray(s.tokens, dtype=np.int32).tobytes()
        seq.logprobs = np.asarray(s.logprobs, dtype=np.float32).tobytes()
    if prompt_logprobs is not None:
        msg.prompt_logprobs = np.asarray(prompt_logprobs, dtype=np.float32).tobytes()
    return msg.SerializeToString()
