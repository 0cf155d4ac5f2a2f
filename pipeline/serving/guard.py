"""What every HTTP request passes before a route sees it (an ASGI middleware on the app
http_api.routes builds): the API key, and a bounded body read in bounded time.

  - API key: with one set (`pipeline serve --api-key` or PIPELINE_API_KEY), every route but
    the liveness probes (/health, /v2/health/live, /v2/health/ready: a load balancer or a
    Kubernetes probe carries no key) needs `Authorization: Bearer <key>`, else 401.
    /metrics needs it too: Prometheus sends one (`authorization: {credentials: ...}`).
  - Body size: a Content-Length above the limit is refused (413) before one byte of the body
    is read; a body sent without one (chunked) is counted as it arrives and refused as soon
    as it passes the limit. The limit follows what the served model can take (body_limit).
  - Body time: a body that has not arrived within BODY_TIMEOUT_S gets 408 (a client
    trickling a body would hold a place in the replica's queue of ongoing requests).

Each refusal is in the route's error shape (errors.py). The body, once read, is handed to
the route whole (every route reads its body whole anyway).
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Callable

from pipeline.serving import errors

OPEN_PATHS = frozenset({"/health", "/v2/health/live", "/v2/health/ready"})
BODY_TIMEOUT_S = 30.0
MIN_BODY_BYTES = 1 << 20       # 1 MiB: any model's request fits below it, the metadata too
JSON_BYTES_PER_NUMBER = 32     # the longest float JSON writes (-1.2345678901234567e-308) and ", "
JSON_BYTES_PER_TOKEN = 64      # a token's text in a prompt, JSON-escaped (\uXXXX is 6 bytes a char)


def body_limit(replica) -> int:
    """The largest body a request to this replica needs: a tensor model's largest request
    (KServe's max_batch_size samples of each input at its max shape, as JSON numbers); a
    generation model's full context as prompt text. Never below MIN_BODY_BYTES."""
    if replica.engine.generation:
        from pipeline.generation.decoder import context_length

        return max(MIN_BODY_BYTES, context_length(replica.recipe) * JSON_BYTES_PER_TOKEN)
    sig = replica.signature
    numbers = 0
    for spec in sig.inputs:
        dims = spec.dims("max")
        per_sample = 1
        for d in dims[1:] if sig.batched else dims:
            per_sample *= d
        numbers += per_sample
    return max(MIN_BODY_BYTES, sig.max_batch_size * numbers * JSON_BYTES_PER_NUMBER)


class _TooLarge(Exception):
    pass


class _Gone(Exception):
    """The client disconnected before its body arrived: nothing to answer."""


class Receiving:
    """Requests whose bodies are being read now (GET .../stats shows it as `receiving`)."""

    def __init__(self):
        self.count = 0


class RequestGuard:
    """The ASGI middleware: `api_key` (None: no key asked), `limit()` the body limit in bytes
    (read when the first request comes, once the replica has loaded), `receiving` counted."""

    def __init__(self, app, api_key: str | None, limit: Callable[[], int], receiving: Receiving):
        self.app, self.api_key, self._limit_of = app, api_key, limit
        self._limit: int | None = None
        self.receiving = receiving

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        headers = dict(scope.get("headers") or [])
        if self.api_key and path not in OPEN_PATHS and not self._authorized(headers):
            return await _refuse(send, path, 401, "a valid API key is needed: send the header "
                                 "`Authorization: Bearer <key>` (the key `pipeline serve` was "
                                 "given by --api-key or PIPELINE_API_KEY)")
        if self._limit is None:
            self._limit = self._limit_of()
        declared = headers.get(b"content-length")
        if declared is not None:
            if not declared.isdigit():
                return await _refuse(send, path, 400, "Content-Length is not a number")
            if int(declared) > self._limit:
                return await _refuse(send, path, 413, _too_large(int(declared), self._limit))
        self.receiving.count += 1
        try:
            body = await asyncio.wait_for(_read(receive, self._limit), BODY_TIMEOUT_S)
        except _TooLarge:
            return await _refuse(send, path, 413, _too_large(None, self._limit))
        except TimeoutError:
            return await _refuse(send, path, 408, f"the request body did not arrive within "
                                 f"{BODY_TIMEOUT_S:g} s")
        except _Gone:
            return None
        finally:
            self.receiving.count -= 1
        return await self.app(scope, _replay(body, receive), send)

    def _authorized(self, headers: dict[bytes, bytes]) -> bool:
        scheme, _, key = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        # compare_digest: the time taken does not tell how much of a guess was right
        return scheme.lower() == "bearer" and hmac.compare_digest(key.strip().encode(),
                                                                  self.api_key.encode())


def _too_large(size: int | None, limit: int) -> str:
    got = f" of {size:,} bytes" if size is not None else ""
    return f"the request body{got} is larger than this model takes ({limit:,} bytes at most)"


async def _read(receive, limit: int) -> bytes:
    parts, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Gone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)


def _replay(body: bytes, receive):
    """A receive() that hands the body read already, then waits on the client (a streaming
    answer listens for its disconnect)."""
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _refuse(send, path: str, status: int, message: str) -> None:
    data, headers = errors.encoded(path, status, message)
    if status in (408, 413):  # the rest of the body is never read: the connection cannot go on
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})
