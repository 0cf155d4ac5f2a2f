"""Triton's KServe v2 HTTP protocol for tensor models (docs/serving.md), over a Replica:

    GET  /v2                                  server metadata (name, version, extensions)
    GET  /v2/health/live, /v2/health/ready    200 once the replica has loaded its engine
    GET  /v2/models/<name>[/versions/1]       model metadata: inputs and outputs, KServe
                                              datatypes (INT64, FP32, ...), -1 for variable dims
    GET  /v2/models/<name>[/versions/1]/ready 200 {"name", "ready": true}
    POST /v2/models/<name>[/versions/1]/infer {"id", "inputs": [{name, shape, datatype, data}],
                                              "outputs": [{name, parameters}], "parameters"}

with the binary tensor data extension: a body of a JSON header (its length in the
Inference-Header-Content-Length header) followed by raw little-endian tensors, each input's
length in its `binary_data_size` parameter; outputs come back binary where the request asks
(`binary_data` per output, `binary_data_output` for all), else as flat JSON `data`.

Batching is the replica's, with Triton's rules: a request of batch N (the leading dim of a
batched model) is N samples of batch 1 submitted together to the replica's batcher, which
batches them with whatever else is queued; the answers are stacked back in order. N above
the model's max_batch_size is refused (400), as Triton refuses it; N above the free places of
the bounded queue gets 503 with Retry-After, nothing queued. Errors are KServe's
`{"error": "<one line>"}`: 400 for a bad request, 404 for another model or version.
"""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations (Request).
import asyncio
import functools
import json
import math
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline.core.deps import version as installed_version
from pipeline.core.json_object import JsonObject
from pipeline.serving import errors, guard
from pipeline.serving.batcher import QueueFull
from pipeline.serving.collate import BadRequest
from pipeline.serving.replica import EngineFailed

VERSION = "1"  # the model version `pipeline deploy --triton` writes; the only one served
HEADER_LENGTH = "Inference-Header-Content-Length"
RETRY_AFTER_S = "1"
# recipe dtype -> KServe datatype
DATATYPES = {"float32": "FP32", "float16": "FP16", "int64": "INT64", "int32": "INT32", "bool": "BOOL"}
# KServe datatype -> numpy type (binary tensors are little-endian, row-major)
NUMPY = {"BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32,
         "UINT64": np.uint64, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32,
         "INT64": np.int64, "FP16": np.float16, "FP32": np.float32, "FP64": np.float64}
KSERVE = {np.dtype(t): name for name, t in NUMPY.items()}
PLATFORMS = {"onnxruntime": "onnxruntime_onnx", "tensorrt": "tensorrt_plan", "pytorch": "pytorch",
             "aotinductor": "pytorch"}


class V2Error(Exception):
    """An answer other than 200: the HTTP status and KServe's one-line error."""

    def __init__(self, status: int, message: str, rejected: int = 0):
        super().__init__(message)
        self.status = status
        self.rejected = rejected  # samples refused for a full queue (counted as failures)


def kserve_datatype(dtype) -> str:
    try:
        return KSERVE[np.dtype(dtype)]
    except KeyError:
        raise V2Error(500, f"the engine answered dtype {np.dtype(dtype)}, which KServe v2 does not name") from None


# ----------------------------------------------------------------------------- metadata
def server_metadata() -> JsonObject:
    return {"name": "pipeline", "version": installed_version("pipeline") or "unknown",
            "extensions": ["binary_tensor_data"]}


def model_metadata(replica) -> JsonObject:
    """Inputs from the recipe, outputs from the ONNX graph the engine was built from."""
    sig = replica.signature
    inputs = [{"name": s.name, "datatype": DATATYPES[s.dtype], "shape": _input_shape(s.shape, sig.batched)}
              for s in sig.inputs]
    graph = replica.choice.graph
    # no graph (--engine pytorch): the baseline runs in float32; the outputs' rank is unknown
    outputs = (list(_graph_outputs(str(graph), sig.batched)) if graph is not None else
               [{"name": n, "datatype": "FP32", "shape": [-1]} for n in sig.outputs])
    return {"name": replica.recipe.name, "versions": [VERSION],
            "platform": PLATFORMS.get(replica.choice.kind, replica.choice.kind),
            "inputs": inputs, "outputs": outputs}


