"""The HTTP API of `pipeline serve` (docs/serving.md), as a FastAPI app over one Replica:

    POST /v1/models/<recipe>/infer      {"inputs": {name: nested list}} or an .npz body
                                        (Content-Type: application/x-npz) -> 200
                                        {"outputs": {name: nested list}, "queue_ms",
                                        "compute_ms", "batch_size"} (npz with Accept:
                                        application/x-npz: the outputs, timings as headers)
    POST /v1/models/<recipe>/generate   {"prompt_ids": [...], "max_new_tokens": n,
                                        "stream": true} -> NDJSON: {"token": id} per token,
                                        then {"done": true, "ttft_ms", "tokens", ...};
                                        greedy, EOS ignored: exactly n tokens
    GET  /v1/models/<recipe>/ready      200 {"ready": true} once the engine is loaded
    GET  /v1/models/<recipe>/stats      the replica's load time, memory, batch sizes, pid
    GET  /health                        200 {"status": "ok"}
    GET  /metrics                       the replica's Prometheus metrics (serving/metrics.py)
    /v2/...                             Triton's KServe v2 protocol for tensor models
                                        (serving/kserve.py)
Errors: 400 {"error": one line} for a bad request, 401 without the API key (when one is
set), 404 for another recipe, 408/413 for a body too slow or too large (guard.py), 422 when
the engine refused a request that passed the checks but ran its batch-mates, 503 {"error":
"queue full"} with Retry-After when the bounded queue is full, 500 when the engine fails.
A /generate stream that fails after its first line ends with an {"error": one line} line.
The OpenAI routes answer in OpenAI's error shape (errors.py picks the shape by route).

`routes(app, get_replica, recipe_name, api_key)` adds the routes, the request guard (API key,
body bounds) and the error handlers to a FastAPI app whose handlers reach the replica
through `get_replica()` (the Ray Serve deployment's, or a test's).
"""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations (Request)
# as objects; as strings they would not resolve inside routes() and become query parameters.
import io
import json
import os

import numpy as np

from pipeline.core.json_object import JsonObject
from pipeline.generation.sampling import InvalidSampling, SamplingParams
from pipeline.serving import errors, guard, ingress, kserve
from pipeline.serving.batcher import QueueFull
from pipeline.serving.collate import BadRequest
from pipeline.serving.replica import EngineFailed

NPZ = "application/x-npz"
RETRY_AFTER_S = errors.RETRY_AFTER_S


def _error(status: int, message: str):
    return errors.response("", status, message)  # this API's shape: {"error": one line}


def parse_npz(body: bytes, limit: int | None = None) -> dict[str, np.ndarray]:
    """The arrays of an .npz body; BadRequest when it is none, or when its members would
    unpack to more than `limit` bytes (an npz is a zip: a small body can inflate to GBs)."""
    import zipfile

    try:
        with zipfile.ZipFile(io.BytesIO(body)) as archive:
            unpacked = sum(member.file_size for member in archive.infolist())
        if limit is not None and unpacked > limit:
            raise BadRequest(f"the .npz unpacks to {unpacked:,} bytes; this model takes "
                             f"{limit:,} at most")
        with np.load(io.BytesIO(body), allow_pickle=False) as npz:
            return {name: npz[name] for name in npz.files}
    except BadRequest:
        raise
    except Exception as e:  # not an npz, or an object array (pickles are refused)
        raise BadRequest(f"the body is not a readable .npz of arrays ({errors.one_line(e)})") from None


