"""The error shapes of the HTTP API, chosen by the route a request names, so that every
failure -- a bad body, a missing key, an unknown route, an engine that failed, an exception
nobody expected -- is answered in the shape its client reads:

    OpenAI routes (/v1/chat/completions, /v1/completions, /v1/models[/<id>]):
        {"error": {"message", "type", "param", "code"}}  (openai_protocol.ApiError)
    everything else (/v1/models/<recipe>/infer|generate|..., KServe's /v2, /health, /metrics):
        {"error": "<one line>"}

A 503 carries Retry-After; a 401 carries WWW-Authenticate: Bearer.
"""

from __future__ import annotations

import json

from pipeline.core.json_object import JsonObject
from pipeline.serving.openai_protocol import ApiError

RETRY_AFTER_S = 1  # a 503's Retry-After: a batch or a decode step frees a place within ~1 s
OPENAI_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/models")
# OpenAI's error `type` and `code` per status (its own servers answer a bad key with these)
OPENAI_KINDS = {401: ("invalid_request_error", "invalid_api_key"),
                404: ("invalid_request_error", None),
                413: ("invalid_request_error", "request_too_large"),
                503: ("server_error", "queue_full")}


def is_openai(path: str) -> bool:
    """The OpenAI API's routes: its POSTs and /v1/models[/<id>] (not /v1/models/<id>/infer)."""
    path = path.rstrip("/") or "/"
    return path in OPENAI_PATHS or (path.startswith("/v1/models/") and path.count("/") == 3)


def headers_for(status: int) -> dict[str, str]:
    if status == 503:
        return {"Retry-After": str(RETRY_AFTER_S)}
    if status == 401:
        return {"WWW-Authenticate": "Bearer"}
    return {}


def body(path: str, status: int, message: str) -> JsonObject:
    """The error body for `path`: OpenAI's object or the plain one-line error."""
    if not is_openai(path):
        return {"error": message}
    kind, code = OPENAI_KINDS.get(status, ("server_error" if status >= 500 else "invalid_request_error",
                                           None))
    return ApiError(status, message, kind, code=code).body()


def encoded(path: str, status: int, message: str) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """The body as bytes and the raw ASGI headers (for middleware that answers by itself)."""
    data = json.dumps(body(path, status, message)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in headers_for(status).items()]
    return data, headers


def response(path: str, status: int, message: str):
    """A FastAPI JSONResponse of the error for `path`."""
    from fastapi.responses import JSONResponse

    return JSONResponse(body(path, status, message), status_code=status, headers=headers_for(status))


def one_line(e: BaseException) -> str:
    """`Type: first line of the message`, at most 500 characters (no tracebacks to clients)."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:500]


def install_handlers(app) -> None:
    """Errors FastAPI and Starlette answer by themselves (an unknown route, a wrong method, an
    exception a route let through) in the route's error shape instead of {"detail": ...} or a
    text/plain 500."""
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException

    async def http_error(request, exc: HTTPException):
        return response(request.url.path, exc.status_code, str(exc.detail))

    async def invalid(request, exc: RequestValidationError):
        return response(request.url.path, 400, f"the request is not valid: {exc.errors()[:1]}")

    async def unexpected(request, exc: Exception):
        return response(request.url.path, 500, f"the server failed: {one_line(exc)}")

    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(Exception, unexpected)