def _input_shape(shape: list, batched: bool) -> list[int]:
    dims = [d if isinstance(d, int) else (d.min if d.min == d.max else -1) for d in shape]
    if batched:
        dims[0] = -1  # a request may carry up to max_batch_size samples
    return dims


@functools.lru_cache(maxsize=4)
def _graph_outputs(graph: str, batched: bool) -> tuple[dict, ...]:
    """The graph's outputs as KServe metadata (read once: a graph can hold the weights)."""
    import onnx

    from pipeline.core import safe_files

    model = onnx.load_from_string(safe_files.read_bytes(Path(graph)))
    outputs = []
    for o in model.graph.output:
        tensor = o.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim]
        if batched and dims:
            dims[0] = -1
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        outputs.append({"name": o.name, "datatype": KSERVE.get(np.dtype(dtype), str(dtype)), "shape": dims})
    return tuple(outputs)


# ----------------------------------------------------------------------------- requests
@dataclass
class InferRequest:
    """A parsed v2 request: its arrays (each input's exact dtype), which outputs to answer
    (None: all) and which of them binary."""

    id: str | None
    arrays: dict[str, np.ndarray]
    outputs: list[str] | None
    binary: dict[str, bool] = field(default_factory=dict)
    binary_default: bool = False


def parse(body: bytes, header_length: str | None, encoding: str | None, sig,
          limit: int | None = None) -> InferRequest:
    """The request body (JSON, or a JSON header + binary tensors) -> InferRequest; V2Error 400
    (413 when a compressed body inflates past `limit` bytes)."""
    if encoding in ("gzip", "deflate"):
        body = _inflate(body, encoding, limit)
    elif encoding not in (None, "identity"):
        raise V2Error(400, f"Content-Encoding `{encoding}` is not supported (gzip, deflate)")
    size = len(body)
    if header_length is not None:
        if not header_length.isdigit() or int(header_length) > len(body):
            raise V2Error(400, f"{HEADER_LENGTH} {header_length!r} is not a length within the "
                               f"body's {len(body)} bytes")
        size = int(header_length)
    try:
        request = json.loads(body[:size] or b"null")
    except RecursionError:  # [[[[... nested past Python's recursion limit
        raise V2Error(400, "the inference header nests arrays or objects too deeply") from None
    except ValueError as e:
        raise V2Error(400, f"the inference header is not JSON ({e})") from None
    if not isinstance(request, dict) or not isinstance(request.get("inputs"), list):
        raise V2Error(400, 'the request needs "inputs": [{"name", "shape", "datatype", "data"}]')
    arrays = _inputs(request["inputs"], memoryview(body)[size:], sig)
    parameters = _parameters(request, "the request")
    parsed = InferRequest(request.get("id"), arrays, None,
                          binary_default=bool(parameters.get("binary_data_output", False)))
    if request.get("outputs") is not None:
        _requested_outputs(request["outputs"], sig, parsed)
    return parsed


def _parameters(entry: JsonObject, what: str) -> JsonObject:  # a KServe "parameters" object
    parameters = entry.get("parameters")
    if parameters is None:
        return {}
    if not isinstance(parameters, dict):
        raise V2Error(400, f"{what}: \"parameters\" must be an object")
    return parameters


def _inflate(body: bytes, encoding: str, limit: int | None) -> bytes:
    """A gzip or deflate body, inflated no further than `limit` bytes (a small bomb can
    inflate to gigabytes)."""
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    inflater = zlib.decompressobj(wbits)
    try:
        data = inflater.decompress(body, limit + 1 if limit else 0)
    except zlib.error as e:
        raise V2Error(400, f"the body is not {encoding}-compressed ({e})") from None
    if limit and len(data) > limit:
        raise V2Error(413, f"the {encoding} body inflates past {limit:,} bytes, more than this "
                           "model takes")
    if not inflater.eof:
        raise V2Error(400, f"the body is not {encoding}-compressed (it ends early)")
    return data