def to_npz(arrays: dict[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def routes(app, get_replica, recipe_name: str, api_key: str | None = None) -> None:
    """Adds the routes above to `app`; requests for a recipe other than `recipe_name` get 404.
    `api_key`: every route but the liveness probes needs `Authorization: Bearer <api_key>`."""
    from fastapi import Request

    receiving = guard.Receiving()
    app.add_middleware(guard.RequestGuard, api_key=api_key,
                       limit=lambda: guard.body_limit(get_replica()), receiving=receiving)
    errors.install_handlers(app)

    def _other(name: str):
        return None if name == recipe_name else _error(404, f"no model `{name}` here (serving "
                                                                f"`{recipe_name}`)")

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        from fastapi.responses import Response

        body, content_type = get_replica().metrics.exposition()
        return Response(body, media_type=content_type)

    kserve.routes(app, get_replica, recipe_name)

    @app.get("/v1/models/{name}/ready")
    async def ready(name: str):
        return _other(name) or {"ready": True, "engine": get_replica().choice.target}

    @app.get("/v1/models/{name}/stats")
    async def stats(name: str, request: Request):
        # receiving: bodies being read here, or by the ingress in front (ingress.RECEIVING);
        # pid: the replica's process (a test or an operator signals it; the ingress is another)
        ahead = request.scope.get(ingress.RECEIVING, 0)
        return _other(name) or {**get_replica().stats(), "receiving": receiving.count + ahead,
                                "pid": os.getpid()}

    @app.post("/v1/models/{name}/infer")
    async def infer(name: str, request: Request):
        if (wrong := _other(name)) is not None:
            return wrong
        return await _infer(get_replica, request)

    @app.post("/v1/models/{name}/generate")
    async def generate(name: str, request: Request):
        if (wrong := _other(name)) is not None:
            return wrong
        return await _generate(get_replica, request)

    from pipeline.serving import openai_api  # /v1/chat/completions, /v1/completions, /v1/models
    openai_api.routes(app, get_replica, recipe_name)


async def _infer(get_replica, request):
    """One infer request: JSON or npz in, the outputs and the replica's timings out in the
    form the Accept header asks for."""
    from fastapi.responses import JSONResponse, Response

    body = await request.body()
    try:
        if request.headers.get("content-type", "").split(";")[0].strip() == NPZ:
            inputs = parse_npz(body, guard.body_limit(get_replica()))
        else:
            inputs = _json(body).get("inputs")
        answer = await get_replica().infer(inputs)
    except BadRequest as e:
        return _error(400, str(e))
    except QueueFull:
        get_replica().metrics.tensor_failure()  # Triton counts a rejection as a failure
        return _error(503, "queue full")
    except EngineFailed as e:
        return _error(e.status, str(e))
    timings = answer.timings()
    if NPZ in request.headers.get("accept", ""):
        headers = {f"x-{k.replace('_', '-')}": str(v) for k, v in timings.items()}
        return Response(to_npz(answer.outputs), media_type=NPZ, headers=headers)
    return JSONResponse({"outputs": {k: v.tolist() for k, v in answer.outputs.items()}, **timings})


async def _generate(get_replica, request):
    """One generate request: the tokens streamed as NDJSON lines, or (stream: false) all of
    them in one JSON answer."""
    from fastapi.responses import JSONResponse, StreamingResponse

    try:
        body = _json(await request.body())
        params = SamplingParams(body.get("max_new_tokens", 16), ignore_eos=True)
        tokens = get_replica().generate(body.get("prompt_ids"), params)
        first = await anext(tokens)  # a bad request or a full queue raises here, before 200
    except (BadRequest, InvalidSampling) as e:
        return _error(400, str(e))
    except QueueFull:
        return _error(503, "queue full")

    async def lines():
        yield json.dumps(first) + "\n"
        try:
            async for item in tokens:
                yield json.dumps(item) + "\n"
        except Exception as e:  # the 200 is sent: the stream ends with the error, never silently
            yield json.dumps({"error": f"the generation failed: {errors.one_line(e)}"}) + "\n"

    if body.get("stream", True):
        return StreamingResponse(lines(), media_type="application/x-ndjson")
    try:
        items = [first] + [item async for item in tokens]
    except Exception as e:
        return _error(500, f"the generation failed: {errors.one_line(e)}")
    return JSONResponse({"token_ids": [i["token"] for i in items if "token" in i], **items[-1]})


def _json(body: bytes) -> JsonObject:
    try:
        data = json.loads(body or b"null")
    except RecursionError:  # [[[[... nested past Python's recursion limit
        raise BadRequest("the body nests arrays or objects too deeply") from None
    except ValueError as e:
        raise BadRequest(f"the body is not JSON ({e})") from None
    if not isinstance(data, dict):
        raise BadRequest("the body must be a JSON object")
    return data