def _inputs(entries: list, binary: memoryview, sig) -> dict[str, np.ndarray]:
    types = {s.name: DATATYPES[s.dtype] for s in sig.inputs}
    arrays, offset = {}, 0
    for entry in entries:
        name = entry.get("name") if isinstance(entry, dict) else None
        if name not in types:
            raise V2Error(400, f"unknown input {name!r}: the model takes {list(types)}")
        if name in arrays:
            raise V2Error(400, f"input `{name}` is given twice")
        datatype, shape = entry.get("datatype"), entry.get("shape")
        if datatype != types[name]:
            raise V2Error(400, f"input `{name}` has datatype {datatype}; the model takes {types[name]}")
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool)
                                                  and d >= 0 for d in shape):
            raise V2Error(400, f"input `{name}` needs a shape: a list of sizes >= 0")
        dtype = np.dtype(NUMPY[datatype])
        size = _parameters(entry, f"input `{name}`").get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or size < 0 or offset + size > len(binary):
                raise V2Error(400, f"input `{name}`: binary_data_size {size!r} runs past the "
                                   f"{len(binary)} bytes of binary data")
            arrays[name] = _from_bytes(name, binary[offset:offset + size], dtype, shape)
            offset += size
        elif "data" in entry:
            arrays[name] = _from_json(name, entry["data"], dtype, shape)
        else:
            raise V2Error(400, f"input `{name}` has neither data nor binary_data_size")
    if offset != len(binary):
        raise V2Error(400, f"{len(binary) - offset} bytes of binary data belong to no input")
    return arrays


def _from_bytes(name: str, raw: memoryview, dtype: np.dtype, shape: list[int]) -> np.ndarray:
    if len(raw) != math.prod(shape) * dtype.itemsize:
        raise V2Error(400, f"input `{name}`: {len(raw)} bytes of binary data for shape {shape} "
                           f"of {dtype} ({math.prod(shape) * dtype.itemsize} bytes)")
    return np.frombuffer(raw, dtype.newbyteorder("<")).astype(dtype).reshape(shape)


def _from_json(name: str, data, dtype: np.dtype, shape: list[int]) -> np.ndarray:
    try:
        array = np.asarray(data)
    except ValueError as e:  # ragged nested lists
        raise V2Error(400, f"input `{name}`: data is not a rectangular array ({e})") from None
    if array.size != math.prod(shape):
        raise V2Error(400, f"input `{name}`: {array.size} values for shape {shape}")
    kinds = {"b": "b", "i": "biu", "u": "biu", "f": "biuf"}[dtype.kind]
    if array.size and array.dtype.kind not in kinds:
        raise V2Error(400, f"input `{name}`: data holds {array.dtype.kind!r} values; the datatype "
                           f"is {KSERVE[dtype]}")
    return array.astype(dtype).reshape(shape)  # flat (row-major) or nested, as KServe allows


def _requested_outputs(entries, sig, parsed: InferRequest) -> None:
    if not isinstance(entries, list):
        raise V2Error(400, '"outputs" must be a list of {"name", "parameters"}')
    parsed.outputs = []
    for entry in entries:
        name = entry.get("name") if isinstance(entry, dict) else None
        parameters = _parameters(entry, f"output {name!r}") if isinstance(entry, dict) else {}
        if name not in sig.outputs:
            raise V2Error(400, f"unknown output {name!r}: the model answers {sig.outputs}")
        if parameters.get("classification"):
            raise V2Error(400, f"output `{name}`: the classification extension is not supported")
        parsed.outputs.append(name)
        parsed.binary[name] = bool(parameters.get("binary_data", parsed.binary_default))


# ----------------------------------------------------------------------------- inference
def samples(sig, arrays: dict[str, np.ndarray], queued: int, max_queue_size: int) -> list[dict]:
    """A request of batch N -> N samples of batch 1 (an unbatched model: the request as one)."""
    if not sig.batched:
        return [arrays]
    sizes = {a.shape[0] if a.ndim else None for a in arrays.values()}
    if len(sizes) != 1 or None in sizes:
        raise V2Error(400, f"the inputs disagree on the batch size (dim 0): {sorted(map(str, sizes))}")
    (n,) = sizes
    if not 1 <= n <= sig.max_batch_size:
        raise V2Error(400, f"inference request batch-size must be 1..{sig.max_batch_size} (got {n})")
    if max_queue_size and n > max_queue_size - queued:
        raise V2Error(503, f"queue full ({queued} of {max_queue_size} places taken; {n} needed)", n)
    return [{name: a[i:i + 1] for name, a in arrays.items()} for i in range(n)]


async def infer(replica, request: InferRequest) -> tuple[dict[str, np.ndarray], dict]:
    """The request's samples through the replica's batcher -> (outputs stacked back, the
    timings: the longest queue and compute of its samples, the largest batch one ran in)."""
    sig = replica.signature
    parts = samples(sig, request.arrays, len(replica.batcher), replica.policy.max_queue_size)
    answers = await asyncio.gather(*(replica.infer(p) for p in parts), return_exceptions=True)
    failed = [a for a in answers if isinstance(a, BaseException)]
    if failed:
        if isinstance(failed[0], BadRequest):
            raise V2Error(400, str(failed[0]))
        if isinstance(failed[0], QueueFull):  # another request took the places meanwhile
            raise V2Error(503, "queue full", len(failed))
        if isinstance(failed[0], EngineFailed):
            raise V2Error(failed[0].status, str(failed[0]))
        raise failed[0]
    names = request.outputs or list(answers[0].outputs)
    outputs = {n: (np.concatenate([a.outputs[n] for a in answers]) if sig.batched
                   else answers[0].outputs[n]) for n in names}
    timings = {"queue_ms": max(a.queue_ms for a in answers),
               "compute_ms": max(a.compute_ms for a in answers),
               "batch_size": max(a.batch_size for a in answers)}
    return outputs, timings


def encode(model: str, request: InferRequest, outputs: dict[str, np.ndarray],
           timings: dict) -> tuple[bytes, dict[str, str]]:
    """The response body and its headers: JSON, or a JSON header + binary outputs."""
    entries, blobs = [], []
    for name, value in outputs.items():
        array = np.ascontiguousarray(value)
        entry = {"name": name, "datatype": kserve_datatype(array.dtype), "shape": list(array.shape)}
        if request.binary.get(name, request.binary_default):
            raw = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
            entry["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            entry["data"] = array.ravel().tolist()
        entries.append(entry)
    answer = {"model_name": model, "model_version": VERSION,
              **({"id": request.id} if request.id is not None else {}),
              "parameters": timings, "outputs": entries}
    header = json.dumps(answer).encode()
    if not blobs:
        return header, {"Content-Type": "application/json"}
    return header + b"".join(blobs), {"Content-Type": "application/octet-stream",
                                      HEADER_LENGTH: str(len(header))}


# ----------------------------------------------------------------------------- routes
def error(status: int, message: str):
    return errors.response("/v2", status, message)


def routes(app, get_replica, recipe_name: str) -> None:
    """Adds the /v2 routes to `app`; another model name or version gets 404."""
    from fastapi import Request
    from fastapi.responses import Response

    def _other(name: str, version: str = VERSION):
        if name != recipe_name:
            return error(404, f"no model `{name}` here (serving `{recipe_name}`)")
        if version != VERSION:
            return error(404, f"model `{name}` has no version `{version}` (versions: {VERSION})")
        return None

    @app.get("/v2")
    async def server():
        return server_metadata()

    @app.get("/v2/health/live")
    async def live():
        return {"live": True}

    @app.get("/v2/health/ready")
    async def ready():
        get_replica()  # a replica answers only once its engine is loaded
        return {"ready": True}

    @app.get("/v2/models/{name}")
    @app.get("/v2/models/{name}/versions/{version}")
    async def metadata(name: str, version: str = VERSION):
        return _other(name, version) or model_metadata(get_replica())

    @app.get("/v2/models/{name}/ready")
    @app.get("/v2/models/{name}/versions/{version}/ready")
    async def model_ready(name: str, version: str = VERSION):
        return _other(name, version) or {"name": name, "ready": True}

    @app.post("/v2/models/{name}/infer")
    @app.post("/v2/models/{name}/versions/{version}/infer")
    async def infer_route(name: str, request: Request, version: str = VERSION):
        if (wrong := _other(name, version)) is not None:
            return wrong
        replica = get_replica()
        try:
            parsed = parse(await request.body(), request.headers.get(HEADER_LENGTH),
                           request.headers.get("content-encoding"), replica.signature,
                           guard.body_limit(replica))
            outputs, timings = await infer(replica, parsed)
            body, headers = encode(name, parsed, outputs, timings)
        except V2Error as e:
            replica.metrics.tensor_failure(e.rejected)  # Triton counts a rejection as a failure
            return error(e.status, str(e))
        except Exception as e:  # the engine failed (the batch loop counted it)
            return error(500, f"the engine failed: {errors.one_line(e)}")
        media = headers.pop("Content-Type")
        return Response(body, media_type=media, headers=headers)
